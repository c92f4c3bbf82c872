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
