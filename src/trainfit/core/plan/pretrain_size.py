"""Pretraining from scratch: the planner chooses the size, the largest shape of a ladder whose
Chinchilla budget (C ~ 6 N D, D = the mode's tokens per parameter x N) trains within the mode's time."""

from __future__ import annotations

import dataclasses
import functools

from trainfit.core.durations import hours_text
from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan.engine import Candidate
from trainfit.core.plan.figures_text import count_text
from trainfit.core.plan.hardware_rules import DeviceRules
from trainfit.core.plan.mode_plan import plan_model
from trainfit.core.plan.mode_search import search_model
from trainfit.core.plan.modes import DEFAULTS, ModeTargets
from trainfit.core.plan.request import PlanRequest
from trainfit.core.plan.results import ModePlan
from trainfit.core.speed.types import Workload


# Pretraining sizes the planner tries (parameters), smallest first.
PRETRAIN_LADDER = (1_000_000, 2_000_000, 3_000_000, 5_000_000, 10_000_000, 15_000_000, 23_000_000, 35_000_000, 50_000_000, 70_000_000,
                   100_000_000, 125_000_000, 160_000_000, 200_000_000, 350_000_000, 500_000_000, 760_000_000,
                   1_000_000_000, 1_500_000_000, 3_000_000_000, 7_000_000_000, 13_000_000_000)


@functools.lru_cache(maxsize=256)
def shape_for_params(label: str, vocab_size: int, max_positions: int) -> ModelSpec:
    """core.models.shapes.shape_for_params, remembered: every mode walks the same ladder."""
    from trainfit.core.models.shapes import shape_for_params as shape

    return shape(label, vocab_size=vocab_size, max_positions=max_positions)


def plan_pretrain(req: PlanRequest, t: ModeTargets, rules: DeviceRules) -> ModePlan:
    lo, hi = t.params_range
    # One position table for every mode (RoPE shapes do not grow with it), so shapes are shared.
    max_pos = max(req.seq_len or 0, *DEFAULTS["extreme"].seq_lens)
    tried = _walk_ladder(req, t, rules, max_pos)
    if not tried:
        spec = shape_for_params(count_text(PRETRAIN_LADDER[0]).lower(), req.vocab_size, max_pos)
        return plan_model(dataclasses.replace(req, method="pretrain"), t, rules, spec)
    in_time = [x for x in tried if x[3] is not None and x[3] <= t.hours_max]
    in_range_in_time = [x for x in in_time if lo <= x[0] <= hi]
    reasons, warnings = [], []
    if in_range_in_time:
        pick = in_range_in_time[-1]
        reasons.append(f"size: {count_text(pick[0])} parameters, the largest of {_range(lo, hi)} whose "
                       f"{t.tokens_per_param:g} tokens/parameter train within {hours_text(t.hours_max)}")
    elif in_time:
        pick = in_time[-1]
        smallest = next((x for x in tried if x[0] >= lo), None)
        reasons.append(f"size: {count_text(pick[0])} parameters, the largest that trains "
                       f"{t.tokens_per_param:g} tokens/parameter within {hours_text(t.hours_max)} here")
        if smallest is not None and smallest[3] is not None:
            warnings.append(f"{t.mode} aims at {_range(lo, hi)} parameters within {hours_text(t.hours_max)}; "
                            f"{count_text(smallest[0])} needs {count_text(smallest[4])} tokens = {hours_text(smallest[3])} on "
                            f"this hardware, so the plan is {count_text(pick[0])} instead")
        elif pick[0] < lo:
            warnings.append(f"{t.mode} aims at {_range(lo, hi)} parameters; "
                            f"{count_text(tried[-1][0] if tried else lo)} is the largest that fits the memory budget")
    else:
        pick = tried[0]
        reasons.append(f"size: {count_text(pick[0])}, the smallest shape tried")
        warnings.append(f"even {count_text(pick[0])} parameters x {t.tokens_per_param:g} tokens/parameter takes "
                        f"{hours_text(pick[3])} here, over this mode's {hours_text(t.hours_max)}")
        target = next((x for x in tried if x[0] >= lo), None)
        if target is not None and target[3] is not None:
            warnings.append(f"{t.mode} aims at {_range(lo, hi)} parameters: {count_text(target[0])} would need "
                            f"{hours_text(target[3])} on this hardware")
    n, spec, result, hours, tokens = pick
    if req.dataset_tokens is not None and req.dataset_tokens < tokens:
        warnings.append(f"the dataset has {count_text(req.dataset_tokens)} tokens: the {count_text(tokens)}-token budget "
                        f"repeats it {tokens / req.dataset_tokens:.1f} times (beyond ~4 epochs repeats add little)")
    info = {"params": n, "params_exact": result.best.memory.params_total if result.best else None,
            "tokens": tokens, "tokens_per_param": t.tokens_per_param,
            "flops": 6 * n * tokens, "shape": {"layers": spec.num_layers, "hidden": spec.hidden_size,
                                               "heads": spec.num_heads, "kv_heads": spec.num_kv_heads}}
    reasons.append(f"token budget: {t.tokens_per_param:g} x {count_text(n)} = {count_text(tokens)} tokens, "
                   f"C = 6ND = {6 * n * tokens:.2e} FLOPs")
    return plan_model(dataclasses.replace(req, method="pretrain"), t, rules, spec, result, tokens, info,
                      reasons, warnings)


LadderEntry = tuple  # (params, spec, SearchResult, hours | None, tokens)


def _walk_ladder(req: PlanRequest, t: ModeTargets, rules: DeviceRules, max_pos: int) -> list[LadderEntry]:
    """The ladder sizes searched for this mode, smallest first (those that fit the memory).

    Fitting the memory and training within the mode's hours both only get harder as the size
    grows, so the largest size that does both is found by bisection (a few searches instead of
    one per rung): first inside the mode's range, else below it. The smallest size of the range
    is always searched (its hours explain a smaller plan), and so is the largest that fits when
    nothing in the range does."""
    entries: dict[int, LadderEntry | None] = {}

    def entry(i: int) -> LadderEntry | None:
        if i not in entries:
            n = PRETRAIN_LADDER[i]
            spec = shape_for_params(count_text(n).lower(), req.vocab_size, max_pos)
            tokens = int(t.tokens_per_param * n)
            result = search_model(dataclasses.replace(req, method="pretrain"), t, rules, spec)
            entries[i] = None if result.best is None else (n, spec, result, _hours(result.best, tokens), tokens)
        return entries[i]

    def fits(i: int) -> bool:
        return entry(i) is not None

    def in_time(i: int) -> bool:
        e = entry(i)
        return e is not None and e[3] is not None and e[3] <= t.hours_max

    def largest(test, first: int, last: int) -> int | None:
        """The largest index in [first, last] passing `test` (true up to some index, then false)."""
        found = None
        while first <= last:
            mid = (first + last) // 2
            if test(mid):
                found, first = mid, mid + 1
            else:
                last = mid - 1
        return found

    top = len(PRETRAIN_LADDER) - 1
    start = next((i for i, n in enumerate(PRETRAIN_LADDER) if n >= t.params_range[0]), top)
    end = max((i for i, n in enumerate(PRETRAIN_LADDER) if n <= t.params_range[1]), default=start)
    if in_time(start):
        largest(in_time, start, max(start, end))
    else:
        below = largest(in_time, 0, start - 1)
        fits(0)  # the smallest size is the plan when none trains in time
        if not fits(start):
            largest(fits, below if below is not None else 0, start - 1)
    return [e for _, e in sorted(entries.items()) if e is not None]


def _hours(best: Candidate, tokens: int) -> float | None:
    """Run time of `tokens` at the step time the search predicted for `best` (no second prediction)."""
    from trainfit.core.speed.predict import with_workload

    if best.speed is None:
        return None
    return with_workload(best.speed, best.setup, Workload(dataset_tokens=tokens)).total_seconds / 3600


def _range(lo: int, hi: int) -> str:
    return f"{count_text(lo)}+" if hi >= PRETRAIN_LADDER[-1] else f"{count_text(lo)}-{count_text(hi)}"
