"""What to watch in a mode's setting: the warnings the plan prints under each mode (time, cost,
power, memory pressure, host RAM, truncated examples), and the advice when nothing fits."""

from __future__ import annotations

import dataclasses

from trainfit.core.durations import hours_text
from trainfit.core.memory.overheads import under_pressure_text
from trainfit.core.memory.quant_formats import dense_experts_text, experts_left_dense
from trainfit.core.memory.stats import model_stats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan import lengths, space, variants
from trainfit.core.plan.engine import Candidate, SearchResult
from trainfit.core.plan.figures_text import gib_text
from trainfit.core.plan.hardware_rules import DeviceRules, power_cap_hint
from trainfit.core.plan.mode_search import search_model
from trainfit.core.plan.modes import SEQ_FLOOR, ModeTargets, shorter_seq_lens
from trainfit.core.plan.request import PlanRequest
from trainfit.core.plan.search_space import mode_seq_lens
from trainfit.core.run.power import PowerEstimate
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed.types import SpeedEstimate


# A sequence length that cuts off more than this share of the examples gets a warning.
TRUNCATION_WARNING_SHARE = 0.25


def setting_warnings(req: PlanRequest, t: ModeTargets, rules: DeviceRules, s: TrainingSetup, speed: SpeedEstimate,
                     power: PowerEstimate, hours: float | None, rental: float | None, best: Candidate,
                     limit: float) -> list[str]:
    out = []
    if hours is not None and hours > t.hours_max:
        frac = t.hours_max / hours
        out.append(f"the data asked for takes {hours_text(hours)}, over this mode's {hours_text(t.hours_max)}: at "
                   f"{speed.tokens_per_second:,.0f} tokens/s, {frac:.0%} of it fits the time")
    if rental is not None and req.budget_usd is not None and rental > req.budget_usd:
        out.append(f"cost ${rental:.2f} is over the ${req.budget_usd:g} budget: it buys "
                   f"{req.budget_usd / rental:.0%} of this run (fewer examples or epochs, or a cheaper machine: "
                   "trainfit cloud)")
    limit_w = power.gpu_limit_watts_each
    if power.gpu_count and limit_w:
        share = power.gpu_watts_each / limit_w
        low, high = t.tdp_share
        if share > high + 0.05:
            cap = int(limit_w * high)
            out.append(f"expected GPU draw {power.gpu_watts_each:.0f} W = {share:.0%} of its {limit_w:.0f} W limit, "
                       f"above {t.mode}'s {high:.0%}: {power_cap_hint(rules.device, cap)} (slower)")
    if t.mode == "extreme":
        out.append(f"extreme: {best.need_ratio * t.memory_share:.0%} of usable memory; a longer batch or a "
                   "memory spike can OOM. Watch temperatures and throttling (trainfit profile) on long runs")
        if power.gpu_count:
            out.append(f"sustained ~{power.total_watts:.0f} W for the whole run: check PSU headroom and cooling")
    out += _host_ram_warnings(req, t, s, best)
    pressed = next((d for d in best.memory.devices if d.fits_under_pressure), None)
    if pressed is not None:
        out.append(under_pressure_text(pressed))
    if rules.laptop and t.mode != "conservative":
        out.append(rules.reasons.get("thermal", "laptop GPU: thermal limits"))
    if req.hardware.power.on_ac is False:
        out.append("on battery: plug in before training")
    return out


def _host_ram_warnings(req: PlanRequest, t: ModeTargets, s: TrainingSetup, best: Candidate) -> list[str]:
    """The host's RAM (this machine's, the catalog machine's, or the rented flavor's): the search
    refuses a setting over it; one within it but over this mode's share of it is worth a word."""
    from trainfit.core.plan.host_ram import host_ram_need_bytes, ram_is_the_device

    usable = req.hardware.memory.usable_bytes
    if ram_is_the_device(s, req.hardware) or not usable:
        return []
    need = host_ram_need_bytes(best.memory, s, req.hardware)
    if need <= t.memory_share * usable:
        return []
    return [f"host RAM: the training process(es) hold {gib_text(need)} of the host's {gib_text(usable)} usable "
            f"({need / usable:.0%}), over {t.mode}'s {t.memory_share:.0%}: little is left for the data cache "
            "and other programs"]


def shorter_seq_advice(req: PlanRequest, t: ModeTargets, rules: DeviceRules, model: ModelSpec) -> list[str]:
    """Nothing fits: the longest shorter --seq-len that would (a user's --seq-len is kept, not
    overridden), or that even the floor does not."""
    if req.seq_len is None:
        tried = ([f"sequences down to {SEQ_FLOOR} tokens"]
                 if shorter_seq_lens(mode_seq_lens(req, t, model), model.max_position_embeddings) else [])
        if req.lora is None and space.attention_lora(model) is not None and \
                any(variants.uses_adapters(v) for v in variants.chain(req.method)):
            tried.append("LoRA on the attention projections only")
        return [f"also tried, and none fits: {' and '.join(tried)}"] if tried else []
    for seq in shorter_seq_lens([req.seq_len], model.max_position_embeddings):
        result = search_model(dataclasses.replace(req, seq_len=seq), t, rules, model)
        if result.best is not None:
            return [f"--seq-len {seq} fits ({result.tier} at {result.best.need_ratio:.0%} of this mode's budget); "
                    f"{lengths.truncation_at(req.dataset, result.best.setup.method, seq)}"]
    return [f"a shorter --seq-len does not fit either (tried down to {SEQ_FLOOR})"] if req.seq_len > SEQ_FLOOR else []


def truncation_warnings(sized: lengths.DataLengths | None, s: TrainingSetup) -> list[str]:
    if sized is None or sized.truncated_share < TRUNCATION_WARNING_SHARE:
        return []
    return [f"{lengths.truncation_text(sized, s.method)}: a longer --seq-len (more memory) or shorter examples "
            "keep them whole"]


def moe_quant_warning(req: PlanRequest, rules: DeviceRules, model: ModelSpec, result: SearchResult) -> list[str]:
    """Why QLoRA saves little on an MoE model here: transformers >= 5 fuses the experts into 3-D
    parameters, which bitsandbytes leaves 16-bit (core.memory.quant_formats.experts_left_dense)."""
    if not model.num_experts or not rules.quantization or req.method not in ("auto", "full", "qlora"):
        return []
    st = model_stats(model)
    probe = result.best.setup if result.best is not None else TrainingSetup(method="qlora", quant="nf4-dq")
    if probe.method != "qlora" or not experts_left_dense(st, probe):
        return []
    return [f"QLoRA quantises only {1 - st.experts / st.linear:.0%} of this MoE's linear weights: "
            + dense_experts_text(st)]
