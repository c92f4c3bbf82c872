"""Why a mode's setting is what it is: the reasons the plan prints under each mode, in the figures
the search compared."""

from __future__ import annotations

import dataclasses
import math

from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan import lengths, multinode
from trainfit.core.plan.engine import Budget, Candidate, SearchResult
from trainfit.core.plan.figures_text import cap_gib_text, count_text, gib_text
from trainfit.core.plan.hardware_rules import DeviceRules
from trainfit.core.plan.mode_search import LARGEST_BATCH_SLOWDOWN, predicted_speed_fn
from trainfit.core.plan.modes import SEQ_FLOOR, ModeTargets
from trainfit.core.plan.request import PlanRequest
from trainfit.core.plan.search_space import mode_seq_lens
from trainfit.core.setup import TrainingSetup
from trainfit.errors import BadInputError


def setting_reasons(model: ModelSpec, req: PlanRequest, t: ModeTargets, rules: DeviceRules, result: SearchResult,
                    best: Candidate, budget: Budget, cap: int | None) -> list[str]:
    from trainfit.core.memory import estimate_memory

    s = best.setup
    limit = budget.limit(cap)
    out = [rules.reasons["precision"] if s.precision != "fp32" or rules.half is None
           else f"fp32: the speed model finds 16-bit no faster here ({rules.label})"]
    method_label = result.tier or s.method
    if result.rejected:
        out.append(f"{method_label}: chosen because what is tried before it does not fit within {gib_text(limit)} "
                   f"({t.memory_share:.0%} of {cap_gib_text(cap)} usable): "
                   + "; ".join(f"{k} {v}" for k, v in result.rejected.items()))
    else:
        out.append(f"{method_label}: fits in {gib_text(best.memory.devices[0].needed_bytes)} of this mode's "
                   f"{gib_text(limit)} ({t.memory_share:.0%} of {cap_gib_text(cap)} usable)")
    fitting = result.fitting
    order = ("the largest micro-batch that fits" if s.method == "inference" else
             f"the largest micro-batch within {LARGEST_BATCH_SLOWDOWN - 1:.0%} of the fastest" if t.largest_micro_batch
             else "the fastest")
    out.append(f"micro-batch {s.micro_batch} x accumulation {s.grad_accum}"
               + (f" x {s.num_gpus} GPUs" if s.num_gpus > 1 else "")
               + f" = global batch {s.global_batch}: {order} of {len(fitting)} fitting settings")
    if s.grad_checkpointing != "none":
        without = [c for c in fitting if c.setup.grad_checkpointing == "none"]
        if not without:
            out.append("gradient checkpointing: no setting without it fits")
        else:
            out.append(checkpointing_reason(best, without[0]))
    if s.zero_stage or s.offload != "none":
        plain = dataclasses.replace(s, zero_stage=0, offload="none")
        try:
            need = estimate_memory(model, plain, req.hardware).devices[0].needed_bytes
            what = f"ZeRO-{s.zero_stage}" + (f" + {s.offload} offload to CPU" if s.offload != "none" else "")
            if need > limit:
                out.append(f"{what}: replicated on each GPU it needs {gib_text(need)}, {gib_text(limit)} available")
            else:
                out.append(f"{what}: predicted faster than plain data parallelism here")
        except BadInputError:
            pass
    if s.optimizer != "adamw":
        out.append(f"{s.optimizer}: 8-bit optimizer states (bitsandbytes) cut 12 B/param to ~6")
    if s.attention == "flash":
        out.append(rules.reasons["attention"])
    if s.lora is not None:
        targets = s.lora.target_modules if isinstance(s.lora.target_modules, str) else ",".join(s.lora.target_modules)
        out.append(f"LoRA rank {s.lora.rank}, alpha {s.lora.alpha} on {targets}")
    if rules.device == "cpu":
        out.append(rules.reasons["threads"])
    elif s.num_gpus > 1:
        out.append(_sharding_reason(rules, s))
        out.extend(multinode.sharding_reasons(model, s, req.hardware, limit, predicted_speed_fn(req, rules),
                                              step_time_factor=req.step_time_factor))
    if req.usd_per_hour is not None:
        out.append(f"cost at ${req.usd_per_hour:.2f}/h" + (f" against the ${req.budget_usd:g} budget"
                                                          if req.budget_usd is not None else ""))
    return out


def checkpointing_reason(best: Candidate, without: Candidate) -> str:
    """Why gradient checkpointing is on when a setting without it fits too: what it buys, in the
    figures the ranking compared (never "allows micro-batch 1 ... (micro-batch 1)")."""
    from trainfit.core.durations import duration_text

    s, w = best.setup, without.setup
    mine = best.speed.step_seconds if best.speed else math.nan
    theirs = without.speed.step_seconds if without.speed else math.nan
    steps = f"{duration_text(mine)} per step against {duration_text(theirs)}"
    if s.micro_batch > w.micro_batch:
        gain = ("predicted faster" if mine <= theirs else
                "kept by this mode's ranking (the largest micro-batch near the fastest)")
        return (f"gradient checkpointing: it allows micro-batch {s.micro_batch} where at most {w.micro_batch} fits "
                f"without it; {gain}: {steps}")
    if mine <= theirs:
        return (f"gradient checkpointing: predicted faster than the fastest setting without it "
                f"(micro-batch {w.micro_batch}, {w.seq_len} tokens): {steps}")
    return (f"gradient checkpointing: kept by this mode's ranking; the fastest setting without it "
            f"(micro-batch {w.micro_batch}) is predicted at {duration_text(theirs)} per step")


def _sharding_reason(rules: DeviceRules, s: TrainingSetup) -> str:
    """The interconnect and the sharding the chosen setting runs (the interconnect alone argues for none)."""
    chosen = (("FSDP hybrid sharding" if s.hybrid_shard else f"ZeRO-{s.zero_stage}") if s.zero_stage
              else "DDP (every GPU holds the whole model)")
    return f"{rules.reasons['sharding']}; the chosen setting runs {chosen}"


def shorter_seq_reasons(req: PlanRequest, t: ModeTargets, model: ModelSpec, s: TrainingSetup,
                        sized: lengths.DataLengths | None) -> list[str]:
    """Why the sequence is shorter than the mode's own, and (without a data size, whose line says it)
    what that cuts off at typical lengths."""
    own = mode_seq_lens(req, t, model)
    if req.seq_len is not None or s.seq_len >= min(own):
        return []
    cut = "what it truncates: see data" if sized is not None else lengths.truncation_at(req.dataset, s.method,
                                                                                           s.seq_len)
    return [f"seq {s.seq_len}: none of {t.mode}'s {' / '.join(map(str, own))} tokens fits, so shorter sequences "
            f"down to {SEQ_FLOOR} were tried; {cut}"]


def length_reasons(sized: lengths.DataLengths | None, s: TrainingSetup, packed: bool | None) -> list[str]:
    if sized is None:
        return []
    unit = "pairs" if s.method == "dpo" else "documents" if s.method == "pretrain" else "examples"
    rows = ("packed into full sequences" if packed or s.method == "pretrain"
            else f"not packed: steps are timed at the full {s.seq_len} tokens per sequence (an upper bound: the "
                 "collator pads to the longest row of each micro-batch)")
    return [f"data: {sized.rows:,} {unit} x {sized.mean_row_tokens:,.0f} tokens on average = "
            f"{count_text(sized.epoch_tokens)} tokens per epoch as trained, {rows}; "
            f"{lengths.truncation_text(sized, s.method)} ({sized.how})"]
