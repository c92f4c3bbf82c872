"""The one checkpoint-cadence rule: how much training to do between two checkpoints.

Used by the trainer's cadence policy (train/safety.py, with the measured checkpoint cost), by
`trainfit cloud --spot` and by `trainfit plan --flavor ID --spot` (with the estimated cost), so
the interval a ranking prices is the interval the run will use.

Young's optimum sqrt(2 C M) (Young 1974, "A first order approximation to the optimum checkpoint
interval"; C: one checkpoint's cost, M: mean time between interruptions that lose the in-memory
state) minimises checkpoint time + expected lost work. It is raised to C / overhead_max_share so
checkpointing costs at most that share of the run (3 %), and lowered to the mode's
max_loss_seconds, which is never exceeded: when both bounds cannot hold (a checkpoint slower than
3 % of max_loss), the maximum loss wins and the overhead is reported above target.

Interruptions from independent sources (the mode's assumed crash / OOM / power-loss rate, a spot
machine's reclaim rate) are Poisson processes whose rates add: 1/M = 1/M_a + 1/M_b
(`combined_interruption_seconds`). A spot figure therefore only ever shortens the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainfit.core.run.safety_thresholds import SafetyThresholds

# Before a checkpoint is timed, its cost is estimated from its size at this write speed: a
# 7200-rpm disk's sequential write (150-250 MB/s); SSDs write 2-20x faster, so the estimate errs
# towards a longer interval, and the mode's max_loss_seconds still bounds it.
ASSUMED_WRITE_BYTES_PER_SECOND = 200e6
# ... plus what a checkpoint costs whatever its size (a dozen files fsynced, the manifest's hashes,
# renames, rotation): 0.09 s measured for an 86k-parameter model on a 2-core VM with an SSD.
ASSUMED_CHECKPOINT_FIXED_SECONDS = 0.1
# AdamW keeps two fp32 moments per trainable parameter, saved with every checkpoint.
OPTIMIZER_BYTES_PER_TRAINABLE = 8


@dataclass(frozen=True)
class Cadence:
    interval_seconds: float
    overhead_share: float  # checkpoint time / training time between two checkpoints
    limited_by: str  # "young" (the optimum), "overhead" (3 % floor) or "max_loss" (the mode's bound)


def cadence_interval(cost_seconds: float, interruption_seconds: float, th: SafetyThresholds) -> Cadence:
    """The seconds of training between two checkpoints (module docstring: Young's optimum, the
    overhead floor and the mode's maximum loss)."""
    cost = max(cost_seconds, 0.0)
    young = math.sqrt(2.0 * cost * max(interruption_seconds, 0.0))
    floor = cost / th.overhead_max_share
    interval, limited_by = (young, "young") if young >= floor else (floor, "overhead")
    if interval > th.max_loss_seconds:
        interval, limited_by = th.max_loss_seconds, "max_loss"
    interval = max(interval, 1e-3)
    return Cadence(interval, cost / interval, limited_by)


def combined_interruption_seconds(*means_seconds: float | None) -> float:
    """Mean time between interruptions of independent Poisson sources (rates add); None and
    infinite means are ignored (a source that never interrupts)."""
    rate = sum(1.0 / m for m in means_seconds if m is not None and math.isfinite(m) and m > 0)
    return math.inf if rate == 0 else 1.0 / rate


def checkpoint_bytes(params_total: int, params_trainable: int, *, adapter_only: bool,
                     bytes_per_weight: float) -> int:
    """What one checkpoint writes: the saved weights (only the adapter for LoRA / QLoRA) plus
    AdamW's two fp32 moments per trainable parameter (train/safety.estimate_checkpoint_bytes
    counts the same from a live model)."""
    saved = params_trainable if adapter_only else params_total
    return int(saved * bytes_per_weight + OPTIMIZER_BYTES_PER_TRAINABLE * params_trainable)


def checkpoint_seconds(size_bytes: int, write_bytes_per_second: float = ASSUMED_WRITE_BYTES_PER_SECOND) -> float:
    """Estimated seconds to write a checkpoint of `size_bytes` (before one is measured)."""
    return ASSUMED_CHECKPOINT_FIXED_SECONDS + max(size_bytes, 0) / write_bytes_per_second
