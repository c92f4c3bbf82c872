"""The safety thresholds of a run, per plan mode: when `trainfit train` pauses for heat or battery,
how much work a crash may lose, how long between interruptions a checkpoint cadence assumes.
Below the planner, the spot model and the checkpoint cadence, which all read them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Safety policies of `trainfit train` (seeds/001 §8: thermal protection, power management,
# checkpoint frequency from the run-time estimate), per mode. Used by trainfit.train.monitor.safety.
# conservative gives up least (larger margins, sooner stops), extreme trades margin for speed but
# checkpoints before every pause and loses the least work, since it runs at 95 % of memory and
# 90-100 % of TDP (the mode most likely to crash).
@dataclass(frozen=True)
class SafetyThresholds:
    mode: str
    # -- thermal --------------------------------------------------------------------------
    # Pause when a GPU is within this many degrees of the slowdown threshold its driver reports
    # (NVML TEMPERATURE_THRESHOLD_SLOWDOWN, hwmon temp*_crit): the threshold is where the GPU cuts
    # its clocks for heat, so at -10 / -5 / -2 C the pause comes before the throttling it avoids.
    gpu_margin_c: float
    # Pause when a CPU package/core sensor reaches this (CPU training). Intel Core parts throttle
    # at Tjmax 100 C (PROCHOT; a few mobile parts 105 C), AMD Ryzen 7000 at 95 C (Tctl, where it
    # also boosts up to by design): 85 / 90 / 95 C leave 15 / 10 / 5 degrees to Intel's Tjmax.
    cpu_limit_c: float
    # Pause when the kernel's thermal-throttle counters (/sys/devices/system/cpu/cpu*/
    # thermal_throttle, Intel) rise by this many events per minute (CPU training): any / brief
    # PROCHOT blips tolerated / only sustained throttling.
    cpu_throttle_events_per_minute: float
    # A pause that has not cooled the device after this long means the cooling cannot keep up
    # even at idle (a GPU heatsink cools ~10 C within a few minutes once the load stops): then
    # checkpoint and stop instead of holding the machine.
    max_thermal_pause_seconds: float
    # -- power --------------------------------------------------------------------------------
    # Below this battery charge (or less than battery_min_seconds_left of estimated run time):
    # checkpoint and wait for AC. Windows warns at 10 % and keeps a 7 % reserve by default; the
    # pause comes 5-20 points earlier, leaving charge for the checkpoint and for waiting idle.
    battery_pause_percent: float
    battery_min_seconds_left: float
    max_battery_wait_seconds: float  # then the run stops (its checkpoint is already written)
    # Share of torch's CPU threads kept on battery (CPU training): fewer cores, less draw and heat.
    battery_thread_share: float
    # -- checkpoint cadence ---------------------------------------------------------------------
    # Never lose more than this much training time to a crash (upper bound on the interval).
    max_loss_seconds: float
    # The assumed mean time between interruptions that lose the in-memory state (crash, OOM,
    # power loss, reboot): the risk the mode accepts. It sets the interval through Young's
    # optimum sqrt(2 x checkpoint cost x this) (Young 1974, "A first order approximation to the
    # optimum checkpoint interval"); only its square root counts, so a 4x error moves the interval
    # 2x. A judgement, not a measurement: no failure statistics exist for single machines.
    interruption_seconds: float
    # Checkpointing may cost at most this share of the run time: interval >= cost / share.
    overhead_max_share: float = 0.03
    # On battery or after thermal trouble the assumed time between interruptions is multiplied
    # by this (on battery also capped at the battery's estimated time left): Young's interval
    # halves, so checkpoints come twice as often while the risk is higher.
    elevated_risk_share: float = 0.25
    # After cooling, the pause ends once the reading stayed this far below the pause threshold
    # (hysteresis: a smaller gap restarts into the threshold within a minute and oscillates)...
    hysteresis_c: float = 10.0
    # ... for this long (several readings, so a single low one while fans spin down is not enough).
    cool_hold_seconds: float = 30.0
    # After a thermal pause the risk stays elevated this long (for the checkpoint cadence): a
    # device that overheated once under this load is likely to do it again within minutes.
    thermal_risk_seconds: float = 900.0
    # Readings are taken at optimizer-step boundaries at most this often, and every this many
    # seconds during a pause.
    check_seconds: float = 5.0
    # A GPU whose driver reports no slowdown threshold is assumed to slow down here: the low end
    # of the "GPU Slowdown Temp" nvidia-smi -q reports for recent NVIDIA cards (about 90-98 C).
    assumed_gpu_slowdown_c: float = 90.0


SAFETY = {
    "conservative": SafetyThresholds("conservative", gpu_margin_c=10.0, cpu_limit_c=85.0,
                                     cpu_throttle_events_per_minute=1.0, max_thermal_pause_seconds=600.0,
                                     battery_pause_percent=30.0, battery_min_seconds_left=1200.0,
                                     max_battery_wait_seconds=900.0, battery_thread_share=0.5,
                                     max_loss_seconds=1800.0, interruption_seconds=24 * 3600.0),
    "balanced": SafetyThresholds("balanced", gpu_margin_c=5.0, cpu_limit_c=90.0,
                                 cpu_throttle_events_per_minute=10.0, max_thermal_pause_seconds=1200.0,
                                 battery_pause_percent=20.0, battery_min_seconds_left=600.0,
                                 max_battery_wait_seconds=1800.0, battery_thread_share=0.5,
                                 max_loss_seconds=900.0, interruption_seconds=8 * 3600.0),
    "extreme": SafetyThresholds("extreme", gpu_margin_c=2.0, cpu_limit_c=95.0,
                                cpu_throttle_events_per_minute=60.0, max_thermal_pause_seconds=1800.0,
                                battery_pause_percent=15.0, battery_min_seconds_left=300.0,
                                max_battery_wait_seconds=3600.0, battery_thread_share=0.75,
                                max_loss_seconds=300.0, interruption_seconds=2 * 3600.0),
}
DEFAULT_SAFETY_MODE = "balanced"  # a run config without `safety.mode`


def safety_thresholds(mode: str | None = None, **overrides) -> SafetyThresholds:
    """A mode's safety thresholds (balanced when mode is None), with the given fields replaced."""
    base = SAFETY[mode or DEFAULT_SAFETY_MODE]
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
