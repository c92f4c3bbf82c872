"""Apply a machine's measured/predicted memory ratio (from `trainfit verify`) to an estimate.

The correction is shown as its own component, "calibration", so the breakdown still says what
the model predicts and how much this machine's measurements moved it.
"""

from __future__ import annotations

import dataclasses

from trainfit.core.memory_types import MemoryComponent, MemoryEstimate

# A ratio outside this band means the verify run measured something else (another model, a
# busy allocator), not a small systematic error of the model: do not let it steer plans.
PLAUSIBLE_FACTOR = (0.5, 2.0)


def apply_memory_factor(estimate: MemoryEstimate, device_prefix: str, factor: float, source: str) -> MemoryEstimate:
    """Scale the tensor peak of devices named `device_prefix*` ("cpu", "cuda") by `factor`.

    Returns the estimate unchanged (with a note) when the factor is implausible.
    """
    low, high = PLAUSIBLE_FACTOR
    if not low <= factor <= high:
        note = f"calibration ignored: measured/predicted ratio {factor:.2f} is outside {low}-{high} ({source})"
        return dataclasses.replace(estimate, notes=[*estimate.notes, note])
    devices = []
    for dev in estimate.devices:
        if not dev.device.startswith(device_prefix):
            devices.append(dev)
            continue
        delta = int(round(dev.tensor_peak_bytes * (factor - 1.0)))
        component = MemoryComponent(
            "calibration", delta, f"{source}: measured / predicted tensor peak = {factor:.3f}", True
        )
        devices.append(dataclasses.replace(
            dev, tensor_peak_bytes=dev.tensor_peak_bytes + delta, total_bytes=dev.total_bytes + delta,
            components=[*dev.components, component],
            required_bytes=None if dev.required_bytes is None else dev.required_bytes + delta,
        ))
    return dataclasses.replace(estimate, devices=devices)
