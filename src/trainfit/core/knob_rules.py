"""The one table of refused knob combinations. Each rule returns Refusals, (field, reason, fix);
each front end words the fields its own way: the command line by flag (`--fsdp-no-sync`), the run
config by key (`fsdp_no_sync`, the message led by `training.fsdp_no_sync:`).

A rule belongs to the front ends it applies to:
* "model": what the memory and speed models refuse (estimate, plan, cloud, and every caller of
  trainfit.core.memory.estimate_memory): combinations no real tool runs, each with the one to use.
* "run": what `trainfit train` cannot run from a run config (its trainer has no such mode yet).
A rule in both is one rule: the same condition and substance, worded per front end
(tests/memory/test_knob_table.py checks it).

Decisions:
* Offload without ZeRO (`--offload optimizer`, ZeRO stage 0): DeepSpeed's ZeRO-Offload needs stage
  >= 1 (offload_optimizer is a zero_optimization key), so this is no mode of any tool. What people
  mean is one of three things, and the message names all three: DeepSpeed ZeRO-Offload, FSDP CPU
  offload, or a paged optimizer (states in unified memory that the driver pages to CPU RAM).
* FSDP's CPUOffload has one switch, offload_params, which moves parameters, gradients and the
  optimizer step together: offloading the optimizer alone is refused under FSDP; it is allowed with
  FULL_SHARD (what practitioners pair it with; SHARD_GRAD_OP keeps the gathered parameters on the
  GPU anyway). A run config's no-shard is DDP's memory and speed: trainfit runs DDP for it.
* Optimizer in backward (torchtune optimizer_in_bwd): steps each parameter as its gradient
  appears, so there is no accumulated gradient to keep (grad_accum must be 1) and no global norm
  to clip; modelled on one GPU without a sharding engine, as torchtune's single-device recipe runs
  it. The Hugging Face Trainer steps after backward, so `trainfit train` cannot run it.
* The runtime knobs (trainfit.core.knobs level "runtime") describe another tool's runtime;
  `trainfit train` runs its own, so a run config refuses them when set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from trainfit.core.knobs import RUNTIME_KNOBS, flag_of, key_of
from trainfit.core.runtime import BNB_QUANTS, LM_HEAD_QUANTS, PEFT_PREPARED_QUANTS, SHARDED_STRATEGIES
from trainfit.core.setup import FSDP_EQUIVALENT_STAGE, PREQUANTISED
from trainfit.errors import BadInputError

Front = Literal["model", "run"]
GPU_DEVICES = ("cuda", "rocm", "xpu")
MAX_IMAGE_SIZE = 1 << 16
MAX_IMAGES = 1024


@dataclass(frozen=True)
class Refusal:
    rule: str
    field: str  # the knob (TrainingSetup field, or a run-config key path for run-only keys)
    reason: str
    fix: str
    sep: str = ": "

    def cli_text(self) -> str:
        return f"{self.reason}{self.sep}{self.fix}"

    def config_text(self) -> str:
        where = self.field if "." in self.field else key_of(self.field)
        return f"{where}: {self.reason}{self.sep}{self.fix}"


@dataclass(frozen=True)
class Context:
    front: Front
    model: Any = None  # ModelSpec, for the rules about the model (vision tower)
    run_config: Any = None  # RunConfig, for the run-only rules

    def w(self, name: str) -> str:
        """A knob as this front end words it."""
        return flag_of(name) if self.front == "model" else name


@dataclass(frozen=True)
class Rule:
    id: str
    fronts: tuple[Front, ...]
    check: Callable[[Any, Context], list[tuple]]  # -> [(field, reason, fix[, sep])]


RULES: list[Rule] = []


def rule(rule_id: str, *fronts: Front):
    def register(fn):
        RULES.append(Rule(rule_id, fronts, fn))
        return fn
    return register


def refusals(s, ctx: Context) -> list[Refusal]:
    """Every refusal of the rules of ctx.front for the setup `s` (a TrainingSetup; for a run config,
    its training section with the config's method)."""
    out = []
    for r in RULES:
        if ctx.front in r.fronts:
            out += [Refusal(r.id, *found) for found in r.check(s, ctx)]
    return out


def _on_fsdp(s, ctx: Context) -> bool:
    """FSDP rules: a run config's no-shard has its own refusal (trainfit runs DDP for it)."""
    return s.fsdp_strategy != "none" and not (ctx.front == "run" and s.fsdp_strategy == "no-shard")


# -- sharding and offload ---------------------------------------------------------------------------
@rule("offload-needs-zero", "model", "run")
def _offload_without_zero(s, ctx):
    under_fsdp = ctx.run_config is not None and ctx.run_config.distributed.strategy == "fsdp"
    if s.fsdp_strategy != "none" or s.offload == "none" or s.zero_stage != 0 or under_fsdp:
        return []
    if ctx.front == "model":
        return [("offload", f"--offload {s.offload} with --zero 0 is not a mode of any tool (DeepSpeed ZeRO-Offload "
                 "needs stage >= 1)", "Use --zero 2 --offload optimizer (DeepSpeed ZeRO-Offload, one GPU or more), "
                 "--fsdp full-shard --offload optimizer+params (FSDP CPU offload), or --optimizer paged-adamw-8bit / "
                 "paged-adamw-32bit (optimizer states paged to CPU RAM under memory pressure, no sharding engine) "
                 "with --offload none", ". ")]
    return [("offload", f"{s.offload} with zero_stage 0 is not a mode of any tool (DeepSpeed ZeRO-Offload needs "
             "zero_stage >= 1)", "use distributed.strategy deepspeed with zero_stage 2 (3 for optimizer+params), or "
             "distributed.strategy fsdp with fsdp_strategy full-shard, zero_stage 3 and offload optimizer+params, or a "
             "paged optimizer (optimizer: paged-adamw-8bit / paged-adamw-32bit) with offload: none")]


@rule("fsdp-runs-under-strategy-fsdp", "run")
def _fsdp_strategy(s, ctx):
    strategy = ctx.run_config.distributed.strategy
    if not _on_fsdp(s, ctx) or strategy == "fsdp":
        return []
    return [("fsdp_strategy", f"{s.fsdp_strategy} runs under distributed.strategy fsdp (got {strategy})",
             "set distributed.strategy: fsdp", "; ")]


@rule("fsdp-no-shard-is-ddp", "run")
def _no_shard(s, ctx):
    if s.fsdp_strategy != "no-shard":
        return []
    return [("fsdp_strategy", "no-shard replicates every state like DDP; trainfit train runs DDP for that",
             "remove fsdp_strategy (with distributed.strategy ddp or auto)")]


@rule("fsdp-replaces-zero", "model", "run")
def _fsdp_stage(s, ctx):
    stage = FSDP_EQUIVALENT_STAGE.get(s.fsdp_strategy, 0)
    if not _on_fsdp(s, ctx) or s.zero_stage == stage:
        return []
    if ctx.front == "model":
        return [("zero_stage", f"--fsdp {s.fsdp_strategy} shards like ZeRO-{stage}, not --zero {s.zero_stage}",
                 "FSDP replaces DeepSpeed, drop --zero")]
    return [("zero_stage", f"fsdp_strategy {s.fsdp_strategy} shards like ZeRO-{stage}",
             f"set zero_stage: {stage} (got {s.zero_stage})", "; ")]


@rule("fsdp-needs-gpus", "model")
def _fsdp_gpus(s, ctx):
    if s.fsdp_strategy == "none" or s.device in GPU_DEVICES:
        return []
    return [("fsdp_strategy", "--fsdp needs GPUs (NCCL/RCCL)", f"device {s.device!r} does not support it", "; ")]


@rule("fsdp-trains", "model")
def _fsdp_inference(s, ctx):
    if s.fsdp_strategy == "none" or s.method != "inference":
        return []
    return [("fsdp_strategy", "--fsdp applies to training", "inference has no optimizer or gradients to shard",
             "; ")]


@rule("fsdp-offloads-all-or-nothing", "model", "run")
def _fsdp_offload(s, ctx):
    if not _on_fsdp(s, ctx):
        return []
    w = ctx.w
    if s.offload == "optimizer":
        alone = ("DeepSpeed --zero 2 --offload optimizer" if ctx.front == "model"
                 else "distributed.strategy deepspeed")
        lead = "--fsdp: " if ctx.front == "model" else ""
        return [("offload", f"{lead}FSDP's CPU offload moves parameters, gradients and optimizer states together",
                 f"use {w('offload')}{' ' if ctx.front == 'model' else ': '}optimizer+params (or {alone} to offload "
                 "the optimizer alone)", ": " if ctx.front == "model" else "; ")]
    if s.offload == "optimizer+params" and s.fsdp_strategy != "full-shard":
        if ctx.front == "model":
            return [("offload", f"--offload optimizer+params with --fsdp {s.fsdp_strategy}", "FSDP CPU offload is run "
                     "with --fsdp full-shard (the sharded parameters are what moves to the CPU)")]
        return [("offload", "FSDP CPU offload runs with fsdp_strategy full-shard", "", "")]
    return []


@rule("fsdp-one-gpu-shards-nothing", "model")
def _fsdp_one_gpu(s, ctx):
    if s.fsdp_strategy not in SHARDED_STRATEGIES or s.num_gpus != 1 or s.offload != "none":
        return []
    return [("fsdp_strategy", f"--fsdp {s.fsdp_strategy} on one GPU shards nothing",
             "use --gpus >= 2, or --fsdp full-shard --offload optimizer+params")]


@rule("hybrid-needs-full-shard", "model")
def _hybrid(s, ctx):
    if not s.hybrid_shard or s.fsdp_strategy in ("none", "full-shard"):
        return []
    return [("hybrid_shard", "hybrid sharding (HYBRID_SHARD) is full-shard inside each node",
             "use --fsdp full-shard")]


@rule("activation-offload-trains", "model")
def _act_offload_inference(s, ctx):
    if not s.activation_offload or s.method != "inference":
        return []
    return [("activation_offload", "--activation-offload moves activations saved for backward",
             "inference saves none")]


@rule("activation-offload-needs-gpu", "model", "run")
def _act_offload_gpu(s, ctx):
    if not s.activation_offload or s.device in (*GPU_DEVICES, "auto") or s.method == "inference":
        return []
    return [("activation_offload", f"{ctx.w('activation_offload')} moves saved activations from a GPU to pinned CPU "
             "memory", f"device {s.device!r} has no separate memory to offload from", "; ")]


@rule("activation-offload-needs-trl", "run")
def _act_offload_pretrain(s, ctx):
    if not s.activation_offload or s.method != "pretrain":
        return []
    return [("activation_offload", "method pretrain trains with TrainingArguments, which has no activation "
             "offloading (TRL's SFTConfig/DPOConfig do)", "remove it, or use grad_checkpointing", "; ")]


# -- optimizer in backward --------------------------------------------------------------------------
@rule("in-backward-trains", "model")
def _in_backward_inference(s, ctx):
    if not s.optimizer_in_backward or s.method != "inference":
        return []
    return [("optimizer_in_backward", "--optimizer-in-backward applies to training", "not inference", ", ")]


@rule("in-backward-not-run", "run")
def _in_backward_run(s, ctx):
    if not s.optimizer_in_backward:
        return []
    return [("optimizer_in_backward", "trainfit train cannot run it (the Hugging Face Trainer steps the optimizer "
             "after backward)", "`trainfit estimate --optimizer-in-backward` models it; remove it", "; ")]


@rule("in-backward-no-accumulation", "model", "run")
def _in_backward_accum(s, ctx):
    if not s.optimizer_in_backward or s.grad_accum <= 1:
        return []
    w = ctx.w
    return [("grad_accum", f"{w('optimizer_in_backward')} steps each parameter as soon as its gradient exists, so "
             "gradients cannot accumulate over micro-batches", f"use {w('grad_accum')} 1 (got {s.grad_accum}), or "
             f"drop {w('optimizer_in_backward')}")]


@rule("in-backward-no-clipping", "run")
def _in_backward_clip(s, ctx):
    if not s.optimizer_in_backward or ctx.run_config.schedule.max_grad_norm <= 0:
        return []
    return [("schedule.max_grad_norm", "optimizer_in_backward steps each parameter before the others' gradients "
             "exist, so there is no global norm to clip", "set max_grad_norm: 0", "; ")]


@rule("in-backward-one-gpu", "model")
def _in_backward_one_gpu(s, ctx):
    if not s.optimizer_in_backward:
        return []
    if not (s.zero_stage or s.fsdp_strategy != "none" or s.offload != "none" or s.num_gpus > 1):
        return []
    return [("optimizer_in_backward", "--optimizer-in-backward is modelled on one GPU without a sharding engine "
             "(torchtune's single-device recipe)", "drop --zero/--fsdp/--offload and use --gpus 1")]


# -- the runtime knobs (how another tool runs: trainfit.core.runtime) ---------------------------------
@rule("runtime-knob-not-run", "run")
def _runtime_not_run(s, ctx):
    out = []
    for knob in RUNTIME_KNOBS:
        value = getattr(s, knob.name, knob.default)
        if value != knob.default:
            out.append((knob.name, "describes how another tool's runtime behaves; trainfit train runs its own",
                        f"remove it (`trainfit estimate --runtime {knob.name}=...` models it)", "; "))
    return out


@rule("optimizer-impl-is-adamw", "model")
def _optimizer_impl(s, ctx):
    if s.optimizer_impl == "auto" or s.optimizer == "adamw":
        return []
    return [("optimizer_impl", f"--optimizer-impl {s.optimizer_impl} chooses how torch's AdamW steps; --optimizer "
             f"{s.optimizer} has its own kernel", "drop --optimizer-impl or use --optimizer adamw")]


@rule("bnb-version-is-4bit", "model")
def _bnb_version(s, ctx):
    if not s.bnb_keeps_input or s.quant in BNB_QUANTS:
        return []
    return [("bitsandbytes_version", "--bitsandbytes-version describes the 4-bit (nf4 / nf4-dq) matmul; --quant "
             f"{s.quant} does not use it", "drop the flag or use --quant nf4")]


@rule("mixed-units-need-fsdp-lora", "model")
def _mixed_units(s, ctx):
    if not s.fsdp_mixed_units:
        return []
    out = []
    if s.fsdp_strategy not in SHARDED_STRATEGIES:
        out.append(("fsdp_mixed_units", "--fsdp-mixed-units describes FSDP's wrapped units",
                    "use it with --fsdp full-shard or shard-grad-op"))
    if s.lora is None and s.method not in ("lora", "qlora"):
        out.append(("fsdp_mixed_units", "--fsdp-mixed-units is about frozen weights sharing a unit with LoRA "
                    "adapters", "it needs --method lora (full training has no frozen weights)"))
    if s.quant != "none":
        out.append(("fsdp_mixed_units", f"--fsdp-mixed-units with --quant {s.quant}: quantised weights take no "
                    "gradient and are wrapped apart from the adapters", "drop one of the two", "; "))
    return out


@rule("no-sync-needs-sharded-accumulation", "model")
def _no_sync(s, ctx):
    if not s.fsdp_no_sync:
        return []
    w, out = ctx.w, []
    if s.fsdp_strategy not in SHARDED_STRATEGIES:
        out.append(("fsdp_no_sync", f"{w('fsdp_no_sync')} describes FSDP's sharded gradients", f"use it with "
                    f"{w('fsdp_strategy')} full-shard or shard-grad-op (DDP and NO_SHARD keep whole gradients "
                    "either way)"))
    if s.grad_accum == 1:
        out.append(("fsdp_no_sync", f"{w('fsdp_no_sync')} only acts between accumulated micro-batches",
                    f"use it with {w('grad_accum')} 2 or more, or drop it"))
    return out


@rule("bnb-runtime-knobs-need-bnb-quant", "model")
def _bnb_knobs(s, ctx):
    out = []
    if s.kbit_upcast and s.quant not in PEFT_PREPARED_QUANTS:
        out.append(("kbit_upcast", "--kbit-upcast describes PEFT's preparation of a bitsandbytes base (--quant nf4, "
                    f"nf4-dq or int8); --quant {s.quant} is not one", "drop --kbit-upcast"))
    if s.quantize_lm_head and s.quant not in LM_HEAD_QUANTS:
        out.append(("quantize_lm_head", "--quantize-lm-head quantises the output layer with bitsandbytes (--quant "
                    f"nf4, nf4-dq or int8); --quant {s.quant} is not one", "drop --quantize-lm-head"))
    if s.bnb_fp16_quant_state and s.quant not in BNB_QUANTS:
        out.append(("bnb_fp16_quant_state", "--bnb-fp16-quant-state describes bitsandbytes' 4-bit weights (--quant "
                    f"nf4 or nf4-dq); --quant {s.quant} is not one", "drop the flag"))
    return out


@rule("autocast-needs-16bit-weights", "model")
def _autocast(s, ctx):
    if not s.autocast_16bit_weights or s.precision in ("bf16", "fp16"):
        return []
    return [("autocast_16bit_weights", "--autocast-16bit-weights describes a 16-bit model (--precision bf16 or "
             f"fp16) run under autocast; --precision {s.precision} is not one", "drop the flag")]


# -- loss kernel, DoRA, pre-quantised bases, images ---------------------------------------------------
@rule("loss-kernel-is-causal-lm", "model")
def _loss_method(s, ctx):
    if s.loss == "standard" or s.method not in ("dpo", "inference"):
        return []
    return [("loss", f"--loss {s.loss} replaces the causal-LM cross-entropy of pretrain, full, lora and qlora; "
             f"method {s.method} has none (valid here: standard)", "", "")]


@rule("loss-kernel-not-run", "run")
def _loss_run(s, ctx):
    if s.loss == "standard":
        return []
    extra = " (it needs the liger-kernel package and a CUDA GPU)" if s.loss == "fused" else ""
    return [("loss", f"{s.loss!r} cross-entropy is modelled by trainfit estimate/plan but trainfit train does not "
             f"run it yet{extra}", "use loss: standard", "; ")]


@rule("prequantised-not-run", "run")
def _prequantised_run(s, ctx):
    if s.quant not in PREQUANTISED:
        return []
    return [("quant", f"{s.quant!r} loads a pre-quantised {s.quant.upper()} checkpoint, which trainfit train does "
             "not load yet (estimate/plan model it)", "use nf4-dq or int8, quantised by bitsandbytes while loading",
             "; ")]


@rule("dora-is-lora", "model", "run")
def _dora_lora(s, ctx):
    if not s.dora or s.trains_adapters:
        return []
    if ctx.front == "model":
        return [("dora", "--dora is a LoRA variant", f"use --method lora or qlora (or dpo with LoRA flags), not "
                 f"{s.method}")]
    return [("dora", "DoRA is a LoRA variant", f"use method lora or qlora (or dpo with training.lora), not "
             f"{s.method}", "; ")]


@rule("dora-not-prequantised", "model")
def _dora_prequantised(s, ctx):
    if not s.dora or s.quant not in PREQUANTISED:
        return []
    return [("dora", f"--dora with --quant {s.quant}: PEFT's {s.quant.upper()} LoRA layers do not support DoRA",
             "use --quant nf4, nf4-dq or int8 for QDoRA, or drop --dora", " (")]


@rule("images-in-range", "model")
def _image_bounds(s, ctx):
    out = []
    for name, value, high in (("image_size", s.image_size, MAX_IMAGE_SIZE),
                              ("images_per_example", s.images_per_example, MAX_IMAGES)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            out.append((name, f"{ctx.w(name)} must be an integer from 0 to {high}", f"got {value!r}", ", "))
    return out


@rule("images-need-vision-model", "model")
def _image_model(s, ctx):
    model = ctx.model
    if model is None or not (s.image_size or s.images_per_example):
        return []
    if model.vision is None:
        return [("image_size", f"--image-size / --images-per-example: {model.id} has no vision tower", "they apply "
                 "to vision-language models such as qwen2-vl-2b", " (")]
    if s.image_size and not model.capabilities.vision_tower:
        return [("image_size", f"--image-size: only Qwen2-VL's dynamic resolution is modelled; for {model.id} leave "
                 "it out (its default tokens per image are used)", "", "")]
    return []


@rule("image-size-needs-images", "model")
def _image_count(s, ctx):
    if not s.image_size or s.images_per_example:
        return []
    return [("images_per_example", "--image-size needs --images-per-example >= 1", "", "")]


@rule("images-not-run", "run")
def _images_run(s, ctx):
    if not (s.image_size or s.images_per_example):
        return []
    return [("training.image_size / training.images_per_example", "trainfit train has no image data pipeline yet "
             "(estimate/plan model the image tokens)", "remove them", "; ")]


@rule("inference-not-run", "run")
def _generate_run(s, ctx):
    if not s.generate_tokens:
        return []
    return [("generate_tokens", "a run config trains; generation is inference", "remove it (`trainfit estimate "
             "--method inference --generate N` models it)", "; ")]


# -- the front ends ---------------------------------------------------------------------------------
def _close(refusal: Refusal) -> str:
    """A fix opened with ' (' is a parenthesis: close it."""
    text = refusal.cli_text()
    return text + ")" if refusal.sep == " (" else text


def knob_problems(setup, model=None) -> list[str]:
    """The command line's wording of every refused combination in `setup` (with `model`: the rules
    about the model too)."""
    return [_close(r) for r in refusals(setup, Context("model", model=model))]


def check_knobs(setup, model=None) -> None:
    """BadInputError listing every refused knob combination; nothing when the setup is valid."""
    problems = knob_problems(setup, model)
    if problems:
        raise BadInputError("; ".join(problems))


def run_config_problems(cfg) -> list[str]:
    """The run config's wording of every refusal of its training section (key paths)."""
    import dataclasses

    view = dataclasses.replace(cfg.training, method=cfg.method)
    out = []
    for r in refusals(view, Context("run", run_config=cfg)):
        text = r.config_text()
        out.append(text + ")" if r.sep == " (" else text)
    return out
