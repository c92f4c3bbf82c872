"""The run config: a small, versioned YAML schema for one training run (docs/run-config.md).

    version: 1
    method: pretrain            # pretrain | full (alias sft) | lora | qlora | dpo
    model: {shape: {layers: 4, hidden: 256, heads: 4}, weights: random}
    data: {paths: [builtin:tiny-corpus], format: text}
    training: {micro_batch: 8, seq_len: 128, precision: fp32}
    schedule: {max_steps: 200, lr: 1.0e-3}

`load_run_config(path)` parses into frozen dataclasses and reports every problem at once (key
path, what is wrong, what is valid), as one BadInputError. Relative file paths are resolved
against the config file's directory, so a config can be run from anywhere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainfit.core.models.shapes import MAX_SHAPE_PARAMS, MIN_SHAPE_PARAMS
from trainfit.core.models.spec import ModelSpec
from trainfit.core.serde import SerdeError, from_jsonable, to_jsonable
from trainfit.core.setup import TRAIN_METHODS, Method, PrecisionMode, TrainingSetup, parse_method
from trainfit.errors import BadInputError, TrainfitError, UnavailableError, short_repr, unknown_keys

if TYPE_CHECKING:
    from trainfit.core.machines.profile import HardwareProfile

CONFIG_VERSION = 1
BUILTIN_DATA = {
    "tiny-corpus": ("tiny-corpus.txt", "text"),
    "tiny-chat": ("tiny-chat.jsonl", "chat"),
    "tiny-preferences": ("tiny-preferences.jsonl", "preference"),
}


def corpora_dir() -> Path:
    """Where the shipped corpora behind `builtin:` data paths live (trainfit/data/corpora)."""
    return Path(__file__).resolve().parent.parent / "data" / "corpora"


def resolve_data_path(p: str) -> str:
    """A data path as a file name: `builtin:NAME` becomes the shipped corpus; others pass unchanged."""
    if p.startswith("builtin:"):
        return str(corpora_dir() / BUILTIN_DATA[p[8:]][0])
    return p

@dataclass(frozen=True)
class ShapeConfig:
    """A pretraining shape: either layers/hidden/heads, or a parameter budget (params: 8m)."""

    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None  # default: heads (no grouped-query attention)
    intermediate: int | None = None  # default: SwiGLU 8/3 * hidden rounded up to 64
    params: int | str | None = None  # "8m", "125m", 8000000
    architecture: str = "llama"
    max_position_embeddings: int = 2048
    tie_embeddings: bool = True


@dataclass(frozen=True)
class ModelConfig:
    id: str | None = None  # catalog id or alias ("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b")
    path: str | None = None  # local directory with config.json (and weights for weights: local)
    shape: ShapeConfig | None = None
    # random: initialised here; local: safetensors in model.path; hub: from_pretrained(model.id)
    # (downloads from the Hugging Face Hub, or reads its cache)
    weights: Literal["random", "local", "hub"] = "random"


@dataclass(frozen=True)
class TokenizerConfig:
    path: str | None = None  # local tokenizer directory; default: model.path when it has one
    vocab_size: int = 4096  # when a BPE tokenizer is trained on the corpus
    train_max_bytes: int = 20_000_000  # corpus bytes fed to the BPE trainer at most


@dataclass(frozen=True)
class DataConfig:
    paths: list[str] = field(default_factory=list)
    format: Literal["text", "chat", "preference"] | None = None  # default: from the builtin / method
    text_column: str = "text"
    messages_column: str = "messages"
    prompt_column: str = "prompt"
    chosen_column: str = "chosen"
    rejected_column: str = "rejected"
    cache_dir: str | None = None
    streaming: bool = False  # an IterableDataset read in file order, repeated (train/data.py)
    max_samples: int | None = None
    keep_in_memory: bool = False  # loaded and tokenised data held in RAM: no Arrow cache files
    num_workers: int = 0  # DataLoader worker processes (a stream is read by one: its order stays fixed)
    prefetch_factor: int | None = None  # batches each worker loads ahead (torch's default 2); needs workers
    packing: bool | None = None  # SFT: pack examples into seq_len rows; None: the method's default


# Data keys that change how fast data arrives, not which data: left out of the config hash, so a
# resumed run may change them (RunConfig.config_hash).
DATA_SPEED_KEYS = ("keep_in_memory", "num_workers", "prefetch_factor")


def packing_default(method: str) -> bool:
    """Whether the method packs when data.packing is unset: pretraining always cuts its corpus
    into seq_len blocks (and cannot do otherwise); SFT trains one example per row unless asked;
    DPO cannot pack."""
    return method == "pretrain"


def data_hash_view(data: dict[str, Any], method: str) -> dict[str, Any]:
    """The `data:` section as the config hash sees it: the speed keys left out, the cache
    directory as null (where caches live changes no loss; null is what run directories written
    before it was left out hashed), packing only when it differs from the method's default (so
    `packing: false` for SFT resumes a run that left it unset)."""
    view = {k: v for k, v in data.items() if k not in DATA_SPEED_KEYS}
    view["cache_dir"] = None
    if view.get("packing") in (None, packing_default(method)):
        view.pop("packing", None)
    return view


@dataclass(frozen=True)
class TrainingConfig(TrainingSetup):
    """The `training:` section: the TrainingSetup knobs (trainfit.core.setup, with its defaults),
    plus what only a run needs. `method` is the config's top-level key and `generate_tokens` is
    for inference, so neither is a key here (NOT_TRAINING_KEYS)."""

    # auto: the core rule for the device the run lands on (core.plan.intent.precision_for)
    precision: PrecisionMode | Literal["auto"] = "auto"
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    dpo_beta: float = 0.1
    # Runtime knobs of the knob table that are no TrainingSetup field (trainfit.core.knobs): a run
    # is the installed versions, so the rules refuse them when set.
    transformers_version: str | None = None
    bitsandbytes_version: str | None = None


# Training keys that say how the global batch is spread (GPUs, nodes, hybrid sharding) and how a
# step is computed, not what it computes (where states, saved tensors and logits live, when a
# parameter is stepped): left out of the config hash, so a run resumes on another layout or with
# other memory savers.
HOW_NOT_WHAT = ("num_gpus", "num_nodes", "hybrid_shard", "grad_checkpointing", "device", "fsdp_strategy",
                "activation_offload", "optimizer_in_backward", "loss")
# Training keys added after run directories existed that do change the maths (DoRA, image inputs):
# hashed only when they differ from their default, so a run directory written before they existed
# still resumes.
HASHED_WHEN_SET = ("dora", "image_size", "images_per_example")

# TrainingSetup fields that the `training:` section does not take (set from elsewhere).
# The framework knobs (optimizer_impl ... fsdp_no_sync: trainfit.core.runtime) describe
# other tools; a trainfit run is their defaults.
NOT_TRAINING_KEYS = ("method", "generate_tokens", "optimizer_impl", "bnb_keeps_input", "fsdp_mixed_units",
                     "kbit_upcast", "autocast_16bit_weights", "fsdp_no_sync", "quantize_lm_head", "bnb_fp16_quant_state",
                     "logits_shift_copy", "logits_returned_fp32", "output_kept", "experts_fused",
                     "reentrant_checkpoint_around_fsdp_units", "cache_under_checkpointing", "model_code",
                     "previous_step_kept", "fsdp_flat_params", "torch_compile", "transformers_version",
                     "bitsandbytes_version", "mqa_kv_unrepeated")


def _runtime_keys() -> tuple[str, ...]:
    """The knob table's runtime knobs (refused when set), so a new one changes no config hash."""
    from trainfit.core.knobs import RUNTIME_KNOBS

    return tuple(k.yaml_key.split(".")[1] for k in RUNTIME_KNOBS)


def _knob_keys() -> set[str]:
    """The `training:` keys the knob table declares (trainfit.core.knobs): read, then checked by its
    rules (trainfit.core.knob_rules), which refuse what a run does not do."""
    from trainfit.core.knobs import KNOBS

    return {k.yaml_key.split(".")[1] for k in KNOBS if k.yaml_key.startswith("training.")}


@dataclass(frozen=True)
class ScheduleConfig:
    max_steps: int | None = None
    epochs: float | None = None
    lr: float = 3.0e-4
    warmup_steps: int = 0
    scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "linear"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 42


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 100
    keep_last: int = 2
    # A multi-node run's run directory must be shared storage (shared_storage_errors); true: the
    # user vouches for storage the rule cannot see is shared.
    allow_node_local: bool = False


@dataclass(frozen=True)
class LoggingConfig:
    every_steps: int = 1
    progress: Literal["auto", "bar", "lines"] = "auto"


@dataclass(frozen=True)
class DistributedConfig:
    strategy: Literal["auto", "ddp", "fsdp", "deepspeed"] = "auto"  # auto: ddp when launched with >1 process
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on CUDA, gloo on CPU


@dataclass(frozen=True)
class SafetyConfig:
    # thresholds of the thermal / power / checkpoint-cadence policies (core.run.safety_thresholds.SAFETY)
    mode: Literal["conservative", "balanced", "extreme"] = "balanced"
    # Mean hours between interruptions of the machine (a spot / preemptible one; written by
    # `trainfit plan --flavor ID --spot`): the cadence policy combines it with the mode's risk.
    interruption_hours: float | None = None


@dataclass(frozen=True)
class MonitoringConfig:
    """The live monitor (train/monitor/live.py): machine samples in metrics.jsonl, dashboard, leak warning."""

    enabled: bool = True
    interval_seconds: float = 1.0  # one machine sample per interval
    dashboard: Literal["auto", "on", "off"] = "auto"  # auto: on a terminal only
    leak_warning: bool = True  # warn when memory at step ends keeps rising at the same batch shape


@dataclass(frozen=True)
class RunConfig:
    version: int
    method: Method  # one of TRAIN_METHODS; "sft" is read as "full"
    model: ModelConfig
    data: DataConfig
    name: str = ""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpointing: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)
    # The tool meant to run this config, as `--framework NAME[@VERSION]` (core/frameworks.py). trainfit
    # train and verify run trainfit's own loop, so they refuse another tool's name (own_run_problem).
    framework: str | None = None
    source: str = ""  # file the config was read from (not part of the hash)

    @property
    def data_format(self) -> str:
        """The data format, with its default filled in from the builtin set or the method."""
        if self.data.format:
            return self.data.format
        for p in self.data.paths:
            if p.startswith("builtin:") and p[8:] in BUILTIN_DATA:
                return BUILTIN_DATA[p[8:]][1]
        return "preference" if self.method == "dpo" else "text"

    def to_setup(self, device: str = "cpu", num_gpus: int | None = None, hardware=None) -> TrainingSetup:
        """The TrainingSetup the memory and speed models take for this run (precision "auto"
        resolved for `device` with the hardware's 16-bit type)."""
        from trainfit.core.plan.intent import resolve_setup

        t = self.training
        knobs = {f.name: getattr(t, f.name) for f in dataclasses.fields(TrainingSetup)
                 if f.name not in NOT_TRAINING_KEYS + ("precision", "device", "num_gpus", "lora", "quant",
                                                       "dpo_reference")}
        return resolve_setup(hardware, self.method, lora=t.lora, precision=t.precision, device=device,
                             num_gpus=num_gpus if num_gpus is not None else t.num_gpus,
                             quant=t.quant if t.quant != "none" else None, dpo_reference=t.dpo_reference, **knobs)

    def to_dict(self) -> dict[str, Any]:
        data = to_jsonable(self)
        data.pop("source", None)
        if data.get("framework") is None:  # written only when named (files and hashes of before stay as they were)
            data.pop("framework", None)
        for key in NOT_TRAINING_KEYS + _runtime_keys():  # a run is trainfit's own runtime: never written
            data["training"].pop(key, None)
        return data

    def for_device(self, device: str, hardware: HardwareProfile | None) -> "RunConfig":
        """This config with `precision: auto` made concrete for the device the run lands on, with
        `hardware`'s 16-bit type: the HardwareProfile of that machine, which the caller probes (the
        schema never does); None: no profile, the core rule's default for the device."""
        if self.training.precision != "auto":
            return self
        from trainfit.core.plan.intent import precision_for
        from trainfit.core.setup import method_trains_adapters

        precision = precision_for(hardware, device, method=self.method,
                                  has_lora=method_trains_adapters(self.method,
                                                                  lora_given=self.training.lora is not None))
        return dataclasses.replace(self, training=dataclasses.replace(self.training, precision=precision))

    def config_hash(self, processes: int | None = None) -> str:
        """Hash of everything that changes the maths of the run.

        Logging and keep_last do not change a single loss, so a resumed run may change them. The
        batch counts as the global batch, micro_batch x grad_accum x processes (`processes`; default
        training.num_gpus), not how it is split: OOM recovery (train/recovery/) changes the split and
        the run still resumes. Gradient checkpointing and the device say how a step is computed and
        where, not what it computes, so they are left out too.
        """
        data = self.to_dict()
        data.pop("logging", None)
        data["checkpointing"].pop("keep_last", None)
        data["checkpointing"].pop("allow_node_local", None)  # where checkpoints live, not what they hold
        data.pop("safety", None)  # pauses and extra checkpoints do not change a loss either
        data.pop("monitoring", None)  # watching a run does not change it
        data.pop("framework", None)  # which tool is named does not change trainfit's own run
        data["data"] = data_hash_view(data["data"], self.method)  # workers, caches: speed, not maths
        t = data["training"]
        n = processes if processes is not None else self.training.num_gpus
        t["global_batch"] = t.pop("micro_batch") * t.pop("grad_accum") * n
        for key in HOW_NOT_WHAT:
            t.pop(key, None)
        defaults = {f.name: f.default for f in dataclasses.fields(TrainingConfig)}
        for key in HASHED_WHEN_SET:
            if t.get(key) == defaults[key]:
                t.pop(key, None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


_SECTIONS: dict[str, type] = {
    "model": ModelConfig, "tokenizer": TokenizerConfig, "data": DataConfig, "training": TrainingConfig,
    "schedule": ScheduleConfig, "checkpointing": CheckpointConfig, "logging": LoggingConfig,
    "distributed": DistributedConfig, "safety": SafetyConfig, "monitoring": MonitoringConfig,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)


def parse_count(value: int | str) -> int:
    """'8m' -> 8_000_000; '1.5b' -> 1_500_000_000; ints pass through. ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"{short_repr(value)} is not a count like 8m, 125m, 1.5b or 8000000")
    mult = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def _build_section(cls: type, raw: Any, path: str, errors: list[str]) -> Any:
    """Build one dataclass field by field, so that every bad key is reported, not just the first."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.append(f"{path}: expected a mapping, got {type(raw).__name__}")
        return None
    skipped = set(NOT_TRAINING_KEYS) - _knob_keys() if cls is TrainingConfig else set()
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in skipped}
    hints = __import__("typing").get_type_hints(cls)
    errors.extend(unknown_keys(raw, fields, f"{path}."))
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        sub = hints[name]
        try:
            if name == "shape" and cls is ModelConfig and raw[name] is not None:
                kwargs[name] = _build_section(ShapeConfig, raw[name], f"{path}.shape", errors)
            else:
                kwargs[name] = from_jsonable(sub, raw[name], f"{path}.{name}")
        except SerdeError as exc:
            errors.append(str(exc))
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field missing
        errors.append(f"{path}: {exc}")
        return None


def parse_run_config(raw: Any, *, base_dir: Path | None = None, source: str = "") -> RunConfig:
    """Validate a loaded YAML mapping into a RunConfig; every problem reported at once."""
    errors: list[str] = []
    if not isinstance(raw, dict):
        raise BadInputError(f"{source or 'run config'}: expected a YAML mapping at the top level")
    top = {"version", "name", "method", "framework"} | set(_SECTIONS)
    errors.extend(unknown_keys(raw, sorted(top)))
    version = raw.get("version")
    if type(version) is not int or version != CONFIG_VERSION:  # `true` == 1 in Python, not in a schema
        errors.append(f"version: {short_repr(version)} is not supported (this trainfit reads version: {CONFIG_VERSION})")
    method = raw.get("method")
    try:
        method = parse_method(method, key="method", allowed=TRAIN_METHODS)
    except TrainfitError as exc:
        errors.append(exc.message)
    name = raw.get("name", "")
    if not isinstance(name, str):
        errors.append("name: expected a string")
    sections = {k: _build_section(cls, raw.get(k), k, errors) for k, cls in _SECTIONS.items()}
    framework = raw.get("framework")
    if framework is not None:
        from trainfit.core.frameworks import resolve_framework

        try:
            resolve_framework(framework, key="framework")
        except TrainfitError as exc:
            errors.append(exc.message)
    if "model" not in raw:
        errors.append("model: missing (give one of model.id, model.path or model.shape)")
    if "data" not in raw:
        errors.append("data: missing (give data.paths, e.g. [builtin:tiny-corpus])")
    if errors:
        raise BadInputError(_joined(source, errors))
    base = base_dir or Path.cwd()
    sections["model"], sections["tokenizer"], sections["data"] = _resolve_paths(
        sections["model"], sections["tokenizer"], sections["data"], base)
    cfg = RunConfig(version=version, method=method, name=name, source=source, framework=framework, **sections)
    errors.extend(semantic_errors(cfg))
    if errors:
        raise BadInputError(_joined(source, errors))
    return cfg


def own_run_problem(cfg: RunConfig, command: str) -> str | None:
    """Why `command` (trainfit train / verify) will not run a config that names another tool: it runs
    trainfit's own loop, whose memory and speed are not that tool's. None for no framework or trainfit."""
    if cfg.framework is None:
        return None
    from trainfit.core.frameworks import resolve_framework

    framework = resolve_framework(cfg.framework, key="framework")
    if framework.is_own:
        return None
    return (f"framework: {cfg.framework}: {command} runs trainfit's own training loop, not {framework.title}; "
            f"run the config's settings with that tool (trainfit estimate/plan --framework {cfg.framework} give "
            "its figures), or drop the key (or set framework: trainfit) to train here")


def refuse_foreign_framework(cfg: RunConfig, command: str) -> None:
    """BadInputError (exit 2) when `command` would run a config that names another tool (own_run_problem)."""
    problem = own_run_problem(cfg, command)
    if problem is not None:
        raise BadInputError(problem)


def _joined(source: str, errors: list[str]) -> str:
    head = f"{source}: " if source else ""
    if len(errors) == 1:
        return head + errors[0]
    return head + f"{len(errors)} problems: " + "; ".join(errors)


def _abs(p: str | None, base: Path) -> str | None:
    if p is None or p.startswith("builtin:"):
        return p
    path = Path(p).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _resolve_paths(model: ModelConfig, tok: TokenizerConfig, data: DataConfig, base: Path):
    model = dataclasses.replace(model, path=_abs(model.path, base))
    tok = dataclasses.replace(tok, path=_abs(tok.path, base))
    data = dataclasses.replace(data, paths=[_abs(p, base) for p in data.paths],  # type: ignore[misc]
                               cache_dir=_abs(data.cache_dir, base))
    return model, tok, data


def semantic_errors(cfg: RunConfig) -> list[str]:
    """Cross-field checks and file existence; each message names the key and the fix."""
    errs: list[str] = []
    m, t, s = cfg.model, cfg.training, cfg.schedule
    given = [k for k in ("id", "path", "shape") if getattr(m, k) is not None]
    if len(given) != 1:
        errs.append(f"model: give exactly one of id, path, shape (got {', '.join(given) or 'none'})")
    if m.path is not None and not Path(m.path, "config.json").is_file():
        errs.append(f"model.path: {m.path} has no config.json")
    if m.weights == "local" and m.path is None:
        errs.append("model.weights: 'local' needs model.path (a directory with safetensors weights); "
                    "catalog models cannot be downloaded here, use weights: random")
    if m.shape is not None:
        sh = m.shape
        explicit = [sh.layers, sh.hidden, sh.heads]
        if sh.params is not None and any(v is not None for v in explicit):
            errs.append("model.shape: give either params or layers/hidden/heads, not both")
        elif sh.params is None and any(v is None for v in explicit):
            errs.append("model.shape: give layers, hidden and heads (or params: 8m)")
        if sh.params is not None:
            try:
                if not MIN_SHAPE_PARAMS <= parse_count(sh.params) <= MAX_SHAPE_PARAMS:
                    errs.append(f"model.shape.params: must be from 1m to 10t, got {short_repr(sh.params)}")
            except ValueError as exc:
                errs.append(f"model.shape.params: {exc}")
        if sh.hidden and sh.heads and sh.hidden % sh.heads:
            errs.append(f"model.shape: hidden ({sh.hidden}) must be a multiple of heads ({sh.heads})")
        if sh.heads and sh.kv_heads and sh.heads % sh.kv_heads:
            errs.append(f"model.shape.kv_heads: heads ({sh.heads}) must be a multiple of kv_heads ({sh.kv_heads})")
        elif sh.params is None and all(explicit) and not sh.hidden % sh.heads:
            errs.extend(_implausible_shape(sh, cfg.tokenizer.vocab_size))
    if cfg.tokenizer.path is not None and not Path(cfg.tokenizer.path).is_dir():
        errs.append(f"tokenizer.path: {cfg.tokenizer.path} is not a directory")
    if not cfg.data.paths:
        errs.append("data.paths: empty (give files, a save_to_disk directory, or builtin:tiny-corpus, "
                    "builtin:tiny-chat, builtin:tiny-preferences)")
    for i, p in enumerate(cfg.data.paths):
        if p.startswith("builtin:"):
            if p[8:] not in BUILTIN_DATA:
                errs.append(f"data.paths[{i}]: unknown {short_repr(p)} (valid: "
                            f"{', '.join('builtin:' + k for k in BUILTIN_DATA)})")
        elif not Path(p).exists():
            errs.append(f"data.paths[{i}]: {p} does not exist")
        elif not (Path(p).is_dir() or Path(p).is_file()):  # a pipe blocks, a device never ends
            errs.append(f"data.paths[{i}]: {p} is not a regular file or a directory (a pipe or a device "
                        "cannot be read as a dataset)")
    fmt = cfg.data_format
    if cfg.method == "dpo" and fmt != "preference":
        errs.append(f"data.format: dpo needs 'preference' data (prompt/chosen/rejected), got {short_repr(fmt)}")
    if cfg.method != "dpo" and fmt == "preference":
        errs.append(f"data.format: 'preference' data is for method dpo, not {cfg.method}")
    if cfg.method == "pretrain" and fmt == "chat":
        errs.append("data.format: pretrain takes 'text' data; use method sft for chat data")
    if m.weights == "hub" and m.id is None:
        errs.append("model.weights: 'hub' loads model.id from the Hugging Face Hub; give model.id")
    if cfg.method == "pretrain" and m.weights in ("local", "hub"):
        errs.append("model.weights: pretrain starts from random weights; use method sft to fine-tune local weights")
    errs.extend(_bound_errors(cfg))
    if cfg.method == "qlora" and t.quant == "none":
        pass  # qlora defaults to nf4-dq at run time
    elif cfg.method == "dpo" and t.quant != "none":
        # DPO on a quantized base (the planner's "DPO with QLoRA"): LoRA adapters train, the
        # reference is the same base with the adapters off, never a second (quantized) copy.
        if not t.lora:
            errs.append(f"training.quant: dpo on a {t.quant} base trains LoRA adapters; set training.lora "
                        "(e.g. {rank: 16}) or remove training.quant")
        elif t.dpo_reference == "separate":
            errs.append("training.dpo_reference: with training.quant the reference is the quantized base with the "
                        "adapters off (lora-base); 'separate' would load a second copy")
    elif cfg.method != "qlora" and t.quant != "none":
        errs.append(f"training.quant: {short_repr(t.quant)} is for method qlora, or dpo with training.lora "
                    f"(got method {cfg.method})")
    if t.dpo_reference == "lora-base" and not (cfg.method == "dpo" and t.lora):
        errs.append("training.dpo_reference: 'lora-base' needs method dpo with training.lora set")
    if s.max_steps is None and s.epochs is None:
        errs.append("schedule: give max_steps or epochs")
    errs.extend(_data_errors(cfg))
    from trainfit.core.knob_rules import run_config_problems

    errs.extend(run_config_problems(cfg))  # the knob table's refusals, worded by key (trainfit.core.knob_rules)
    return errs


def _swiglu_intermediate(hidden: int) -> int:
    # Llama's SwiGLU width: 2/3 of 4*hidden, rounded up to a multiple of 64 (Touvron et al. 2023).
    return ((int(8 * hidden / 3) + 63) // 64) * 64


def shape_spec(shape: ShapeConfig, vocab_size: int) -> ModelSpec:
    """ModelSpec of a pretraining shape (a Llama-style decoder unless `architecture` says otherwise)."""
    if shape.params is not None:
        try:
            from trainfit.core.models.shapes import shape_for_params
        except ImportError:
            raise UnavailableError("model.shape.params needs trainfit.core.models.shapes, not in this build",
                                   hint="give model.shape layers/hidden/heads instead") from None
        # The budget includes this run's vocabulary (the tokenizer's size), not a default one.
        spec = shape_for_params(parse_count(shape.params), vocab_size=vocab_size,
                                max_positions=shape.max_position_embeddings, tie_embeddings=shape.tie_embeddings)
        return dataclasses.replace(spec, id=f"shape:{shape.params}")
    hidden, heads = shape.hidden, shape.heads
    assert hidden and heads and shape.layers
    return ModelSpec(
        id=f"shape:{shape.layers}x{hidden}", architecture=shape.architecture, vocab_size=vocab_size,
        hidden_size=hidden, num_layers=shape.layers, num_heads=heads, num_kv_heads=shape.kv_heads or heads,
        head_dim=hidden // heads, intermediate_size=shape.intermediate or _swiglu_intermediate(hidden),
        activation="silu", gated_mlp=True, tie_embeddings=shape.tie_embeddings, position="rope",
        max_position_embeddings=shape.max_position_embeddings, norm="rmsnorm", qkv_bias=False,
        o_bias=False, mlp_bias=False, lm_head_bias=False, stored_dtype="float32", source="shape",
    )


def _implausible_shape(shape: ShapeConfig, vocab_size: int) -> list[str]:
    """The refusal `estimate` gives a shape beyond any real model (1.3e18 parameters), here before
    the runner spends seconds allocating it. The vocabulary is the tokenizer's target size."""
    from trainfit.core.models.loader import check_plausible

    try:
        check_plausible(shape_spec(shape, vocab_size), "model.shape")
    except BadInputError as exc:
        return [exc.message]
    return []


def _data_errors(cfg: RunConfig) -> list[str]:
    """The data keys that cannot go together, or not with this method."""
    d, errs = cfg.data, []
    if d.streaming and cfg.schedule.max_steps is None:
        errs.append("schedule.max_steps: data.streaming reads an IterableDataset, which has no length, so the "
                    "run's length must be given as max_steps (epochs cannot be counted)")
    if d.streaming and d.keep_in_memory:
        errs.append("data.keep_in_memory: a streamed dataset (data.streaming: true) is read as it trains and "
                    "never held; use one of streaming or keep_in_memory")
    if d.streaming and cfg.method == "dpo" and cfg.training.dpo_reference == "precomputed":
        errs.append("data.streaming: training.dpo_reference 'precomputed' computes the reference log-probs over "
                    "the whole dataset before training, which a stream cannot give (TRL's DPOTrainer); use "
                    "dpo_reference separate (or lora-base), or streaming: false")
    if d.prefetch_factor is not None and d.num_workers == 0:
        errs.append("data.prefetch_factor: only applies with DataLoader workers (data.num_workers > 0), which "
                    "prefetch batches; set num_workers or remove prefetch_factor")
    if d.packing and cfg.method == "dpo":
        errs.append("data.packing: method dpo cannot pack (TRL's DPOTrainer keeps each prompt/chosen/rejected "
                    "pair a sequence of its own); remove data.packing")
    if d.packing is False and cfg.method == "pretrain":
        errs.append("data.packing: pretrain always packs its corpus into training.seq_len-token blocks; "
                    "remove data.packing (or set it true)")
    return errs


def _bound_errors(cfg: RunConfig) -> list[str]:
    """Every number of the config against its range: the numeric knobs' in the knob table, the
    others' in trainfit.validate.BOUNDS (NaN and infinity never pass)."""
    from trainfit.core.knobs import KNOBS
    from trainfit.validate import BOUNDS, section_problems

    knob_bounds = {**BOUNDS, **{k.name: k.range for k in KNOBS if k.range is not None}}
    errs = section_problems(cfg.training, "training", bounds=knob_bounds)
    if cfg.training.lora is not None:
        errs += section_problems(cfg.training.lora, "training.lora",
                                 {"rank": "lora_rank", "alpha": "lora_alpha", "dropout": "lora_dropout"}, knob_bounds)
    if cfg.model.shape is not None:
        errs += section_problems(cfg.model.shape, "model.shape")
    for section, path in ((cfg.schedule, "schedule"), (cfg.checkpointing, "checkpointing"), (cfg.logging, "logging"),
                          (cfg.tokenizer, "tokenizer"), (cfg.data, "data"), (cfg.monitoring, "monitoring")):
        errs += section_problems(section, path)
    errs += section_problems(cfg.safety, "safety")
    return errs


def shared_storage_errors(cfg: RunConfig, run_dir: str) -> list[str]:
    """A multi-node run's run directory (`trainfit train --out`) must be storage every node shares:
    each rank reads the checkpoint from it on --resume (the rule: trainfit.config.shared_storage)."""
    if cfg.training.num_nodes <= 1 or cfg.checkpointing.allow_node_local:
        return []
    from trainfit.config.shared_storage import node_local_reason

    reason = node_local_reason(str(run_dir))
    if reason is None:
        return []
    return [f"--out {run_dir}: training.num_nodes {cfg.training.num_nodes} needs the run directory (its checkpoints) "
            f"on storage every node mounts, and {reason}; give --out a shared directory (NFS, Lustre, a bucket "
            "mount, a ReadWriteMany volume), or set checkpointing.allow_node_local: true if it is shared"]


def load_run_config(path: str | Path) -> RunConfig:
    """Read and validate a run config file. BadInputError (exit 2) on any problem."""
    from trainfit.validate import parse_yaml, read_text_file

    path = Path(path)
    if not path.exists():
        raise BadInputError(f"run config {path} does not exist",
                            hint="see examples/*.yaml and docs/run-config.md")
    raw = parse_yaml(read_text_file(path, "run config"), str(path))
    return parse_run_config(raw, base_dir=path.resolve().parent, source=str(path))


def dump_run_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (absolute paths, defaults filled in)."""
    import yaml

    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
