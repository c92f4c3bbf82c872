"""The three modes as data: the specification's targets (seeds/001 §3), each overridable.

conservative: learning and stability. <= 50 % of usable memory, micro-batch <= 8 with high
  accumulation, 512-1024 tokens, <= 2 h, < 40 % TDP, 10-15 tokens/parameter, 23-70M parameters.
balanced: production. <= 75 %, the throughput-optimal micro-batch (8-32 where it fits),
  1024-2048 tokens, 2-6 h, 60-80 % TDP, 20 tokens/parameter (Chinchilla), 70-200M parameters.
extreme: the largest that fits. <= 95 %, the largest micro-batch, 2048-4096 tokens, 6 h+,
  90-100 % TDP, >= 25 tokens/parameter, 200M-1B+ parameters, with thermal/power warnings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MODES = ("conservative", "balanced", "extreme")


@dataclass(frozen=True)
class ModeTargets:
    mode: str
    memory_share: float  # of the usable memory per device
    micro_batch_max: int
    seq_lens: tuple[int, ...]  # tried longest first (context is worth more than speed)
    hours_max: float  # run-time target (the mode's upper end)
    hours_min: float  # below this the mode is "shorter than it could be" (no warning, a note)
    tdp_share: tuple[float, float]  # expected power draw as a share of the TDP
    tokens_per_param: float  # pretraining token budget (Chinchilla ratio)
    params_range: tuple[int, int]  # pretraining model sizes the mode aims at
    global_batch: int  # effective batch when the user gives none
    largest_micro_batch: bool  # extreme: the largest micro-batch within 10 % of the fastest, else the fastest
    offload: bool  # may fall back to CPU offload before changing method


DEFAULTS = {
    "conservative": ModeTargets("conservative", 0.50, 8, (1024, 512), 2.0, 0.5, (0.0, 0.40), 12.0,
                                (23_000_000, 70_000_000), 16, False, True),
    "balanced": ModeTargets("balanced", 0.75, 32, (2048, 1024), 6.0, 2.0, (0.60, 0.80), 20.0,
                            (70_000_000, 200_000_000), 32, False, True),
    "extreme": ModeTargets("extreme", 0.95, 128, (4096, 2048), 24.0, 6.0, (0.90, 1.00), 25.0,
                           (200_000_000, 1_000_000_000_000), 64, True, True),
}


# When none of a mode's sequence lengths fits, the search halves the sequence down to this floor
# before it gives up (the plan then says what the shorter sequence truncates). Below 512 tokens a
# typical chat conversation (~780 tokens, data/typical_lengths.yaml) is cut in most examples: about
# half of them are already cut at 512 (log-normal spread), so shorter is a different dataset, not a
# smaller setting.
SEQ_FLOOR = 512


def shorter_seq_lens(mode_seq_lens: tuple[int, ...] | list[int], max_positions: int) -> list[int]:
    """The fallback sequence lengths below a mode's own: halving from its shortest down to SEQ_FLOOR."""
    out, seq = [], min(min(mode_seq_lens), max_positions) // 2
    while seq >= SEQ_FLOOR:
        out.append(seq)
        seq //= 2
    return out


def targets(mode: str, **overrides) -> ModeTargets:
    """A mode's targets with the given fields replaced (None values are ignored)."""
    base = DEFAULTS[mode]
    given = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(base, **given)


# ---------------------------------------------------------------------------------------------
# Safety policies of `trainfit train` (seeds/001 §8: thermal protection, power management,
# checkpoint frequency from the run-time estimate), per mode. Used by trainfit.train.safety.
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
