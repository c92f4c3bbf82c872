"""Per-machine calibration of the memory and speed predictions from `trainfit verify` runs.

Stored in $XDG_CONFIG_HOME/trainfit/calibration.json (default ~/.config/trainfit/), keyed by a
machine fingerprint and the device ("cpu", "cuda:NVIDIA H100 80GB HBM3"):

    {"version": 1, "machines": {"<fingerprint>": {"<device>": {"samples": [
        {"time": ..., "model": ..., "method": ..., "memory_ratio": 1.07, "step_time_ratio": 0.82}, ...]}}}}

A ratio is measured / predicted. The factor applied later is the median of the last
MAX_SAMPLES ratios (robust to one noisy verify), so calibration moves slowly and never jumps on
one outlier. `trainfit estimate` applies the factors (core/memory/calibrated.py, core/run/prediction.py).

Busy machines: every sample records the 1-minute load average and the usable cores at the end of
the measurement. A step time measured while the run queue was longer than the cores by more than
LOAD_TOLERANCE (load average > 1.25 x cores) measures the other work as much as the model (on a
time-shared CPU every runnable thread gets cores/load of one), so that sample's step-time ratio is
stored with `step_time_contended` (the reason) and never applied; its memory ratio still is (peak
tensor bytes do not depend on the load). The run itself may keep every core busy: only the queue
beyond all cores counts against it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CALIBRATION_VERSION = 1
# Steps of a verify run. On a CPU the first steps pay allocator and page-fault warm-up: with 2
# warm-up steps verify measured 1.6x the steady-state step time of the same run; 5 warm-up + 10
# timed steps matched it within 12 %.
DEFAULT_WARMUP_STEPS = 5
DEFAULT_TIMED_STEPS = 10
MAX_SAMPLES = 20
# Run-queue length beyond the cores (as a share of the cores) above which a step time is not applied.
LOAD_TOLERANCE = 0.25


@dataclass(frozen=True)
class DeviceCalibration:
    device: str
    memory_factor: float | None  # multiply predicted tensor-peak bytes by this
    step_time_factor: float | None  # multiply predicted step seconds by this
    samples: int
    updated: float | None = None
    contended_samples: int = 0  # step times measured on a busy machine: stored, not applied


@dataclass(frozen=True)
class Calibration:
    fingerprint: str
    devices: dict[str, DeviceCalibration] = field(default_factory=dict)


def device_key(device: str, gpu_name: str | None = None) -> str:
    """Key of a device in the calibration file: "cpu", or "cuda:<GPU name>" (NVML and torch
    report the same name, so a profile and a live run find the same entry)."""
    return f"cuda:{gpu_name}" if device in ("cuda", "rocm") and gpu_name else device


def calibration_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "trainfit" / "calibration.json"


def machine_fingerprint(profile: Any = None) -> str:
    """A stable id of this machine's compute: CPU model and cores, RAM size, GPU names and VRAM.

    From a HardwareProfile when given (so plans for a saved profile find the same entry),
    else from a quick live look. Not a secret and not unique across identical machines, on
    purpose: identical machines share calibration.
    """
    if profile is not None:
        # an unknown RAM size keys as 0, as before sizes could be None
        parts = [profile.cpu.model or "", str(profile.cpu.logical_cores), str((profile.memory.total_bytes or 0) >> 30)]
        parts += [f"{g.name}:{(g.vram_total_bytes or 0) >> 30}" for g in profile.gpus]
    else:
        import platform

        import psutil

        parts = [_cpu_model() or platform.processor(), str(os.cpu_count() or 0),
                 str(psutil.virtual_memory().total >> 30)]
        parts += _gpu_names()
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _gpu_names() -> list[str]:
    import sys

    torch = sys.modules.get("torch")  # only ask torch if the caller already loaded it
    if torch is not None and torch.cuda.is_available():
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(f"{p.name}:{p.total_memory >> 30}")
        return out
    return []


def read_calibration(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"version": CALIBRATION_VERSION, "machines": {}}
    if not isinstance(data, dict) or data.get("version") != CALIBRATION_VERSION:
        return {"version": CALIBRATION_VERSION, "machines": {}}
    data.setdefault("machines", {})
    return data


def _median(values: list[float]) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float)) and v > 0]
    import statistics

    return statistics.median(vals) if vals else None


def load_calibration(fingerprint: str, path: Path | None = None) -> Calibration | None:
    """The calibration stored for this machine, or None when it has never been verified."""
    machines = read_calibration(path or calibration_path())["machines"]
    entry = machines.get(fingerprint)
    if not isinstance(entry, dict) or not entry:
        return None
    devices = {}
    for device, rec in entry.items():
        samples = rec.get("samples", []) if isinstance(rec, dict) else []
        samples = [s for s in samples if isinstance(s, dict)]
        contended = [s for s in samples if s.get("step_time_contended")]
        devices[device] = DeviceCalibration(
            device=device, memory_factor=_median([s.get("memory_ratio") for s in samples]),
            step_time_factor=_median([s.get("step_time_ratio") for s in samples if s not in contended]),
            samples=len(samples), updated=max((s.get("time", 0) for s in samples), default=None),
            contended_samples=len(contended),
        )
    return Calibration(fingerprint, devices)


@dataclass(frozen=True)
class LoadCheck:
    """The machine's load when a verify measurement ended, and whether it was too busy."""

    load_average_1m: float | None  # None where the OS has no load average (Windows)
    cores: int  # usable cores (CPU affinity)
    contended: bool
    reason: str | None  # why the step time is not applied, when contended


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS / Windows: no affinity API
        return os.cpu_count() or 1


def check_load(load_average_1m: float | None = None, cores: int | None = None) -> LoadCheck:
    """Judge a measurement by the 1-minute load average at its end (read now when not given)."""
    if load_average_1m is None:
        try:
            load_average_1m = os.getloadavg()[0]
        except (AttributeError, OSError):
            load_average_1m = None
    cores = cores or usable_cores()
    limit = cores * (1 + LOAD_TOLERANCE)
    if load_average_1m is None or load_average_1m <= limit:
        return LoadCheck(load_average_1m, cores, False, None)
    reason = (f"step time not applied: the machine was busy while verify measured (1-min load average "
              f"{load_average_1m:.1f} on {cores} core{'s' if cores != 1 else ''}, above {limit:g} = cores + "
              f"{LOAD_TOLERANCE:.0%}): other work got a share of the CPU. Re-run `trainfit verify` on an idle "
              "machine; the memory ratio was stored")
    return LoadCheck(load_average_1m, cores, True, reason)


def record_verify_sample(fingerprint: str, device: str, sample: dict[str, Any], path: Path | None = None,
                         *, load: LoadCheck | None = None) -> tuple[Path, LoadCheck]:
    """Store one verify result with the load it was measured under; a step time from a busy
    machine is stored flagged (`step_time_contended`) and never applied. Returns (file, check)."""
    load = load or check_load()
    sample = {**sample, "load_average_1m": load.load_average_1m, "cores": load.cores}
    if load.contended:
        sample["step_time_contended"] = load.reason
    return record_sample(fingerprint, device, sample, path), load


def record_sample(fingerprint: str, device: str, sample: dict[str, Any], path: Path | None = None) -> Path:
    """Append one verify result (keeps the last MAX_SAMPLES) and write the file atomically."""
    from trainfit.files import write_atomic

    path = path or calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = read_calibration(path)
    rec = data["machines"].setdefault(fingerprint, {}).setdefault(device, {"samples": []})
    rec["samples"] = (rec.get("samples", []) + [{"time": time.time(), **sample}])[-MAX_SAMPLES:]
    return write_atomic(path, json.dumps(data, indent=2) + "\n")
