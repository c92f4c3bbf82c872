"""Speed, power and energy of one training setup on one machine, in one result.

Combines the step-time model (core/speed) and the power model (core/run/power), and applies the
step-time ratio that `trainfit verify` measured on this machine when there is one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trainfit.core.models.spec import ModelSpec
from trainfit.core.run.power import DEFAULT_PRICE_PER_KWH, PowerEstimate, estimate_power
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed import SpeedEstimate, Workload, predict_step

# Step time varies more between machines than memory does (kernels, clocks, thermal state), so
# the band of ratios accepted from verify runs is wider than the memory one.
PLAUSIBLE_STEP_FACTOR = (0.25, 4.0)


@dataclass(frozen=True)
class RunPrediction:
    speed: SpeedEstimate
    power: PowerEstimate
    step_time_factor: float  # 1.0 when no calibration was applied
    notes: list[str] = field(default_factory=list)


def predict_run(
    model: ModelSpec,
    setup: TrainingSetup,
    hardware: HardwareProfile,
    workload: Workload | None = None,
    *,
    price_per_kwh: float = DEFAULT_PRICE_PER_KWH,
    step_time_factor: float = 1.0,
    calibration_source: str = "",
) -> RunPrediction:
    notes: list[str] = []
    speed = predict_step(model, setup, hardware, workload)
    low, high = PLAUSIBLE_STEP_FACTOR
    if step_time_factor != 1.0 and low <= step_time_factor <= high:
        speed = scaled_speed(speed, step_time_factor)
        notes.append(f"step time x{step_time_factor:.2f}: {calibration_source}")
    elif step_time_factor != 1.0:
        notes.append(f"step-time calibration ignored: ratio {step_time_factor:.2f} is outside {low}-{high}")
        step_time_factor = 1.0
    power = estimate_power(hardware, speed, price_per_kwh=price_per_kwh)
    return RunPrediction(speed, power, step_time_factor, notes)


def scaled_speed(speed: SpeedEstimate, factor: float) -> SpeedEstimate:
    """Every duration times `factor`, every rate divided by it (FLOPs per step unchanged)."""
    return dataclasses.replace(
        speed,
        micro_step_seconds=speed.micro_step_seconds * factor,
        step_seconds=speed.step_seconds * factor,
        tokens_per_second=speed.tokens_per_second / factor,
        samples_per_second=speed.samples_per_second / factor,
        achieved_tflops_per_device=speed.achieved_tflops_per_device / factor,
        mfu=speed.mfu / factor,
        seconds_by_part={k: v * factor for k, v in speed.seconds_by_part.items()},
        total_seconds=None if speed.total_seconds is None else speed.total_seconds * factor,
    )
