"""Verify a plan: run a few real steps, measure peak memory and step time, compare them with the
memory and speed models, and store the ratios as this machine's calibration.

Steps:  1..warmup            not timed (allocator warm-up, optimizer state creation, caches)
        next `timed` steps   timed; the median is the measured step time
        last `counted` steps live tensor bytes counted (CPU: TensorBytesCounter, whose Python
                             dispatch slows ops down, so these steps are not timed) or
                             torch.cuda.max_memory_allocated / reserved (CUDA)
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainerCallback

from trainfit.config.run_config import RunConfig
from trainfit.train.calibration import DEFAULT_TIMED_STEPS, DEFAULT_WARMUP_STEPS
from trainfit.train.calibration import device_key as cal_device_key


@dataclass(frozen=True)
class VerifyReport:
    model: str
    method: str
    device: str  # calibration key: "cpu" or "cuda:<name>"
    steps: int
    measured_tensor_peak_bytes: int | None
    measured_peak_rss_bytes: int | None
    measured_cuda_reserved_bytes: int | None
    measured_step_seconds: float | None
    predicted_tensor_peak_bytes: int | None
    predicted_total_bytes: int | None
    predicted_step_seconds: float | None
    memory_ratio: float | None  # measured tensor peak / predicted tensor peak
    step_time_ratio: float | None  # measured median step / predicted step
    fingerprint: str
    calibration_file: str | None
    unavailable: dict[str, str] = field(default_factory=dict)


class _MemoryProbe(TrainerCallback):
    """Starts measuring memory at step `start` (1-based) and stops at train end."""

    def __init__(self, start_step: int, device: str) -> None:
        self.start_step = start_step
        self.device = device
        self.counter = None
        self.tensor_peak: int | None = None
        self.cuda_reserved: int | None = None

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step + 1 != self.start_step:
            return
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        from trainfit.train.tensor_counter import TensorBytesCounter

        import warnings

        self.counter = TensorBytesCounter()
        # Everything alive now: weights, reference model, gradients, optimizer state.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance() on some library objects warns
            live = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
        self.counter.track_existing(live)
        self.counter.__enter__()

    def on_train_end(self, args, state, control, **kw):
        import torch

        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.tensor_peak = self.counter.peak_bytes
            self.counter = None
        elif self.device == "cuda":
            self.tensor_peak = int(torch.cuda.max_memory_allocated())
            self.cuda_reserved = int(torch.cuda.max_memory_reserved())


def device_key(device: str) -> str:
    if device == "cuda":
        import torch

        return cal_device_key(device, torch.cuda.get_device_name(0))
    return cal_device_key(device)


def verify_run(cfg: RunConfig, *, warmup: int = DEFAULT_WARMUP_STEPS, timed: int = DEFAULT_TIMED_STEPS, counted: int = 2, save: bool = True,
               calibration_file: Path | None = None, log=None) -> VerifyReport:
    """Run warmup + timed + counted steps of `cfg` in a scratch directory and compare."""
    from trainfit.train import calibration as cal
    from trainfit.train.monitor.live import peak_rss_bytes
    from trainfit.train.environment import resolve_device
    from trainfit.train.runner import run_training

    steps = warmup + timed + counted
    probe_cfg = dataclasses.replace(
        cfg, schedule=dataclasses.replace(cfg.schedule, max_steps=steps, epochs=None),
        checkpointing=dataclasses.replace(cfg.checkpointing, every_steps=10**9),
        logging=dataclasses.replace(cfg.logging, every_steps=1, progress="lines"),
    )
    device = resolve_device(cfg)
    probe = _MemoryProbe(warmup + timed + 1, device)
    with tempfile.TemporaryDirectory(prefix="trainfit-verify-") as tmp:
        # recover=False: an OOM here is a finding about this setting, not something to shrink away
        result = run_training(probe_cfg, Path(tmp) / "run", quiet=True, log=log, extra_callbacks=[probe],
                              write_summary=False, recover=False)
    step_times = result.step_seconds[warmup:warmup + timed]
    measured_step = statistics.median(step_times) if step_times else None
    summary = result.summary
    spec_id = summary.get("model", "")
    # The prediction build_summary made for exactly the model and setup that ran.
    pred = summary["predicted"]
    unavailable = dict(pred["unavailable"])
    pred_peak, pred_total, pred_step = pred["tensor_peak_bytes"], pred["total_bytes"], pred["step_seconds"]
    mem_ratio = probe.tensor_peak / pred_peak if probe.tensor_peak and pred_peak else None
    time_ratio = measured_step / pred_step if measured_step and pred_step else None
    key = device_key(device)
    fingerprint = cal.machine_fingerprint(_profile_or_none())
    written = None
    if save and (mem_ratio or time_ratio):
        # The load during the measurement is stored with the ratios; a busy machine's step time is
        # flagged and never applied (train/calibration.py), and the report says why.
        stored, load = cal.record_verify_sample(fingerprint, key, {
            "model": spec_id, "method": cfg.method, "memory_ratio": mem_ratio, "step_time_ratio": time_ratio,
            "micro_batch": cfg.training.micro_batch, "seq_len": cfg.training.seq_len}, calibration_file)
        written = str(stored)
        if load.contended and time_ratio:
            unavailable["step_time_calibration"] = load.reason
    elif save:
        unavailable["calibration"] = "nothing to calibrate: no prediction to compare with"
    return VerifyReport(
        model=spec_id, method=cfg.method, device=key, steps=steps,
        measured_tensor_peak_bytes=probe.tensor_peak, measured_peak_rss_bytes=peak_rss_bytes(),
        measured_cuda_reserved_bytes=probe.cuda_reserved, measured_step_seconds=measured_step,
        predicted_tensor_peak_bytes=pred_peak, predicted_total_bytes=pred_total,
        predicted_step_seconds=pred_step, memory_ratio=mem_ratio, step_time_ratio=time_ratio,
        fingerprint=fingerprint, calibration_file=written, unavailable=unavailable,
    )


def _profile_or_none():
    from trainfit.train.predictions import hardware_profile

    try:
        return hardware_profile()
    except Exception:  # the fingerprint then comes from a quick live look instead
        return None
