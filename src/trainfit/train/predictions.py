"""What the memory and speed models predict for the run that is about to happen.

The runner records these next to the measurements (summary.json, verify.json). A model that is
missing from this build, or that cannot describe this setup, gives an explicit reason instead of
a number (one spelling of "unknown": None plus a reason).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup


@dataclass(frozen=True)
class Prediction:
    tensor_peak_bytes: int | None  # per device, what max_memory_allocated / the tensor counter sees
    total_bytes: int | None  # tensor peak plus allocator / runtime margins
    step_seconds: float | None  # one optimizer step
    device: str
    unavailable: dict[str, str] = field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def hardware_profile():
    """The live machine, quick probe (cached: a run asks once)."""
    from trainfit.hardware.profiler import build_profile

    return build_profile(quick=True)


def predict(spec: ModelSpec | None, setup: TrainingSetup, spec_note: str = "") -> Prediction:
    reasons: dict[str, str] = {}
    tensor_peak = total = step = None
    if spec is None:
        why = f"no model description ({spec_note})"
        return Prediction(None, None, None, setup.device,
                          {"tensor_peak_bytes": why, "total_bytes": why, "step_seconds": why})
    try:
        profile = hardware_profile()
    except Exception as exc:  # probes are best effort; a prediction is not worth a crash
        profile, hw_reason = None, f"hardware profile unavailable: {exc}"
    else:
        hw_reason = ""
    try:
        from trainfit.core.memory import estimate_memory

        est = estimate_memory(spec, setup, profile)
        dev = est.devices[0]
        tensor_peak, total = dev.tensor_peak_bytes, dev.total_bytes
    except ImportError:
        reasons["tensor_peak_bytes"] = reasons["total_bytes"] = "memory model not in this build"
    except Exception as exc:
        reasons["tensor_peak_bytes"] = reasons["total_bytes"] = f"memory model: {exc}"
    if profile is None:
        reasons["step_seconds"] = hw_reason
    else:
        try:
            from trainfit.core.speed import predict_step

            step = predict_step(spec, setup, profile).step_seconds
        except ImportError:
            reasons["step_seconds"] = "speed model not in this build"
        except Exception as exc:
            reasons["step_seconds"] = f"speed model: {exc}"
    return Prediction(tensor_peak, total, step, setup.device, reasons)
