"""The one search engine over TrainingSetups: enumerate, prune with the memory model, rank with
the speed model, keep the reasons.

A search is a list of tiers, tried in order; the first tier with a fitting setup wins, so a
policy expresses preferences that must not be traded for speed (keep the user's method; LoRA
before QLoRA; a longer context before a shorter one). Inside a tier, candidates come in chains
ordered by growing memory (usually the micro-batch ascending): the first setup of a chain that
does not fit ends that chain, which is what keeps an exhaustive search fast. The fitting
candidates of the winning tier are ranked by the policy's key (usually predicted step time).

Policies built on it: core.plan.nearest (estimate's "nearest setting that fits"),
core.plan.cloud_rank (fastest setting per cloud flavor) and core.plan.planner (the three modes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from trainfit.core.memory_types import MemoryEstimate
from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan.hardware_rules import DeviceRules, rules_for, unsupported
from trainfit.core.plan.host_ram import host_ram_ratio
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed.types import SpeedEstimate
from trainfit.errors import TrainfitError

MemoryFn = Callable[[ModelSpec, TrainingSetup, HardwareProfile], MemoryEstimate]
SpeedFn = Callable[[ModelSpec, TrainingSetup], SpeedEstimate]


@dataclass(frozen=True)
class Tier:
    label: str  # "full fine-tuning", "LoRA", "QLoRA", "seq 1024"
    chains: Sequence[Iterable[TrainingSetup]]  # each ordered by growing memory (may be lazy)


@dataclass(frozen=True)
class Candidate:
    setup: TrainingSetup
    memory: MemoryEstimate
    need_ratio: float  # worst device: predicted need / memory budget (<= 1 fits)
    speed: SpeedEstimate | None = None


@dataclass(frozen=True)
class SearchResult:
    best: Candidate | None
    tier: str | None  # label of the tier that won
    fitting: list[Candidate]  # every fitting candidate of that tier, best first
    evaluated: int  # setups whose memory was estimated
    smallest_need_ratio: float  # over everything tried (for "needs 1.4x the memory")
    rejected: dict[str, str] = field(default_factory=dict)  # tier label -> why nothing fitted
    skipped: dict[str, str] = field(default_factory=dict)  # reason -> example setting (hardware rules)


@dataclass(frozen=True)
class Budget:
    """Memory a search may use per device: capacity x share, or fixed bytes for every device."""

    share: float = 1.0
    bytes_override: int | None = None

    def limit(self, capacity_bytes: int | None) -> float:
        if self.bytes_override is not None:
            return self.bytes_override * self.share
        if capacity_bytes is None:
            return math.inf
        return capacity_bytes * self.share


def need_ratio(memory: MemoryEstimate, budget: Budget) -> float:
    """Worst device's need over its budget; offloaded CPU parts are checked against RAM. The need is
    what the fit verdict compares (DeviceMemory.needed_bytes), so a search and `estimate` agree."""
    worst = 0.0
    for dev in memory.devices:
        cap = dev.capacity_bytes
        if dev.device == "cpu" and len(memory.devices) > 1:
            limit = float(cap) if cap is not None else math.inf  # offload target: all usable RAM
        else:
            limit = budget.limit(cap)
        worst = max(worst, dev.needed_bytes / limit if limit else math.inf)
    return worst


def search(model: ModelSpec, hardware: HardwareProfile, tiers: Iterable[Tier], *,
           rank_key: Callable[[Candidate], tuple], budget: Budget = Budget(),
           memory_fn: MemoryFn | None = None, speed_fn: SpeedFn | None = None,
           rules: DeviceRules | None = None) -> SearchResult:
    """Try the tiers in order; return the best fitting candidate of the first tier that has one."""
    from trainfit.core.memory import estimate_memory
    from trainfit.core.speed import predict_step

    memory_fn = memory_fn or estimate_memory
    speed_fn = speed_fn or (lambda m, s: predict_step(m, s, hardware))
    rules = rules or rules_for(hardware)
    evaluated, smallest = 0, math.inf
    rejected: dict[str, str] = {}
    skipped: dict[str, str] = {}
    seen: set[TrainingSetup] = set()
    for tier in tiers:
        fitting: list[Candidate] = []
        tier_smallest = math.inf
        tier_skip = ""
        for chain in tier.chains:
            for setup in chain:
                if setup in seen:
                    continue
                seen.add(setup)
                why = unsupported(rules, setup)
                if why is not None:
                    skipped.setdefault(why, _short(setup))
                    tier_skip = tier_skip or why
                    continue
                try:
                    memory = memory_fn(model, setup, hardware)
                except TrainfitError as exc:  # a setting the model refuses (e.g. seq > positions)
                    skipped.setdefault(str(exc), _short(setup))
                    break
                evaluated += 1
                # The host's RAM too (model loading, offloaded states): the machine planned for, a
                # rented flavor's own RAM included (core.plan.host_ram).
                ratio = max(need_ratio(memory, budget), host_ram_ratio(memory, setup, hardware))
                tier_smallest = min(tier_smallest, ratio)
                if ratio > 1.0:
                    break  # the rest of the chain needs more memory still
                fitting.append(Candidate(setup, memory, ratio))
        smallest = min(smallest, tier_smallest)
        if fitting:
            timed = [Candidate(c.setup, c.memory, c.need_ratio, speed_fn(model, c.setup)) for c in fitting]
            timed.sort(key=rank_key)
            return SearchResult(timed[0], tier.label, timed, evaluated, smallest, rejected, skipped)
        rejected[tier.label] = ("needs {:.2f}x the memory budget at best".format(tier_smallest)
                                if math.isfinite(tier_smallest) else f"cannot run here: {tier_skip or 'no setting'}")
    return SearchResult(None, None, [], evaluated, smallest, rejected, skipped)


def _short(s: TrainingSetup) -> str:
    return f"{s.method} {s.precision} {s.optimizer} mb{s.micro_batch} seq{s.seq_len} {s.attention}"


def by_step_time(c: Candidate) -> tuple:
    """Rank key: fastest optimizer step (same global batch -> most tokens/s), then least memory."""
    return (c.speed.step_seconds if c.speed else math.inf, c.need_ratio)
