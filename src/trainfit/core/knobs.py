"""The one declared table of user knobs: each knob once, with its type, bounds or choices, default,
help, command-line flag, run-config key, the front ends that show it and how prominent it is.

Generated from it: the knob flags of `estimate` (and those `plan` / `cloud` share,
trainfit.cli.knob_flags), `--runtime KEY=VALUE`, the bounds the run config checks its training keys
against (trainfit.validate.BOUNDS), the JSON schema (`trainfit estimate --schema`) and the knob
tables of `--help-all` and the README (tests/memory/test_knob_table.py checks the README's).
Refusals of knob combinations are one table too (trainfit.core.knob_rules).

Adding a knob: a TrainingSetup field (core/setup.py), one `Knob(...)` row here, and the memory /
speed model that reads the field. Nothing else.

Levels: "everyday" knobs are in `estimate --help`; "advanced" ones are flags shown by `--help-all`;
"runtime" knobs describe how another tool's runtime behaves where tools differ (the
framework-emulation knobs, trainfit.core.runtime): `--runtime KEY=VALUE` and
`--help-all`; their old flags still parse, hidden.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Any, Literal

from trainfit.bounds import Bound
from trainfit.core import setup as _setup

Kind = Literal["int", "float", "bool", "choice", "text", "list"]
Level = Literal["everyday", "advanced", "runtime"]
FRONTS = ("estimate", "plan", "cloud", "run_config")
# A version as users write it: 4.44, 4.44.0, 0.43.2.dev0 (PEP 440's leading release numbers).
VERSION_PATTERN = r"^\s*v?\d+(\.\d+)*([a-z0-9.+-]*)\s*$"


# The bounds of a numeric knob: one class with the run config's and the flags' (trainfit.bounds).
Range = Bound


@dataclass(frozen=True)
class Knob:
    name: str  # the --runtime key, the schema property and the key under training: (or top level)
    flag: str
    kind: Kind
    help: str
    default: Any
    yaml_key: str  # the run config's key path
    fronts: tuple[str, ...] = ("estimate", "run_config")
    level: Level = "everyday"
    choices: tuple[str, ...] = ()
    range: Range | None = None
    pattern: str | None = None  # text knobs: what a valid value looks like
    # The TrainingSetup field it sets directly; None where the CLI maps it (method, LoRA, versions, ...).
    field: str | None = None
    metavar: str | None = None
    # A front end's own default where it differs (plan: each mode's range).
    front_defaults: tuple[tuple[str, Any], ...] = ()
    front_help: tuple[tuple[str, str], ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def default_for(self, front: str) -> Any:
        return dict(self.front_defaults).get(front, self.default)

    def help_for(self, front: str) -> str:
        return dict(self.front_help).get(front, self.help)

    def valid_text(self) -> str:
        """What a valid value is, in words (bounds, choices, or the text's form)."""
        if self.kind == "bool":
            return "true or false"
        if self.choices:
            return ", ".join(self.choices)
        if self.range is not None:
            r = self.range
            kind = "an integer" if r.integer else "a number"
            low = f"greater than {_fmt(r.low)}" if r.low_open else f"from {_fmt(r.low)}"
            return f"{kind} {low} {'and at most' if r.low_open else 'to'} {_fmt(r.high)}"
        if self.kind == "list":
            return "module names joined by commas (q_proj,v_proj), or all-linear"
        return "a version such as 4.44.0"


def _fmt(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


def _choices(literal: Any, drop: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(c for c in typing.get_args(literal) if c not in drop)


def _count(high: float, low: float = 1) -> Range:
    return Range(low, high)


def _t(name: str) -> str:
    return f"training.{name}"


_ALL = ("estimate", "run_config")
_SHARED = ("estimate", "plan", "cloud", "run_config")
_M = _setup.DEFAULT_METHOD

KNOBS: tuple[Knob, ...] = (
    Knob("method", "--method", "choice", f"default {_M} (as plan and cloud; sft = full)", _M, "method",
         choices=(*_setup.METHODS, *_setup.METHOD_ALIASES)),
    Knob("precision", "--precision", "choice", "default: bf16 (fp16 without bf16 support) mixed precision for full "
         "training; the frozen base in pure 16-bit for LoRA/QLoRA/inference on GPUs; fp32 or bf16-mixed on CPU",
         None, _t("precision"), choices=_choices(_setup.PrecisionMode), field="precision"),
    Knob("optimizer", "--optimizer", "choice", "default adamw", "adamw", _t("optimizer"),
         choices=_choices(_setup.Optimizer), field="optimizer"),
    Knob("micro_batch", "--micro-batch", "int", "examples per device per forward (default 1)", 1, _t("micro_batch"),
         range=_count(1 << 20), field="micro_batch"),
    Knob("seq_len", "--seq-len", "int", "tokens per example (default 512)", 512, _t("seq_len"), fronts=_SHARED,
         range=_count(1 << 24), field="seq_len", front_defaults=(("plan", None), ("cloud", 1024)),
         front_help=(("plan", "tokens per example (default: each mode's range)"),
                     ("cloud", "tokens per example (default 1024)"))),
    Knob("grad_accum", "--grad-accum", "int", "micro-batches per optimizer step (default 1)", 1, _t("grad_accum"),
         range=_count(1 << 20), field="grad_accum"),
    Knob("grad_checkpointing", "--grad-checkpointing", "choice", "activation checkpointing (default none)", "none",
         _t("grad_checkpointing"), choices=_choices(_setup.Checkpointing), field="grad_checkpointing"),
    Knob("lora_rank", "--lora-r", "int", "LoRA rank (default 16)", None, _t("lora.rank"), range=_count(1 << 16)),
    Knob("lora_alpha", "--lora-alpha", "float", "LoRA alpha (default 2 x rank)", None, _t("lora.alpha"),
         level="advanced", range=Range(0, 1 << 20, integer=False, low_open=True)),
    Knob("lora_dropout", "--lora-dropout", "float", "LoRA dropout (default 0.05)", None, _t("lora.dropout"),
         level="advanced", range=Range(0, 0.99, integer=False)),
    Knob("lora_targets", "--lora-targets", "list", "q_proj,v_proj or all-linear (default: every linear layer of "
         "the blocks, not lm_head, as plan and cloud)", None, _t("lora.target_modules")),
    Knob("dora", "--dora", "bool", "DoRA (PEFT use_dora): LoRA + a trained magnitude per output feature; with "
         "--method lora/qlora", False, _t("dora"), field="dora"),
    Knob("quant", "--quant", "choice", "weight quantisation (default: nf4-dq for qlora, else none)", None,
         _t("quant"), choices=_choices(_setup.Quant)),
    Knob("zero_stage", "--zero", "int", "DeepSpeed ZeRO stage 0-3 (default 0; with --fsdp its equivalent stage)",
         None, _t("zero_stage"), range=_count(3, 0)),
    Knob("fsdp_strategy", "--fsdp", "choice", "PyTorch FSDP instead of DeepSpeed: full-shard (ZeRO-3-like), "
         "shard-grad-op (ZeRO-2-like) or no-shard (DDP-like); CPU offload with --offload optimizer+params", None,
         _t("fsdp_strategy"), choices=_choices(_setup.FsdpStrategy, drop=("none",))),
    Knob("offload", "--offload", "choice", "CPU offload: DeepSpeed ZeRO-Offload (--zero >= 1; optimizer+params "
         "needs --zero 3) or FSDP CPU offload (--fsdp full-shard --offload optimizer+params)", "none", _t("offload"),
         choices=_choices(_setup.Offload), field="offload"),
    Knob("activation_offload", "--activation-offload", "bool", "move saved activations to pinned CPU memory "
         "(TRL/torchtune activation offloading)", False, _t("activation_offload"), field="activation_offload"),
    Knob("optimizer_in_backward", "--optimizer-in-backward", "bool", "step each parameter during backward and free "
         "its gradient (torchtune optimizer_in_bwd; needs --grad-accum 1, no gradient clipping)", False,
         _t("optimizer_in_backward"), level="advanced", field="optimizer_in_backward"),
    Knob("num_gpus", "--gpus", "int", "GPUs (default: all of the hardware's)", None, _t("num_gpus"),
         range=_count(1 << 20)),
    Knob("attention", "--attn", "choice", "attention kernel (default sdpa)", "sdpa", _t("attention"),
         level="advanced", choices=_choices(_setup.Attention), field="attention"),
    Knob("generate_tokens", "--generate", "int", "inference: tokens generated after the prompt", 0,
         _t("generate_tokens"), range=_count(1 << 24, 0), field="generate_tokens"),
    Knob("dpo_reference", "--dpo-reference", "choice", "DPO's reference model (default: lora-base with LoRA, else "
         "separate)", None, _t("dpo_reference"), level="advanced", choices=("separate", "lora-base", "precomputed")),
    Knob("device", "--device", "choice", "default: the hardware's accelerator", None, _t("device"), level="advanced",
         choices=_choices(_setup.Device)),
    Knob("loss", "--loss", "choice", "cross-entropy: standard (whole logits, fp32 upcast), chunked (torchtune's "
         "CEWithChunkedOutputLoss: 8 pieces upcast one at a time), fused (Liger-Kernel fused linear cross-entropy: "
         "one chunk of logits at a time) or chunked-16bit (LitGPT: lm_head and loss in 128-token chunks, no fp32 "
         "upcast)", "standard", _t("loss"), choices=_choices(_setup.LossKernel), field="loss"),
    Knob("image_size", "--image-size", "int", "vision-language models: image side in pixels (Qwen2-VL: (side/28)^2 "
         "tokens); default: the model's default resolution", None, _t("image_size"),
         fronts=("estimate", "plan", "run_config"), range=_count(1 << 16, 0)),
    Knob("images_per_example", "--images-per-example", "int", "vision-language models: images per example, their "
         "tokens added to each sequence (default 1 with --image-size, else 0)", None, _t("images_per_example"),
         fronts=("estimate", "plan", "run_config"), level="advanced", range=_count(1024, 0)),
    # How another tool's runtime behaves (trainfit.core.runtime); the defaults are
    # trainfit's own run.
    Knob("optimizer_impl", "--optimizer-impl", "choice", "how torch's AdamW steps: auto (what trainfit runs: "
         "fused on a GPU), fused, foreach (torch's default on CUDA when a script asks for neither: one more "
         "moment-sized temporary at the step) or for-loop", "auto", _t("optimizer_impl"), level="runtime",
         choices=_choices(_setup.OptimizerImpl), field="optimizer_impl"),
    Knob("bitsandbytes_version", "--bitsandbytes-version", "text", "bitsandbytes of the run (default: a current "
         "release); before 0.43.2 every 4-bit layer keeps its input for backward", None,
         _t("bitsandbytes_version"), level="runtime", pattern=VERSION_PATTERN, metavar="VERSION"),
    Knob("transformers_version", "--transformers-version", "text", "transformers of the run (default: the "
         "installed one without --hardware, else a current release); before 4.49 the causal-LM loss copies the "
         "shifted logits, and some architectures (gpt_bigcode, falcon, bloom, gpt_neox, opt, mpt, dbrx) compute it "
         "on 16-bit logits; from 5.0 MoE experts are fused 3-D parameters, which bitsandbytes leaves 16-bit", None,
         _t("transformers_version"), level="runtime", pattern=VERSION_PATTERN, metavar="VERSION"),
    Knob("output_kept", "--output-kept", "bool", "the training loop keeps the model output through backward and "
         "the step (`outputs = model(**batch); outputs.loss.backward()`): its logits stay alive; the HF Trainer and "
         "trainfit's runs drop it before backward", False, _t("output_kept"), level="runtime", field="output_kept"),
    Knob("previous_step_kept", "--previous-step-kept", "bool", "the training loop's names hold the previous "
         "micro-step's logits and loss until the next forward returns (LitGPT's finetune scripts): its logits, and "
         "the inputs bitsandbytes < 0.43.2 keeps, stay alive through that forward", False, _t("previous_step_kept"),
         level="runtime", field="previous_step_kept"),
    Knob("fsdp_mixed_units", "--fsdp-mixed-units", "bool", "FSDP LoRA with the adapters inside their frozen "
         "layer's wrapped unit (e.g. LitGPT): gradients kept for the whole unit", False, _t("fsdp_mixed_units"),
         level="runtime", field="fsdp_mixed_units"),
    Knob("fsdp_no_sync", "--fsdp-no-sync", "bool", "FSDP accumulating micro-batches under no_sync (the HF "
         "Trainer's default, Lightning Fabric): every unit's unsharded gradient kept until the last micro-batch; "
         "trainfit's own runs reduce-scatter after each one", False, _t("fsdp_no_sync"), level="runtime",
         field="fsdp_no_sync"),
    Knob("kbit_upcast", "--kbit-upcast", "bool", "QLoRA prepared by PEFT's prepare_model_for_kbit_training (TRL's "
         "SFTTrainer does it): embeddings, norms and lm_head cast to fp32; trainfit's own runs keep them 16-bit",
         False, _t("kbit_upcast"), level="runtime", field="kbit_upcast"),
    Knob("autocast_16bit_weights", "--autocast-16bit-weights", "bool", "a 16-bit model run under autocast "
         "(torch_dtype=bfloat16 with --bf16, the usual Transformers QLoRA recipe): LayerNorm models with 4-bit "
         "linears carry an fp32 residual stream; trainfit's own --precision bf16 runs without autocast", False,
         _t("autocast_16bit_weights"), level="runtime", field="autocast_16bit_weights"),
    Knob("quantize_lm_head", "--quantize-lm-head", "bool", "QLoRA / int8 with the output layer quantised too "
         "(Lightning Fabric's bitsandbytes plugin, LitGPT --quantize bnb.*); Transformers and trainfit's runs keep "
         "the lm_head 16-bit", False, _t("quantize_lm_head"), level="runtime", field="quantize_lm_head"),
    Knob("bnb_fp16_quant_state", "--bnb-fp16-quant-state", "bool", "4-bit weights quantised from an fp16 copy "
         "(Lightning Fabric's bitsandbytes plugin): with bf16 compute each de-quantised weight is cast again, two "
         "copies alive at once", False, _t("bnb_fp16_quant_state"), level="runtime", field="bnb_fp16_quant_state"),
    Knob("torch_compile", "--torch-compile", "bool", "the model run under torch.compile (torchtune's compile=True, "
         "TrainingArguments.torch_compile): elementwise ops fused, fewer kernels; memory counted as eager (an upper "
         "bound), except the loss (standard or chunked), whose compiled graph keeps the 16-bit logits instead of an "
         "fp32 log_softmax; trainfit's own runs are eager", False, _t("torch_compile"), level="runtime",
         field="torch_compile"),
    Knob("model_code", "--model-code", "choice", "whose modeling code runs the model: transformers with PEFT's "
         "LoRA (trainfit's runs) or LitGPT's own GPT and LoRA layers, which keep different activations",
         "transformers", _t("model_code"), level="runtime", choices=_choices(_setup.ModelCode), field="model_code"),
)

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
RUNTIME_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.level == "runtime")


def knobs_for(front: str) -> tuple[Knob, ...]:
    return tuple(k for k in KNOBS if front in k.fronts)


def flag_of(name: str) -> str:
    """How the command line words a knob (or a TrainingSetup field that is one): '--fsdp-no-sync'."""
    knob = BY_NAME.get(name) or next((k for k in KNOBS if k.field == name), None)
    return knob.flag if knob is not None else "--" + name.replace("_", "-")


def key_of(name: str) -> str:
    """How the run config words it: 'training.fsdp_no_sync' (the top-level 'method')."""
    knob = BY_NAME.get(name) or next((k for k in KNOBS if k.field == name), None)
    return knob.yaml_key if knob is not None else f"training.{name}"


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def parse_text(knob: Knob, text: str) -> Any:
    """A command-line word as the knob's value; ValueError saying what is valid otherwise."""
    if knob.kind == "bool":
        word = text.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueError(f"must be true or false, got {text!r}")
    if knob.kind in ("int", "float"):
        r = knob.range
        try:
            value: Any = int(text) if knob.kind == "int" else float(text)
        except ValueError:
            raise ValueError(f"must be {knob.valid_text()}, got {text!r}") from None
        why = range_problem(knob, value)
        if why:
            raise ValueError(why)
        assert r is not None
        return value
    return check_value(knob, text)


def range_problem(knob: Knob, value: Any) -> str | None:
    r = knob.range
    if r is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (r.integer and not isinstance(value, int)):
        return f"must be {knob.valid_text()}, got {value!r}"
    if value != value or value in (float("inf"), float("-inf")):
        return f"must be {knob.valid_text()}, got {value}"
    too_low = value <= r.low if r.low_open else value < r.low
    return f"must be {knob.valid_text()}, got {value!r}" if too_low or value > r.high else None


def check_value(knob: Knob, value: Any) -> Any:
    """`value` when the knob takes it (choices, bounds, text form); ValueError otherwise."""
    if knob.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
    elif knob.choices:
        if value not in knob.choices:
            raise ValueError(f"must be one of {', '.join(knob.choices)}, got {value!r}")
    elif knob.range is not None:
        why = range_problem(knob, value)
        if why:
            raise ValueError(why)
    elif knob.pattern is not None:
        if not isinstance(value, str) or not re.match(knob.pattern, value, re.IGNORECASE):
            raise ValueError(f"must be {knob.valid_text()}, got {value!r}")
    elif knob.kind == "list" and not isinstance(value, (str, list)):
        raise ValueError(f"must be {knob.valid_text()}, got {value!r}")
    return value


def parse_runtime(items: list[str] | None) -> dict[str, Any]:
    """`--runtime KEY=VALUE` words as {knob name: value}; ValueError naming the key and what is valid."""
    out: dict[str, Any] = {}
    valid_keys = ", ".join(k.name for k in RUNTIME_KNOBS)
    for item in items or []:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE (keys: {valid_keys})")
        knob = BY_NAME.get(key)
        if knob is None or knob.level != "runtime":
            raise ValueError(f"unknown key {key!r} (valid: {valid_keys})")
        try:
            out[key] = parse_text(knob, text)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    return out


def json_schema(front: str = "estimate") -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the knobs a front end takes, keyed by knob name."""
    props: dict[str, Any] = {}
    for k in knobs_for(front):
        prop: dict[str, Any] = {"description": k.help, "x-flag": k.flag, "x-yaml-key": k.yaml_key,
                                "x-level": k.level}
        if k.kind == "bool":
            prop["type"] = "boolean"
        elif k.choices:
            prop["enum"] = list(k.choices)
        elif k.range is not None:
            prop["type"] = "integer" if k.range.integer else "number"
            prop["exclusiveMinimum" if k.range.low_open else "minimum"] = k.range.low
            prop["maximum"] = k.range.high
        elif k.kind == "list":
            prop["anyOf"] = [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
        else:
            prop["type"] = "string"
            if k.pattern:
                prop["pattern"] = k.pattern
        default = k.default_for(front)
        if default is not None:
            prop["default"] = default
        props[k.name] = prop
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"trainfit {front} knobs",
            "type": "object", "properties": props, "additionalProperties": False}


def markdown_table(front: str = "estimate") -> str:
    """The knob table of the README and --help-all: flag, run-config key, valid values, default, level."""
    rows = ["| flag | run-config key | valid | default | level |", "|---|---|---|---|---|"]
    for k in knobs_for(front):
        default = k.default_for(front)
        shown = "—" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        valid = k.valid_text().replace("|", "\\|")
        rows.append(f"| `{k.flag}` | `{k.yaml_key}` | {valid} | {shown} | {k.level} |")
    return "\n".join(rows)
