"""Run directories for the report tests: one real tiny CPU run (trained once per session), and
synthetic machine samples and events appended to copies of it (the monitor's records, built from
the dataclasses in hardware/sample_types.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainfit.hardware.sample_types import GpuSample, HostSample, Sample
from trainfit.train.monitor.events import append_record, event

from ..train.conftest import make_config  # the tiny run configs

GIB = 2**30


def step_times(run_dir: Path) -> list[float]:
    return [json.loads(line)["time"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"step"' in line and '"event"' not in line]


def synthetic_records(t0: float, t1: float, *, gpus: int = 2, n: int = 40) -> list[dict]:
    """Machine samples over [t0, t1] (CPU heating up, GPUs throttled in the middle third, the
    CPU's throttle count rising once) and a set of events, as the monitor writes them."""
    records = []
    dt = (t1 - t0) / (n - 1)
    for i in range(n):
        t = t0 + i * dt
        hot = n // 3 <= i < 2 * n // 3
        host = HostSample(ram_used_bytes=6 * GIB + i * 2**24, ram_total_bytes=16 * GIB, swap_used_bytes=0,
                          process_rss_bytes=int(0.45 * GIB) + i * 2**20, cpu_percent=90.0,
                          cpu_temperature_c=60.0 + i * 0.5, cpu_throttle_events=3 if i < n // 2 else 5,
                          cpu_package_watts=30.0 + (i % 5), on_ac=i < n - 5, battery_percent=100.0 - max(0, i - 34),
                          battery_seconds_left=None, unavailable={"battery_seconds_left": "estimating"})
        gs = tuple(GpuSample(index=g, memory_used_bytes=(3 + g) * GIB + i * 2**24, memory_total_bytes=24 * GIB,
                             allocated_bytes=2 * GIB + i * 2**23, reserved_bytes=(2.5 * GIB) + i * 2**23,
                             utilization_percent=97.0, power_watts=280.0 + 20 * hot + g, power_limit_watts=300.0,
                             temperature_c=70.0 + 14 * hot + g, slowdown_temperature_c=87.0, sm_clock_mhz=1800.0,
                             throttle_reasons=("sw_thermal", "hw_slowdown") if hot else ("gpu_idle",) if i == 0 else ())
                   for g in range(gpus))
        records.append(Sample(time=t, host=host, gpus=gs).to_record())
    span = t1 - t0
    for frac, kind, step, reason, details in [
        (0.20, "checkpoint", 3, "checkpoint-3 written", {"path": "checkpoints/checkpoint-3"}),
        (0.30, "oom_recovered", 3, "out of memory at micro-batch 8: retried with 4", {"micro_batch": 4}),
        (0.40, "precision_fallback", 4, "bf16 unsupported: fell back to fp16", {"to": "fp16"}),
        (0.45, "thermal_pause", 4, "GPU 0 at 88 °C: paused until it cools to 80 °C", {"gpu": 0}),
        (0.60, "thermal_resume", 4, "GPU 0 at 79 °C: resumed", {"gpu": 0}),
        (0.70, "memory_leak", 5, "process RSS grew 12 MiB per step over 50 steps", {"bytes_per_step": 12 << 20}),
        (0.95, "signal", 6, "SIGTERM: checkpoint written, stopping <now>", {"signal": "SIGTERM"}),
    ]:
        rec = event(kind, step, reason, **details)
        rec["time"] = t0 + frac * span
        records.append(rec)
    return records


def append(run_dir: Path, records: list[dict]) -> None:
    for rec in records:
        append_record(run_dir / "metrics.jsonl", rec)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A real 6-step pretraining on CPU (about 10 s), trained once; copy it before changing it."""
    pytest.importorskip("torch")
    pytest.importorskip("trl")
    from trainfit.config.run_config import load_run_config
    from trainfit.train.runner import run_training

    d = tmp_path_factory.mktemp("report-run")
    cfg = load_run_config(make_config(d, schedule={"max_steps": 6}, checkpointing={"every_steps": 3, "keep_last": 1},
                                      monitoring={"enabled": False}))  # only the synthetic samples below
    run_training(cfg, d / "run", quiet=True)
    return d / "run"


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(tiny_run, dst)
    return dst


@pytest.fixture
def monitored_run(run_copy) -> Path:
    """The tiny run with machine samples (2 GPUs) and events appended."""
    times = step_times(run_copy)
    append(run_copy, synthetic_records(times[0] - 0.5, times[-1] + 0.5))
    return run_copy
