"""Fault injection for tests and demos: make a training step fail the way real hardware does.

Set TRAINFIT_FAULTS before `trainfit train` (it also reaches every rank under torchrun):

    TRAINFIT_FAULTS="oom@5:cuda"                  an out-of-memory error in optimizer step 5
    TRAINFIT_FAULTS="oom@5:mps,oom@9:cpu"         two of them, different backends
    TRAINFIT_FAULTS="oom@5/2"                     ... in the 2nd micro-batch of step 5 (gradients of
                                                  the 1st are then already accumulated)
    TRAINFIT_FAULTS="oom@5*3"                     step 5 fails 3 times (each retry of it fails again)
    TRAINFIT_FAULTS="nan@7"                       the loss of step 7 is NaN (also: inf@7)
    TRAINFIT_FAULTS="nan@7-9"                     steps 7, 8 and 9 (a streak)
    TRAINFIT_FAULTS="nangrad@7"                   the loss of step 7 is finite, its gradients NaN
    TRAINFIT_FAULTS="device_lost@9:ecc"           the device fails in step 9 (lost | ecc | poisoned)
    TRAINFIT_FAULTS="oom@5:cuda,rank=1"           only on rank 1 (default: every rank)
    TRAINFIT_FAULTS="stall@6,rank=1"              rank 1 stops responding in step 6 (its forward
                                                  sleeps STALL_SECONDS): the others wait for it in
                                                  their gradient all-reduce, as for a hung node

Steps count optimizer steps from 1, as metrics.jsonl does. OOM backends: cuda, hip, mps, xpu,
xpu-ur (the Level Zero runtime's error), cpu, cpu-python (MemoryError). Each raises the exception
type that backend raises, with its real message (values of one real report), so what catches it
is exercised exactly as by the real failure.

TRAINFIT_FAKE_MACHINE=script.json replaces the machine the training monitor samples with a
scripted one (hardware/sample_fakes.MachineScript: temperatures, throttle counters, battery, RAM,
swap, GPU memory and leak readings as time series tied to the training's steps), so the safety
policies of a real `trainfit train` run can be driven through heat, low battery and memory
pressure on any machine.

The errors are raised from inside the model's forward: a forward pre-hook (out of memory, device
failure) or a forward hook that makes the loss non-finite, on the model the Trainer trains, so
they travel through the Trainer, accelerate and DDP like real ones. Each fault fires once per
process; a fresh process started to continue the run (after a device failure) gets only the
faults that have not fired yet, and faults never fire after a torchrun restart
(TORCHELASTIC_RESTART_COUNT > 0), so a recovered run is not failed again by the same fault.

`SampleLog` records which samples each optimizer step trained on (a digest per row of
input_ids); the recovery tests and bench/oom_recovery.py compare it with a clean run.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainerCallback

from trainfit.errors import BadInputError

ENV = "TRAINFIT_FAULTS"
KINDS = ("oom", "nan", "inf", "nangrad", "device_lost", "stall")
STALL_SECONDS = 3600.0  # longer than any test waits: the stalled process is killed, never woken
FAKE_MACHINE_ENV = "TRAINFIT_FAKE_MACHINE"

# Messages as the backends print them (numbers from one real report each).
OOM_MESSAGES = {
    "cuda": ("CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
             "1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use. Of the "
             "allocated memory 74.49 GiB is allocated by PyTorch, and 3.01 GiB is reserved by PyTorch but "
             "unallocated. If reserved but unallocated memory is large try setting "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
             "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"),
    "hip": ("HIP out of memory. Tried to allocate 432.00 MiB. GPU 0 has a total capacity of 15.92 GiB of which "
            "7.12 GiB is free. Of the allocated memory 8.08 GiB is allocated by PyTorch, and 321.96 MiB is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"),
    "mps": ("MPS backend out of memory (MPS allocated: 17.79 GB, other allocations: 384.00 KB, max allowed: "
            "18.13 GB). Tried to allocate 864.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to "
            "disable upper limit for memory allocations (may cause system failure)."),
    "xpu": ("XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a total capacity of 5.65 GiB of which "
            "5.65 GiB is free. Of the allocated memory 195.50 KiB is allocated by PyTorch, and 1.81 MiB is "
            "reserved by PyTorch but unallocated. Please use `empty_cache` to release all unoccupied cached memory."),
    "xpu-ur": "level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)",
    "cpu": ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
            "to allocate 103079215104 bytes. Error code 12 (Cannot allocate memory)"),
    "cpu-python": "",
}
DEVICE_MESSAGES = {
    "lost": "CUDA error: GPU is lost",
    "ecc": ("CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously reported "
            "at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
            "CUDA_LAUNCH_BLOCKING=1"),
    "poisoned": ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously "
                 "reported at some other API call, so the stacktrace below might be incorrect."),
}
_ITEM = re.compile(r"^(?P<kind>[a-z_]+)@(?P<first>\d+)(?:-(?P<last>\d+))?(?:/(?P<micro>\d+))?"
                   r"(?::(?P<variant>[a-z-]+))?(?:\*(?P<times>\d+))?$")


def oom_exception(backend: str) -> BaseException:
    """The exception `backend`'s allocator raises when it runs out of memory."""
    import torch

    if backend not in OOM_MESSAGES:
        raise ValueError(f"unknown OOM backend {backend!r} (valid: {', '.join(OOM_MESSAGES)})")
    if backend == "cpu-python":
        return MemoryError()
    if backend in ("cuda", "hip", "xpu"):  # the caching allocators raise torch.OutOfMemoryError
        return torch.OutOfMemoryError(OOM_MESSAGES[backend])
    return RuntimeError(OOM_MESSAGES[backend])  # MPS, Level Zero and the CPU allocator: RuntimeError


def device_exception(variant: str) -> BaseException:
    import torch

    cls = getattr(torch, "AcceleratorError", RuntimeError)  # torch >= 2.8 raises this for CUDA errors
    return cls(DEVICE_MESSAGES[variant])


@dataclass
class Fault:
    kind: str  # oom | nan | inf | device_lost
    step: int  # optimizer step, from 1
    variant: str = ""  # OOM backend or device-failure variant
    micro: int = 1  # which forward of the step (1 = the first micro-batch)
    times: int = 1  # how many times it fires (each retry of the step fails again)
    fired: int = 0

    def spec(self) -> str:
        text = f"{self.kind}@{self.step}" + (f"/{self.micro}" if self.micro != 1 else "")
        text += f":{self.variant}" if self.variant else ""
        left = self.times - self.fired
        return text + (f"*{left}" if left != 1 else "")


@dataclass
class FaultPlan:
    faults: list[Fault] = field(default_factory=list)
    rank: int | None = None  # None: every rank

    def remaining_spec(self) -> str:
        """TRAINFIT_FAULTS for a process that continues this run: the faults not fired yet."""
        items = [f.spec() for f in self.faults if f.fired < f.times]
        if items and self.rank is not None:
            items.append(f"rank={self.rank}")
        return ",".join(items)

    def applies(self, rank: int) -> bool:
        return bool(self.faults) and (self.rank is None or self.rank == rank)


def parse(text: str) -> FaultPlan:
    """Parse TRAINFIT_FAULTS; BadInputError naming the variable and the item otherwise."""
    plan = FaultPlan()
    for raw in (t.strip() for t in text.split(",")):
        if not raw:
            continue
        if raw.startswith("rank="):
            value = raw[5:]
            if not value.isdigit():
                raise BadInputError(f"{ENV}: {raw!r}: rank must be a process index like rank=1")
            plan.rank = int(value)
            continue
        m = _ITEM.match(raw)
        if not m or m["kind"] not in KINDS:
            raise BadInputError(f"{ENV}: {raw!r} is not a fault (examples: oom@5:cuda, nan@7-9, device_lost@9:ecc, "
                                f"rank=1; kinds: {', '.join(KINDS)})")
        kind, first = m["kind"], int(m["first"])
        last = int(m["last"]) if m["last"] else first
        variant = m["variant"] or {"oom": "cuda", "device_lost": "poisoned"}.get(kind, "")
        if kind == "oom" and variant not in OOM_MESSAGES:
            raise BadInputError(f"{ENV}: {raw!r}: OOM backend {variant!r} unknown (valid: {', '.join(OOM_MESSAGES)})")
        if kind == "device_lost" and variant not in DEVICE_MESSAGES:
            raise BadInputError(f"{ENV}: {raw!r}: device failure {variant!r} unknown "
                                f"(valid: {', '.join(DEVICE_MESSAGES)})")
        if kind in ("nan", "inf", "nangrad", "stall") and m["variant"]:
            raise BadInputError(f"{ENV}: {raw!r}: {kind} takes no variant")
        if first < 1 or last < first:
            raise BadInputError(f"{ENV}: {raw!r}: steps count from 1 and a range goes upwards")
        for step in range(first, last + 1):
            plan.faults.append(Fault(kind, step, variant, int(m["micro"] or 1), int(m["times"] or 1)))
    return plan


def from_env(environ: dict[str, str] | None = None) -> FaultPlan | None:
    """The plan in TRAINFIT_FAULTS, or None (unset, empty, or a torchrun restart)."""
    env = os.environ if environ is None else environ
    text = env.get(ENV, "").strip()
    if not text or env.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return None
    return parse(text)


class FaultInjector(TrainerCallback):
    """Fires the plan's faults from hooks on the trained model (re-attached on every train())."""

    def __init__(self, plan: FaultPlan, rank: int = 0, log=None) -> None:
        self.plan = plan
        self.rank = rank
        self.log = log or (lambda m: None)
        self._handles: list[Any] = []
        self._step = 1  # the optimizer step being computed
        self._forward = 0  # forwards so far in this step

    def on_train_begin(self, args, state, control, model=None, **kw):
        self._remove()
        self._step, self._forward = state.global_step + 1, 0
        if model is None or not self.plan.applies(self.rank):
            return
        self._handles = [model.register_forward_pre_hook(self._before),
                         model.register_forward_hook(self._after)]

    def on_step_begin(self, args, state, control, **kw):
        self._step, self._forward = state.global_step + 1, 0

    def on_train_end(self, args, state, control, **kw):
        self._remove()

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _due(self, kinds: tuple[str, ...]) -> Fault | None:
        for f in self.plan.faults:
            if f.kind in kinds and f.step == self._step and f.micro == self._forward and f.fired < f.times:
                return f
        return None

    def _before(self, module, args):
        if not module.training:
            return None
        self._forward += 1
        stall = self._due(("stall",))
        if stall is not None:
            stall.fired += 1
            self.log(f"fault injection: rank {self.rank} stops responding in step {self._step}")
            import time

            time.sleep(STALL_SECONDS)
        fault = self._due(("oom", "device_lost"))
        if fault is not None:
            fault.fired += 1
            self.log(f"fault injection: {fault.kind} ({fault.variant}) in step {self._step}, rank {self.rank}")
            raise oom_exception(fault.variant) if fault.kind == "oom" else device_exception(fault.variant)
        return None

    def _after(self, module, args, output):
        if not module.training:
            return None
        fault = self._due(("nan", "inf", "nangrad"))
        if fault is None:
            return None
        fault.fired += 1
        if fault.kind == "nangrad":
            self.log(f"fault injection: NaN gradients (finite loss) in step {self._step}, rank {self.rank}")
            value = output.get("loss") if hasattr(output, "get") else None
            if value is not None:
                output["loss"] = _nan_gradient(value)
            return output
        self.log(f"fault injection: {fault.kind} loss in step {self._step}, rank {self.rank}")
        bad = float("nan") if fault.kind == "nan" else float("inf")
        for key in ("loss", "logits"):  # the loss the Trainer reads, and what DPO computes its loss from
            value = output.get(key) if hasattr(output, "get") else None
            if value is not None:
                output[key] = value * bad
        return output


def _nan_gradient(loss):
    """`loss` unchanged in value, with a NaN gradient flowing back from it (a backward pass that
    overflows while the forward did not)."""
    import torch

    class NanGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * float("nan")

    return NanGradient.apply(loss)


def fake_machine_from_env(step_fn, environ: dict[str, str] | None = None):
    """The MachineScript in TRAINFIT_FAKE_MACHINE (a JSON file), or None when unset; BadInputError
    naming the variable when the file cannot be read or is not a machine script."""
    import json

    from trainfit.hardware.sample_fakes import MachineScript, check_machine_script

    env = os.environ if environ is None else environ
    path = env.get(FAKE_MACHINE_ENV, "").strip()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            spec = check_machine_script(json.load(fh), f"{FAKE_MACHINE_ENV}={path}")
        _check_tuning(spec, f"{FAKE_MACHINE_ENV}={path}")
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{FAKE_MACHINE_ENV}: {exc}") from None
    return MachineScript(spec, step_fn)


def _check_tuning(spec: dict, where: str) -> None:
    """The script's safety thresholds and leak-detector settings name real fields, with numbers."""
    import dataclasses
    import inspect

    from trainfit.core.run.safety_thresholds import SafetyThresholds
    from trainfit.train.monitor.leaks import LeakDetector

    valid = {"safety": {f.name for f in dataclasses.fields(SafetyThresholds)} - {"mode"},
             "leak_detector": set(inspect.signature(LeakDetector).parameters)}
    for key, names in valid.items():
        given = spec.get(key) or {}
        if not isinstance(given, dict):
            raise ValueError(f"{where}: {key} must be an object")
        for name, value in given.items():
            if name not in names:
                raise ValueError(f"{where}: {key}.{name} is not a setting (valid: {', '.join(sorted(names))})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{where}: {key}.{name} must be a number >= 0")
    for key in ("interval_seconds", "leak_read_seconds", "leak_check_seconds"):
        value = spec.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                key == "interval_seconds" and value == 0):
            raise ValueError(f"{where}: {key} must be a number of seconds"
                             + (" > 0" if key == "interval_seconds" else " >= 0"))


class SampleLog(TrainerCallback):
    """Which samples each optimizer step trained on: step -> sorted digests of its input_ids rows
    (of this process). Steps that are run again after a recovery replace what was logged first, so
    the log is the trajectory that counts."""

    def __init__(self) -> None:
        self.steps: dict[int, list[str]] = {}
        self._pending: list[str] = []
        self._handle = None

    def on_train_begin(self, args, state, control, model=None, **kw):
        if self._handle is not None:
            self._handle.remove()
        self._pending = []
        if model is not None:
            self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def on_step_begin(self, args, state, control, **kw):
        self._pending = []

    def _record(self, module, args, kwargs):
        if not module.training:
            return None
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            for row in ids.detach().cpu():
                self._pending.append(hashlib.sha1(row.numpy().tobytes()).hexdigest()[:12])
        return None

    def on_step_end(self, args, state, control, **kw):
        self.steps[state.global_step] = sorted(self._pending)
        self._pending = []

    def on_train_end(self, args, state, control, **kw):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
