"""Speed model: FLOPs per step, achievable throughput, step time, run time and bottleneck.

Public API:
    predict_step(model, setup, hardware, workload=None) -> SpeedEstimate
    with_workload(estimate, setup, workload) -> SpeedEstimate
    device_rates(profile, device) / gpu_rates(profile) / cpu_rates(profile) -> DeviceRates
    gpu_spec_rates(gpu_spec, count) -> DeviceRates   (catalog GPUs, e.g. a cloud flavor)
    step_flops(model, setup) -> StepFlops
"""

from trainfit.core.speed.flops import StepFlops, model_flops_per_token, step_flops
from trainfit.core.speed.predict import predict_step, with_workload
from trainfit.core.speed.rates import DeviceRates, cpu_rates, device_rates, gpu_rates, gpu_spec_rates
from trainfit.core.speed.types import SpeedEstimate, Workload

__all__ = [
    "DeviceRates",
    "SpeedEstimate",
    "StepFlops",
    "Workload",
    "cpu_rates",
    "device_rates",
    "gpu_rates",
    "gpu_spec_rates",
    "model_flops_per_token",
    "predict_step",
    "step_flops",
    "with_workload",
]
