"""Per-machine calibration of the memory and speed predictions from `trainfit verify` runs.

Stored in $XDG_CONFIG_HOME/trainfit/calibration.json (default ~/.config/trainfit/), keyed by a
machine fingerprint and the device ("cpu", "cuda:NVIDIA H100 80GB HBM3"):

    {"version": 1, "machines": {"<fingerprint>": {"<device>": {"samples": [
        {"time": ..., "model": ..., "method": ..., "memory_ratio": 1.07, "step_time_ratio": 0.82}, ...]}}}}

A ratio is measured / predicted. The factor applied later is the median of the last
MAX_SAMPLES ratios (robust to one noisy verify), so calibration moves slowly and never jumps on
one outlier. `trainfit estimate` applies the factors (core/memory/calibrated.py, core/run_prediction.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
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


@dataclass(frozen=True)
class DeviceCalibration:
    device: str
    memory_factor: float | None  # multiply predicted tensor-peak bytes by this
    step_time_factor: float | None  # multiply predicted step seconds by this
    samples: int
    updated: float | None = None


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
        parts = [profile.cpu.model or "", str(profile.cpu.logical_cores), str(profile.memory.total_bytes >> 30)]
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


def _read(path: Path) -> dict[str, Any]:
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
    return statistics.median(vals) if vals else None


def load_calibration(fingerprint: str, path: Path | None = None) -> Calibration | None:
    """The calibration stored for this machine, or None when it has never been verified."""
    machines = _read(path or calibration_path())["machines"]
    entry = machines.get(fingerprint)
    if not isinstance(entry, dict) or not entry:
        return None
    devices = {}
    for device, rec in entry.items():
        samples = rec.get("samples", []) if isinstance(rec, dict) else []
        devices[device] = DeviceCalibration(
            device=device, memory_factor=_median([s.get("memory_ratio") for s in samples]),
            step_time_factor=_median([s.get("step_time_ratio") for s in samples]), samples=len(samples),
            updated=max((s.get("time", 0) for s in samples), default=None),
        )
    return Calibration(fingerprint, devices)


def record_sample(fingerprint: str, device: str, sample: dict[str, Any], path: Path | None = None) -> Path:
    """Append one verify result (keeps the last MAX_SAMPLES) and write the file atomically."""
    from trainfit.files import write_atomic

    path = path or calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path)
    rec = data["machines"].setdefault(fingerprint, {}).setdefault(device, {"samples": []})
    rec["samples"] = (rec.get("samples", []) + [{"time": time.time(), **sample}])[-MAX_SAMPLES:]
    return write_atomic(path, json.dumps(data, indent=2) + "\n")
