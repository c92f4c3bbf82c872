"""Expected power draw, energy and electricity cost of a planned run.

GPU draw follows a linear utilisation model between idle and the board power limit,
    P_gpu = P_idle + (P_limit - P_idle) * activity,
where activity weights the parts of a step by how hard they drive the chip: dense GEMMs run at
the power limit (training stacks sit at 85-100 % of TDP under nvidia-smi), memory-bound kernels
at about 70 % (the SMs wait on DRAM), and host overhead, collectives and offload at about 30 %.
Idle is taken as 12 % of the limit (A100 SXM idles near 50-60 W of 400 W; T4 near 10 W of 70 W:
nvidia-smi readings reported by NVIDIA's data-centre docs and MLPerf power submissions).

CPU draw: the RAPL package power measured by `trainfit profile` when it was readable (scaled to
the planned load), else the CPU TDP times the planned load; the GPU case keeps the data loader
and launcher busy at ~30 % of the package.

Energy (kWh) = total watts x run seconds / 3.6e6 x PUE; cost = kWh x price.
Default price: 0.17 USD/kWh, the 2024 U.S. average residential retail price (16.5 cents,
EIA Electric Power Monthly, Table 5.6.A, https://www.eia.gov/electricity/monthly/epm_table_grapher.php?t=epmt_5_6_a).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainfit.core.machines.profile import HardwareProfile
from trainfit.errors import BadInputError

if TYPE_CHECKING:  # the speed package is only needed for the annotation
    from trainfit.core.speed.types import SpeedEstimate

DEFAULT_PRICE_PER_KWH = 0.17
GPU_IDLE_FRACTION = 0.12
# Activity of each step part (fraction of the idle-to-limit range it drives).
PART_ACTIVITY = {
    "compute": 1.0,
    "memory bandwidth": 0.7,
    "framework overhead": 0.3,
    "communication": 0.3,
    "offload": 0.3,
    "data loading": 0.2,
}
CPU_LOAD_WHILE_GPU_TRAINS = 0.3
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class PowerEstimate:
    gpu_count: int
    gpu_watts_each: float  # expected average draw of one GPU during the run
    gpu_limit_watts_each: float | None  # board limit it was scaled from
    activity: float  # 0..1, the utilisation the GPU draw was computed at
    cpu_watts: float
    other_watts: float  # rest of the system (board, drives, fans), as given
    total_watts: float
    run_seconds: float | None
    energy_kwh: float | None
    price_per_kwh: float
    electricity_cost: float | None  # in the currency of price_per_kwh
    notes: list[str] = field(default_factory=list)


def gpu_draw_watts(limit_watts: float, activity: float, idle_fraction: float = GPU_IDLE_FRACTION) -> float:
    """Average draw of one GPU at `activity` (0 idle .. 1 GEMMs at the power limit)."""
    if limit_watts <= 0:
        raise BadInputError(f"GPU power limit must be positive, got {limit_watts} W")
    activity = min(max(activity, 0.0), 1.0)
    idle = idle_fraction * limit_watts
    return idle + (limit_watts - idle) * activity


def step_activity(speed: SpeedEstimate) -> float:
    """Time-weighted activity of a step from the speed model's seconds by part."""
    parts = speed.seconds_by_part
    total = sum(parts.values())
    if total <= 0:
        return 0.0
    return sum(PART_ACTIVITY.get(name, 0.3) * seconds for name, seconds in parts.items()) / total


def energy_kwh(watts: float, seconds: float, pue: float = 1.0) -> float:
    """Energy of a constant draw over a duration, times the facility overhead (PUE >= 1)."""
    if watts < 0 or seconds < 0:
        raise BadInputError("power and duration must not be negative")
    if pue < 1.0:
        raise BadInputError(f"--pue must be at least 1.0, got {pue}")
    return watts * seconds / JOULES_PER_KWH * pue


def estimate_power(
    profile: HardwareProfile,
    speed: SpeedEstimate,
    *,
    price_per_kwh: float = DEFAULT_PRICE_PER_KWH,
    pue: float = 1.0,
    other_watts: float = 0.0,
    gpu_count: int | None = None,
) -> PowerEstimate:
    """Expected draw during the run described by `speed`, its energy and electricity cost."""
    if price_per_kwh < 0:
        raise BadInputError(f"--price-per-kwh must not be negative, got {price_per_kwh}")
    notes: list[str] = []
    activity = step_activity(speed)
    on_cpu = speed.device.startswith("cpu") or not profile.gpus
    n_gpu = 0 if on_cpu else (gpu_count or profile.gpu_count)
    gpu_each, limit = 0.0, None
    if n_gpu:
        gpu = profile.gpus[0]
        limit = gpu.power_limit_watts or gpu.tdp_watts
        if limit is None:
            notes.append("GPU power limit unknown: GPU draw not counted")
            gpu_each = 0.0
        else:
            gpu_each = gpu_draw_watts(limit, activity)
    cpu_load = 1.0 if on_cpu else CPU_LOAD_WHILE_GPU_TRAINS
    if n_gpu and _cpu_inside_gpu_figure(profile):
        cpu_watts = 0.0
        notes.append("CPU draw counted in the GPU figure: on Apple silicon the catalog's power is the whole "
                     "machine's (CPU, GPU and memory on one chip)")
    else:
        cpu_watts = _cpu_watts(profile, cpu_load, notes)
    total = n_gpu * gpu_each + cpu_watts + other_watts
    seconds = speed.total_seconds
    kwh = energy_kwh(total, seconds, pue) if seconds is not None else None
    return PowerEstimate(
        gpu_count=n_gpu,
        gpu_watts_each=gpu_each,
        gpu_limit_watts_each=limit,
        activity=activity,
        cpu_watts=cpu_watts,
        other_watts=other_watts,
        total_watts=total,
        run_seconds=seconds,
        energy_kwh=kwh,
        price_per_kwh=price_per_kwh,
        electricity_cost=None if kwh is None else kwh * price_per_kwh,
        notes=notes,
    )


def assumed_cpu_tdp_watts(physical_cores: int | None, logical_cores: int) -> tuple[float, int]:
    """(watts, cores) when neither a TDP nor RAPL can be read: ~10 W per physical core at full
    load (desktop parts draw 65-125 W for 8-16 cores), clamped to the range of real CPUs."""
    cores = physical_cores or max(1, logical_cores // 2)
    return float(min(350, max(15, 10 * cores))), cores


def _cpu_inside_gpu_figure(profile: HardwareProfile) -> bool:
    """Apple silicon: the GPU's power figure is the SoC's (the catalog lists the machine's maximum
    wall power), so a separate CPU figure would count the CPU twice."""
    return bool(profile.gpus) and profile.gpus[0].vendor == "apple" and profile.power.cpu_tdp_watts is None


def _load_text(load: float) -> str:
    return "at full load" if load >= 1.0 else f"at {load:.0%} load while the GPU trains"


def _cpu_watts(profile: HardwareProfile, load: float, notes: list[str]) -> float:
    """The CPU draw counted; every note states the watts the power line shows."""
    power = profile.power
    tdp = power.cpu_tdp_watts
    measured = power.cpu_package_watts
    if tdp is not None:
        if measured is not None and measured > tdp * load:
            # RAPL already reads more than the planned share (other processes): keep the reading.
            notes.append(f"CPU: {measured:.0f} W, the package draw RAPL measured (above {tdp * load:.0f} W = "
                         f"TDP {tdp:.0f} W {_load_text(load)})")
            return measured
        return tdp * load
    if measured is not None:
        notes.append(f"CPU: {measured:.0f} W, the package draw RAPL measured (CPU TDP unknown)")
        return measured
    watts, cores = assumed_cpu_tdp_watts(profile.cpu.physical_cores, profile.cpu.logical_cores)
    notes.append(f"CPU: {watts * load:.0f} W = assumed TDP {watts:.0f} W ({cores} cores x 10 W) {_load_text(load)} "
                 "(CPU TDP unknown and RAPL unreadable)")
    return watts * load
