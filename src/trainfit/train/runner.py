"""Run one training from a RunConfig: pretrain, SFT (full / LoRA / QLoRA) or DPO.

Built on Transformers' Trainer and TRL's SFTTrainer / DPOTrainer (so resume, DDP, FSDP and
DeepSpeed are the libraries' tested code paths); trainfit adds the run directory, atomic
checkpoints, metrics, progress and predicted-vs-measured figures.

Run directory:
    config.yaml        the resolved config        config.sha256   its hash (see RunConfig.config_hash)
    adjustments.json   (after an automatic recovery) the split / precision in force and their history
    tokenizer/         the tokenizer used (trained here when none was given)
    checkpoints/       checkpoint-<step> (complete, with manifest), at most keep_last of them
    metrics.jsonl      one line per logged step      summary.json  the result
    final/             the trained model (or adapter) and tokenizer
    random-init/       (qlora with random weights) the initial weights, saved to be loaded quantized

tokenizer/, final/ and random-init/ are written into a hidden temporary sibling and renamed into
place (trainfit.files.atomic_dir), so each is complete or absent. A run that fails before its first
checkpoint removes what it created (the whole run directory when it created it), so the same
--out can be used again; a resume that cannot load its checkpoint changes nothing.

Recovery (trainfit.train.recovery): an out-of-memory error, memory pressure, a streak of non-finite
losses or a failed device do not end the run; it goes on with the same global batch, data order,
step count and schedule (a smaller micro-batch with more accumulation, another precision, a fresh
process on the remaining devices). Each train() call of the loop in `_train` is one attempt; the
callbacks see on_train_begin .. on_train_end once per attempt (also when an attempt failed).

The config in force (trainfit.train.in_force.InForce) starts as the user's and changes only
through InForce.change: precision auto for the device, the recorded adjustments, a re-plan after a
device failure, data keys this machine cannot honour, each recovery; every change is a
`config_change` event in metrics.jsonl (the fields old -> new, and why).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainfit.errors import BadInputError, DoesNotFitError, TrainfitError, UnavailableError, require_extra
from trainfit.export.engine import sharding_engine
from trainfit.export.training_args import CONFIG_MODULES, NEEDS_BITSANDBYTES, trainer_config, training_arguments
from trainfit.versions import transformers_major
from trainfit.files import FolderAdditions
from trainfit.train.recovery import checkpoints as ck
from trainfit.train.in_force import InForce
from trainfit.config.run_config import RunConfig, dump_run_config

Log = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    global_step: int
    losses: list[tuple[int, float]]  # (step, loss) of this invocation's logged steps
    summary: dict[str, Any]
    resumed_from: str | None = None
    step_seconds: list[float] = field(default_factory=list)


# The libraries whose warnings `train` and `verify` hide (their FutureWarning / DeprecationWarning /
# UserWarning noise is about their own internals or upcoming API changes, nothing a user of trainfit
# can act on). Warnings raised from trainfit's own modules are not matched.
LIBRARY_MODULES = (r"(transformers|torch|accelerate|peft|trl|datasets|tokenizers|huggingface_hub|safetensors|"
                   r"bitsandbytes|deepspeed)(\.|$)")
_LIBRARY_LOGGERS = ("accelerate", "peft", "trl", "datasets", "torch.distributed")


@contextmanager
def quiet_libraries():
    """While the block runs: library FutureWarning / DeprecationWarning / UserWarning filtered out
    (by the module that warns, so trainfit's own warnings still show), Transformers' logging and
    the other libraries' loggers at ERROR. Leaves alone what the user asked for explicitly
    (python -W / PYTHONWARNINGS, TRANSFORMERS_VERBOSITY)."""
    import logging

    with warnings.catch_warnings():
        if not _user_set_warnings():
            for category in (FutureWarning, DeprecationWarning, UserWarning):
                warnings.filterwarnings("ignore", category=category, module=LIBRARY_MODULES)
        restore = []
        if "TRANSFORMERS_VERBOSITY" not in os.environ:
            hf_logging = sys.modules.get("transformers.utils.logging")
            if hf_logging is not None:
                before = hf_logging.get_verbosity()
                hf_logging.set_verbosity_error()
                restore.append(lambda: hf_logging.set_verbosity(before))
            else:  # not imported yet (importing it costs a second): it reads this when it is
                os.environ["TRANSFORMERS_VERBOSITY"] = "error"
                restore.append(_unset_transformers_verbosity)
            for name in _LIBRARY_LOGGERS:
                logger = logging.getLogger(name)
                level = logger.level
                logger.setLevel(max(level, logging.ERROR))
                restore.append(lambda logger=logger, level=level: logger.setLevel(level))
        try:
            yield
        finally:
            for undo in reversed(restore):
                undo()


def _unset_transformers_verbosity() -> None:
    os.environ.pop("TRANSFORMERS_VERBOSITY", None)
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:  # imported inside the block, at ERROR: back to its default
        hf_logging.set_verbosity_warning()


def _user_set_warnings() -> bool:
    return bool(sys.warnoptions)  # -W options and PYTHONWARNINGS both land here


def world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment (torchrun / accelerate / deepspeed)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def end_distributed() -> None:
    """At the end of a successful run under a launcher: wait for every rank, then tear the process
    group down. Left to the interpreter's exit, gloo's and NCCL's threads can be destroyed while
    still joinable, and a rank that finished its work aborts ("terminate called without an active
    exception") and fails the launch."""
    dist = sys.modules.get("torch.distributed")  # never imported: never initialised
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()


def resolve_device(cfg: RunConfig) -> str:
    import torch

    want = cfg.training.device
    if want == "auto":
        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise UnavailableError("training.device: cuda asked, but torch sees no CUDA device",
                               hint="use device: auto or cpu")
    mps = getattr(torch.backends, "mps", None)
    if want == "mps" and not (mps is not None and mps.is_available()):  # torch would quietly train on the CPU
        raise UnavailableError("training.device: mps asked, but torch sees no Apple GPU (MPS needs macOS on Apple "
                               "silicon)", hint="use device: auto or cpu")
    return want


def check_method_available(cfg: RunConfig, device: str) -> None:
    """QLoRA and 8-bit optimizers need CUDA + bitsandbytes: exit 4 with the reason otherwise."""
    import importlib.util

    t = cfg.training
    if quantized_base(cfg) or t.optimizer in NEEDS_BITSANDBYTES:
        what = ("method qlora" if cfg.method == "qlora" else f"method dpo on a {t.quant} base" if quantized_base(cfg)
                else f"training.optimizer {t.optimizer}")
        if device != "cuda":
            raise UnavailableError(f"{what} needs a CUDA GPU (bitsandbytes kernels); this run's device is {device}",
                                   hint="use method lora (or optimizer adamw) on this machine")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise UnavailableError(f"{what} needs bitsandbytes", hint="pip install bitsandbytes")
    if cfg.training.precision.startswith("fp16") and device == "cpu":
        raise BadInputError("training.precision: fp16 does not train on CPU (valid there: fp32, bf16-mixed, bf16)")
    if sharding_engine(cfg) == "deepspeed":
        require_extra("deepspeed", "deepspeed")


# ---------------------------------------------------------------------------------------------
# run directory
def prepare_run_dir(cfg: RunConfig, run_dir: Path, resume: bool, log: Log, *, processes: int | None = None,
                    legacy: RunConfig | None = None) -> ck.CheckpointInfo | None:
    """Check the run dir against the config (read-only). Returns the checkpoint to resume from.

    processes: the process count the run's global batch was planned for (RunConfig.config_hash);
    legacy: the config with its precision resolved, whose hash an older trainfit stored."""
    digest_file = run_dir / "config.sha256"
    ckpt_dir = run_dir / "checkpoints"
    if run_dir.exists() and not run_dir.is_dir():
        raise BadInputError(f"--out: {run_dir} is a file, not a directory")
    has_run = digest_file.is_file() or ckpt_dir.is_dir()
    if has_run and not resume:
        raise BadInputError(f"--out: {run_dir} already holds a run",
                            hint="pass --resume to continue it, or choose another --out")
    if not has_run:
        if resume:
            log(f"nothing to resume in {run_dir}: starting a new run")
        return None
    stored = digest_file.read_text().strip() if digest_file.is_file() else "(none)"
    expected = cfg.config_hash(processes)
    if stored != expected and (legacy is None or stored != legacy_config_hash(legacy)):
        raise BadInputError(f"--resume: {run_dir} belongs to a different config (hash {stored[:12]}, this config "
                            f"{expected[:12]}; the global batch micro_batch x grad_accum x processes counts, "
                            f"here {cfg.training.micro_batch * cfg.training.grad_accum * (processes or 1)}); "
                            "nothing was changed",
                            hint="use the config stored in the run dir (config.yaml) or another --out")
    best = ck.latest_complete(ckpt_dir, log=log)
    infos, staging = ck.scan(ckpt_dir, verify_hashes=False) if best is None else ([], [])
    if best is None and (infos or staging):
        infos = [ck.inspect_checkpoint(i.path) for i in infos]  # with the hash check, for the message
        bad = "; ".join(f"{i.path.name}: {i.problem}" for i in infos) or "only interrupted writes"
        raise BadInputError(f"--resume: no complete checkpoint in {ckpt_dir} ({bad}); nothing was changed",
                            hint="start over with another --out, or move the checkpoints directory away to "
                                 "start this run again from step 0")
    if best is not None:
        damaged = ck.check_loadable(best.path)
        if damaged:
            name, why = damaged
            raise BadInputError(f"--resume: {best.path.name} cannot be loaded: {name} is damaged ({why}); "
                                "nothing was changed", hint=ck.checkpoint_hint(ckpt_dir, best.path))
    return best


def legacy_config_hash(cfg: RunConfig) -> str:
    """The hash trainfit stored before the global batch replaced its split in RunConfig.config_hash
    (every training key, precision resolved): such a run directory still resumes."""
    import hashlib

    from trainfit.config.run_config import DataConfig, TrainingConfig

    data = cfg.to_dict()
    for key in ("logging", "safety", "monitoring"):
        data.pop(key, None)
    data["checkpointing"].pop("keep_last", None)
    data["checkpointing"].pop("allow_node_local", None)  # added later; where checkpoints live, not their maths
    # Keys that did not exist when this hash was written: left out while at their default.
    for section, cls, keys in (("training", TrainingConfig, LEGACY_ABSENT_TRAINING), ("data", DataConfig, LEGACY_ABSENT_DATA)):
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for key in keys:
            if data[section].get(key) == defaults[key]:
                data[section].pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# Run-config keys added after legacy_config_hash's run directories were written.
LEGACY_ABSENT_TRAINING = ("num_nodes", "hybrid_shard", "fsdp_strategy", "activation_offload", "optimizer_in_backward",
                          "loss", "dora", "image_size", "images_per_example")
LEGACY_ABSENT_DATA = ("keep_in_memory", "num_workers", "prefetch_factor", "packing")


def write_run_files(cfg: RunConfig, run_dir: Path, resume_step: int | None, *, processes: int | None = None) -> None:
    """The config files (left as they are when already identical) and the checkpoints directory;
    leftovers of interrupted atomic writes are removed. metrics.jsonl is trimmed separately
    (trim_metrics), once a resumed checkpoint has loaded. `cfg` is the config as the user wrote it
    (precision "auto" stays auto: it is resolved for the device each start lands on)."""
    from trainfit.files import clean_stale_dirs

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    _write_if_changed(run_dir / "config.yaml", dump_run_config(cfg))
    _write_if_changed(run_dir / "config.sha256", cfg.config_hash(processes) + "\n")
    clean_stale_dirs(run_dir, ATOMIC_DIRS)
    ck.clean_leftovers(run_dir / "checkpoints")


ATOMIC_DIRS = ("tokenizer", "final", "random-init")


def _write_if_changed(path: Path, text: str) -> None:
    from trainfit.files import write_atomic

    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    write_atomic(path, text)


def trim_metrics(run_dir: Path, resume_step: int | None) -> None:
    """Keep the metrics of the trajectory the resumed checkpoint belongs to (logged steps after it
    are re-run), and mark the resume / restart. Event records stay: they are the run's history (e.g.
    the recovery that led to this resume)."""
    from trainfit.files import write_atomic

    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        # Keep the trajectory the checkpoint belongs to; steps after it are re-run.
        keep, dropped = [], 0
        for line in metrics.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                dropped += 1  # a line cut short by a crash
                continue
            if (resume_step is not None and (rec.get("step") or 0) <= resume_step) or (
                    isinstance(rec, dict) and "event" in rec and rec.get("event") != "sample"):
                keep.append(line)
            else:
                dropped += 1
        keep.append(json.dumps({"event": "resume" if resume_step is not None else "restart",
                                "from_step": resume_step or 0, "dropped_records": dropped, "time": time.time()}))
        write_atomic(metrics, "\n".join(keep) + "\n")


# ---------------------------------------------------------------------------------------------
# data, model (the Trainer arguments come from trainfit.export.training_args: what is exported runs)
def get_tokenizer(cfg: RunConfig, run_dir: Path, args, log: Log):
    from trainfit.train.data import check_columns, load_raw_dataset, text_iterator
    from trainfit.train.tokenizer import has_tokenizer_files, load_tokenizer, train_bpe_tokenizer

    saved = run_dir / RUN_TOKENIZER_DIR
    if cfg.tokenizer.path:
        return load_tokenizer(cfg.tokenizer.path), f"local: {cfg.tokenizer.path}"
    if cfg.model.weights == "hub":
        return load_tokenizer(cfg.model.id, "model.id", hub=True), f"hub: {cfg.model.id}"
    if cfg.model.path and has_tokenizer_files(cfg.model.path):
        return load_tokenizer(cfg.model.path, "model.path"), f"local: {cfg.model.path}"
    with args.main_process_first(local=False, desc="tokenizer"):
        if has_tokenizer_files(saved):
            tok, note = _load_saved_tokenizer(saved), f"trained on the corpus earlier in this run ({saved})"
        else:
            log(f"training a byte-level BPE tokenizer ({cfg.tokenizer.vocab_size} tokens) on the corpus")
            raw = load_raw_dataset(cfg)
            check_columns(cfg, raw)  # before spending time on the tokenizer
            train_bpe_tokenizer(text_iterator(cfg, raw, cfg.tokenizer.train_max_bytes),
                                      cfg.tokenizer.vocab_size, saved)
            tok, note = load_tokenizer(saved), "byte-level BPE trained on the corpus"
    from trainfit.train.model_build import short_vocabulary_note

    short = short_vocabulary_note(cfg, len(tok))
    if short:  # the model is still built at the planned size; the user learns what the corpus gave
        log(f"warning: {short}")
        note += f"; {short}"
    return tok, note



RUN_TOKENIZER_DIR = "tokenizer"


def _load_saved_tokenizer(saved: Path):
    """The tokenizer this run trained and saved; a damaged one names itself and the way out (the
    run's token ids depend on it, so it cannot silently be retrained under a resumed run)."""
    from trainfit.train.tokenizer import load_tokenizer

    try:
        return load_tokenizer(saved, key="the run's tokenizer")
    except BadInputError as exc:
        detail = exc.message.split(f"{saved}: ", 1)[-1]
        raise BadInputError(f"the tokenizer this run trained on its corpus ({saved}) is damaged: {detail}",
                            hint=f"restore {saved} from a backup, or start the run again with another --out") from None

def build_dataset(in_force: InForce, tokenizer, args, log: Log = lambda m: None):
    """The training dataset, once the data keys this machine cannot honour are adjusted in the
    config in force (a recorded change): trainfit.train.data.for_this_machine and
    build_train_dataset (caches, streaming, packing)."""
    from trainfit.train.data import build_train_dataset, for_this_machine

    cfg, notes = for_this_machine(in_force.cfg)
    for note in notes:
        log(note)
    in_force.change(cfg, "; ".join(notes), source="data")
    with args.main_process_first(local=False, desc="dataset"):
        return build_train_dataset(in_force.cfg, tokenizer)


def quantized_base(cfg: RunConfig) -> bool:
    """The base model is loaded quantized: qlora, or dpo with training.quant (LoRA on a 4/8-bit base)."""
    return cfg.method == "qlora" or (cfg.method == "dpo" and cfg.training.quant != "none")


def _quantization(cfg: RunConfig):
    if not quantized_base(cfg):
        return None
    import torch
    from transformers import BitsAndBytesConfig

    quant = cfg.training.quant if cfg.training.quant != "none" else "nf4-dq"
    if quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=quant == "nf4-dq",
                              bnb_4bit_compute_dtype=torch.bfloat16)


def make_model(cfg: RunConfig, tokenizer, run_dir: Path, log: Log, args=None):
    """The model to train (PEFT-wrapped for lora/qlora), its reference for DPO, and the BuiltModel.
    `args` (TrainingArguments) lets the main process write random-init/ before the others read it."""
    import copy

    import torch

    from trainfit.export.peft_config import uses_lora
    from trainfit.train.model_build import build_model, lora_config

    qconf = _quantization(cfg)
    if qconf is not None and cfg.model.weights == "random":
        # bitsandbytes quantizes while loading: save the random init once, then load it quantized.
        if args is not None:
            with args.main_process_first(local=False, desc="random init"):
                init_dir = save_random_init(cfg, tokenizer, run_dir / "random-init")
        else:
            init_dir = save_random_init(cfg, tokenizer, run_dir / "random-init")
        from transformers import AutoModelForCausalLM

        built = build_model(cfg, tokenizer)
        built = type(built)(AutoModelForCausalLM.from_pretrained(str(init_dir), quantization_config=qconf),
                            built.spec, built.spec_note, built.weights, built.hf_config)
    else:
        built = build_model(cfg, tokenizer, quantization_config=qconf)
    model = built.model
    if cfg.training.precision in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if cfg.training.precision == "bf16" else torch.float16)
    ref = None
    use_lora = uses_lora(cfg)
    if cfg.method == "dpo" and cfg.training.dpo_reference == "separate":
        ref = copy.deepcopy(model).eval()  # a frozen copy of the starting weights
        for p in ref.parameters():
            p.requires_grad_(False)
    if use_lora:
        from peft import get_peft_model

        if qconf is not None:
            prepare_quantized_base(model, gradient_checkpointing=cfg.training.grad_checkpointing != "none")
        model = get_peft_model(model, lora_config(cfg))
    log(f"model: {built.spec.id if built.spec else cfg.model.path} weights {built.weights}; "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,} trainable")
    return model, ref, built


def prepare_quantized_base(model, *, gradient_checkpointing: bool) -> None:
    """PEFT's prepare_model_for_kbit_training without its fp32 cast: the base frozen and, with
    checkpointing, the input embeddings made to require grad (reentrant checkpointing needs an input
    with a gradient). PEFT also casts every non-quantised weight to fp32, which for Llama 3 8B is
    2.1 GB more and an fp32 residual stream; the memory model counts that only for tools that do it
    (TrainingSetup.kbit_upcast)."""
    for param in model.parameters():
        param.requires_grad_(False)
    if gradient_checkpointing:
        model.enable_input_require_grads()
        model.gradient_checkpointing_enable()


def is_complete_model_dir(path: Path) -> bool:
    """config.json and every weights file it needs (one file, or all shards of an index)."""
    if not (path / "config.json").is_file():
        return False
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (path / index).is_file():
            try:
                shards = set(json.loads((path / index).read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return False
            return bool(shards) and all(isinstance(f, str) and (path / f).is_file() for f in shards)
    return (path / "model.safetensors").is_file() or (path / "pytorch_model.bin").is_file()


def save_random_init(cfg: RunConfig, tokenizer, init_dir: Path) -> Path:
    """The run's random initial weights saved once (atomically: the directory appears complete or
    not at all). An incomplete one, left by an older version, is written again: it is made from
    the run's seed, so the content is the same."""
    from trainfit.files import atomic_dir
    from trainfit.train.model_build import build_model

    if is_complete_model_dir(init_dir):
        return init_dir
    try:
        with atomic_dir(init_dir, replace=init_dir.exists()) as tmp:
            build_model(cfg, tokenizer).model.save_pretrained(str(tmp))
    except FileExistsError:
        pass  # another process of this run published the same (seeded) weights first
    return init_dir


def make_trainer(cfg: RunConfig, model, ref, tokenizer, dataset, trainer_args: tuple[str, dict], callbacks: list,
                 log: Log, ckpt_dir: Path):
    """The Trainer for the method; trainer_args is trainfit.export.training_args.trainer_config's
    (config class name, kwargs), the same pair training_args.yaml is written from."""
    import importlib

    from transformers import Trainer, default_data_collator

    from trainfit.train.trainer_ext import with_trainfit

    config_name, kwargs = trainer_args
    # A NaN / inf loss is logged as what it is: Transformers' filter would log the average of the
    # earlier steps instead, and metrics.jsonl (and `trainfit report`) would show a healthy run.
    kwargs = {**kwargs, "logging_nan_inf_filter": False}
    args = getattr(importlib.import_module(CONFIG_MODULES[config_name]), config_name)(**kwargs)
    keep = cfg.checkpointing.keep_last
    if cfg.method == "pretrain":
        cls = with_trainfit(Trainer, ckpt_dir=ckpt_dir, keep_last=keep, log=log)
        return cls(model=model, args=args, train_dataset=dataset,
                   data_collator=default_data_collator, processing_class=tokenizer, callbacks=callbacks)
    if cfg.method == "dpo":
        from trl import DPOTrainer

        cls = with_trainfit(DPOTrainer, ckpt_dir=ckpt_dir, keep_last=keep, log=log)
        return cls(model=model, ref_model=ref, args=args, train_dataset=dataset, processing_class=tokenizer,
                   callbacks=callbacks)
    from trl import SFTTrainer  # every other method: full fine-tuning, lora, qlora

    cls = with_trainfit(SFTTrainer, ckpt_dir=ckpt_dir, keep_last=keep, log=log)
    return cls(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)


# ---------------------------------------------------------------------------------------------
def median_after_warmup(values: list[float], warmup: int = 2) -> float | None:
    tail = values[warmup:] if len(values) > warmup else values
    return statistics.median(tail) if tail else None


def run_training(cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, stop_after: int | None = None,
                 quiet: bool = False, log: Log | None = None, extra_callbacks: list | None = None,
                 write_summary: bool = True, recover: bool = True) -> RunResult:
    """Train; the Python twin of `trainfit train`. `stop_after` stops (with a checkpoint) after
    that many optimizer steps without changing the schedule, so --resume continues the same run.
    `recover` (default on): recover from out-of-memory errors, non-finite losses and device
    failures (trainfit.train.recovery); off: such a failure ends the run as it is.

    When it fails before writing a checkpoint, what it created in run_dir is removed again (the
    whole directory when it created it), so the same run_dir can be used for the next try."""
    require_extra("torch", "train")
    require_extra("trl", "train")
    from trainfit.train.recovery.adjustments import (ADJUSTMENTS, Adjustments, apply_adjustments, load_adjustments,
                                                     restart_pending)

    rank, world_size = world()
    log = log or (lambda m: None)
    say = log if rank == 0 else (lambda m: None)
    from trainfit.config.run_config import shared_storage_errors

    for problem in shared_storage_errors(cfg, str(run_dir)):  # before anything is read or written
        raise BadInputError(problem)
    run_dir = Path(run_dir).resolve()
    user_cfg = cfg
    requests = _recovery_requests(run_dir, user_cfg) if recover else []
    if requests and not resume and restart_pending(run_dir, requests[0]["config_hash"]):
        say(f"continuing {run_dir.name} after a restart one of its processes asked for "
            f"({requests[0].get('reason', 'recovery')})")
        resume = True
    if not resume:
        requests = []
    adj = load_adjustments(run_dir) if resume and recover else Adjustments()
    processes = adj.processes or (requests[0].get("processes") if requests else None) or world_size
    replan = bool(adj.replan) or any(r.get("kind") == "device_lost" for r in requests)
    # after a device failure the run lands wherever it can: an explicit device: cuda may be gone
    device = resolve_device(_with_device(user_cfg, "auto") if replan else user_cfg)
    from trainfit.train.predictions import hardware_profile

    in_force = InForce(user_cfg)
    hardware = hardware_profile() if user_cfg.training.precision == "auto" else None
    resolved = in_force.change(user_cfg.for_device(device, hardware), f"precision auto made concrete for {device}",
                               source="device")
    in_force.change(apply_adjustments(resolved, adj, world_size),
                    f"the split and precision earlier recoveries chose (RUN_DIR/{ADJUSTMENTS}), the "
                    f"global batch kept over {world_size} process(es)", source="adjustments")
    precision_note = None
    if replan:
        fitted, precision_note = _precision_for_device(in_force.cfg, device)
        in_force.change(fitted, f"after a device failure: {precision_note}", source="device_failure")
    check_method_available(in_force.cfg, device)
    from trainfit.train.data import cache_additions, check_cache_dir

    check_cache_dir(in_force.cfg)  # before anything is written or read
    resume_from = prepare_run_dir(user_cfg, run_dir, resume, say, processes=processes, legacy=resolved)
    finished = finished_summary(run_dir, resume_from)
    if finished is not None:
        say(f"{run_dir.name} already finished: step {finished['global_step']} of {finished['max_steps']}; "
            "nothing to train")
        return RunResult(run_dir, finished["global_step"], [], finished, resumed_from=resume_from.path.name)
    undo = FailedStartCleanup(run_dir, cache_additions(in_force.cfg.data.cache_dir, run_dir)) if rank == 0 else None
    start = _Start(run_dir, device, resume_from, adj, requests, processes, precision_note)
    asked = _Asked(stop_after, quiet, say, log, extra_callbacks, write_summary, recover)
    try:
        return _train(in_force, start, asked)
    except BaseException:
        if undo is not None:
            undo(say)
        raise


@dataclass(frozen=True)
class _Start:
    """What run_training found out about this start: where the run lands and what it continues."""

    run_dir: Path
    device: str
    resume_from: ck.CheckpointInfo | None
    adj: Any  # recovery.adjustments.Adjustments read from RUN_DIR/adjustments.json
    requests: list  # what failed ranks recorded for this restart (recovery.adjustments.read_requests)
    processes: int  # processes the global batch was planned for
    precision_note: str | None  # after a device failure: the precision changed for the new device

    @property
    def resume_step(self) -> int | None:
        return self.resume_from.step if self.resume_from else None


@dataclass(frozen=True)
class _Asked:
    """What the caller of run_training asked for (its keyword arguments)."""

    stop_after: int | None
    quiet: bool
    say: Log  # messages for the user (rank 0 only)
    log: Log  # every rank's messages
    extra_callbacks: list | None
    write_summary: bool
    recover: bool


def _with_device(cfg: RunConfig, device: str) -> RunConfig:
    import dataclasses

    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, device=device))


def _recovery_requests(run_dir: Path, user_cfg: RunConfig) -> list[dict[str, Any]]:
    """Requests failed ranks of this run (this config) recorded for the next start."""
    from trainfit.train.recovery.adjustments import read_requests

    out = []
    for req in read_requests(run_dir):
        n = req.get("processes")
        if isinstance(n, int) and n >= 1 and req.get("config_hash") == user_cfg.config_hash(n):
            out.append(req)
    return out


def _precision_for_device(cfg: RunConfig, device: str) -> tuple[RunConfig, str | None]:
    """After a device failure: the config's precision, or the next one down (fp16 -> bf16 -> fp32)
    the device the run landed on trains in."""
    import dataclasses

    from trainfit.train.recovery.precision import next_precision, supported_precisions

    precision = cfg.training.precision
    supported = supported_precisions(device)
    if (supported is None or precision in supported) and not (device == "cpu" and precision.startswith("fp16")):
        return cfg, None
    new = next_precision(precision, supported) or "fp32"
    note = f"precision {precision} -> {new} ({device} does not train in {precision})"
    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, precision=new)), note


def finished_summary(run_dir: Path, resume_from: ck.CheckpointInfo | None) -> dict[str, Any] | None:
    """The run's summary when the checkpoint to resume from is its last step (the Trainer would
    otherwise run one step past the schedule's end); None when there is training left."""
    if resume_from is None or not (run_dir / "summary.json").is_file():
        return None
    try:
        state = json.loads((resume_from.path / "trainer_state.json").read_text(encoding="utf-8"))
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        done = state["global_step"] >= state["max_steps"] > 0 and summary["global_step"] == state["global_step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the checkpoint check already passed; let the Trainer decide
    return summary if done else None


class FailedStartCleanup:
    """Remembers what run_dir held before this invocation (trainfit.files.FolderAdditions); called
    after a failure, removes what the invocation created, unless it wrote a checkpoint (then
    everything stays, for --resume). A directory it created is removed whole (and parent
    directories it created, when empty). `cache`: the Arrow caches it adds outside run_dir
    (trainfit.train.data.cache_additions), removed with it."""

    def __init__(self, run_dir: Path, cache: FolderAdditions | None = None) -> None:
        self.run_dir = run_dir
        self.cache = cache
        self.added = FolderAdditions(run_dir)
        self.checkpoints = self._checkpoints()

    def _checkpoints(self) -> set[str]:
        ckpt_dir = self.run_dir / "checkpoints"
        if not ckpt_dir.is_dir():
            return set()
        return {p.name for p in ckpt_dir.iterdir() if p.name.startswith("checkpoint-")}

    def __call__(self, say: Log) -> None:
        try:
            if not self.run_dir.is_dir() or self._checkpoints() - self.checkpoints:
                return  # nothing written, or a checkpoint worth resuming from
            from trainfit.train.recovery.adjustments import read_requests

            if read_requests(self.run_dir):
                return  # a rank asked for a restart with another split: the restart needs the run
            if self.cache is not None and self.cache.undo():
                say(f"removed the data cache files this attempt wrote in {self.cache.root}")
            removed = self.added.undo()
            if removed == ["."]:
                say(f"removed {self.run_dir} again (the run failed before its first checkpoint)")
            elif removed:
                say(f"removed what this attempt created in {self.run_dir}: {', '.join(removed)}")
        except OSError as exc:  # never hide the failure that brought us here
            say(f"could not clean up {self.run_dir}: {exc}")


def _train(in_force: InForce, start: _Start, asked: _Asked) -> RunResult:
    from trainfit.files import atomic_dir
    from trainfit.train.recovery import faults
    from trainfit.train.recovery.adjustments import read_requests
    from trainfit.train.recovery.oom import free_device_memory
    from trainfit.train.recovery.restart import Relaunch, init_restarted_process_group
    from trainfit.train.recovery.session import RecoverySession
    from trainfit.train.callbacks import device_memory

    run_dir, device, resume_from, stop_after = start.run_dir, start.device, start.resume_from, asked.stop_after
    say, log, recover = asked.say, asked.log, asked.recover
    rank, world_size = world()
    # TRAINFIT_FAKE_MACHINE: a scripted machine for the monitor instead of this one (tests, demos);
    # read first, so a bad script is refused before any work
    fake_machine = faults.fake_machine_from_env(lambda: monitor.monitor.current_step)
    ckpt_dir = run_dir / "checkpoints"
    arg_inputs = dict(device=device, output_dir=str(ckpt_dir), world_size=world_size,
                      transformers_major=transformers_major())
    from transformers import TrainingArguments

    if world_size > 1 and sharding_engine(in_force.cfg) is None and device in ("cuda", "cpu"):
        backend = in_force.cfg.distributed.backend if in_force.cfg.distributed.backend != "auto" else (
            "nccl" if device == "cuda" else "gloo")
        init_restarted_process_group(backend)  # after a torchrun restart only
    # initialises the process group under a launcher
    probe_args = TrainingArguments(**training_arguments(in_force.cfg, **arg_inputs))
    resume_step = start.resume_step
    if rank == 0:
        write_run_files(in_force.user, run_dir, resume_step, processes=start.processes)
    probe_args.distributed_state.wait_for_everyone()
    session = RecoverySession(run_dir, in_force.user, device=device, rank=rank, world_size=world_size,
                                       say=say, log=log, config_hash=in_force.user.config_hash(start.processes),
                                       stop_after=stop_after, enabled=recover)
    try:
        in_force.change(session.start(in_force.cfg, start.adj, start.requests, probe_args.distributed_state),
                        _restart_reason(start.requests), source="restart_requests")
        if resume_from:
            say(f"resuming from {resume_from.path.name} (step {resume_from.step})")
        tokenizer, tok_note = get_tokenizer(in_force.cfg, run_dir, probe_args, say)
        dataset = build_dataset(in_force, tokenizer, probe_args, say)
        watch = _watch(in_force, start, asked, session, fake_machine, tokens_fn=lambda: trainer.tokens_seen())
        timer, writer, plan, monitor, fault_plan = watch.timer, watch.writer, watch.plan, watch.monitor, watch.fault_plan
        checkpoint = str(resume_from.path) if resume_from else None
        started = time.perf_counter()

        def replan(spec) -> None:  # after a device failure: the split for the device the run landed on
            if session.adj.replan:
                cfg, reason = session.replan_for_device(in_force.cfg, spec, device, start.precision_note)
                in_force.change(cfg, reason, source="device_replan", step=resume_step)

        while True:
            model, ref, built = _build(in_force, tokenizer, dataset, run_dir, say, probe_args, watch.callbacks,
                                       ckpt_dir, arg_inputs, recover, replan)
            trainer = built.trainer
            plan.details = _plan_details(built, in_force.cfg, device, world_size, stop_after)
            if monitor.monitor.predicted_peak_bytes is None:
                monitor.monitor.predicted_peak_bytes = plan.details["predicted"].get("total_bytes")
            if built.weights.startswith("random") and session.attempts == 0:
                say("weights: RANDOM initialisation (not a pretrained model)")
            session.attach(trainer, in_force.cfg)
            failure = None
            try:
                trainer.train(resume_from_checkpoint=checkpoint)
            except BaseException as exc:
                failure = session.classify(exc)
                if failure is None:
                    if world_size > 1 and recover and isinstance(exc, Exception) and read_requests(run_dir):
                        # a collective broke because another rank stopped to ask for a restart
                        raise TrainfitError(f"rank {rank} stopped: another rank asked every rank to restart with a "
                                            f"new split ({type(exc).__name__}: {str(exc)[:120]})") from None
                    raise
            # (the exception and the frames it held, activations included, are released here)
            nxt = session.after_attempt(trainer, failure)
            if nxt is None:
                break
            _release(trainer)
            del trainer, model, ref, built
            free_device_memory()
            if isinstance(nxt, Relaunch):
                summary = session.relaunch(nxt, stop_after=stop_after, quiet=asked.quiet, faults_plan=fault_plan)
                return RunResult(run_dir, summary["global_step"], _logged_losses(run_dir), summary,
                                 str(resume_from.path) if resume_from else None, list(timer.step_seconds))
            in_force.change(nxt.cfg, nxt.reason, source=nxt.kind, step=_checkpoint_step(nxt.checkpoint))
            checkpoint = nxt.checkpoint
        wall = time.perf_counter() - started
        losses = sorted({r["step"]: r["loss"] for r in writer.records}.items())  # steps trained again: the last
        summary: dict[str, Any] = {}
        if rank == 0:
            with atomic_dir(run_dir / "final", replace=True) as final:
                trainer.save_model(str(final))
                tokenizer.save_pretrained(str(final))
            summary = build_summary(in_force.cfg, built, trainer, timer, writer, device, world_size, wall,
                                    resume_from, tok_note, device_memory(), session, in_force.changes)
            if asked.write_summary:
                from trainfit.files import write_atomic

                write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        trainer.accelerator.wait_for_everyone()
        return RunResult(run_dir, trainer.state.global_step, losses, summary,
                         str(resume_from.path) if resume_from else None, list(timer.step_seconds))
    finally:
        session.close()


@dataclass(frozen=True)
class _Watch:
    """The callbacks every attempt gets, and those of them the runner reads back."""

    callbacks: list
    timer: Any  # callbacks.StepTimer
    writer: Any  # callbacks.MetricsWriter
    plan: Any  # callbacks.RunPlan
    monitor: Any  # monitor.MonitorCallback
    fault_plan: Any  # faults.FaultPlan or None


def _watch(in_force: InForce, start: _Start, asked: _Asked, session, fake_machine, tokens_fn) -> _Watch:
    """Step timing, metrics.jsonl, progress, the live monitor, the safety policies, injected faults
    and the recovery callback (last: it stops an attempt at a boundary)."""
    from trainfit.train.recovery import faults
    from trainfit.train.callbacks import BeforeFirstStep, MetricsWriter, Progress, RunPlan, StepTimer, StopAt

    rank, world_size = world()
    run_dir, device, stop_after, resume_step = start.run_dir, start.device, asked.stop_after, start.resume_step
    say, log = asked.say, asked.log
    timer = StepTimer()
    metrics = run_dir / "metrics.jsonl" if rank == 0 else None
    writer = MetricsWriter(metrics, tokens_fn, timer, world_size, stop_step=stop_after)
    shown = in_force.cfg.logging.progress
    interactive = not asked.quiet and shown != "lines" and (shown == "bar" or os.isatty(2))
    progress = Progress("bar" if interactive else "lines",
                        f"{in_force.cfg.method} {in_force.cfg.name or ''}".strip(), writer, stop_step=stop_after)
    if not interactive:
        # Log-line mode: the libraries' own tqdm bars (e.g. "Writing model shards") would only add noise.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    from trainfit.train.monitor.callback import build_monitor

    # The live monitor: machine samples into metrics.jsonl, leak warnings, the dashboard (main
    # process only; the predicted peak is filled in once the model is built).
    monitor = build_monitor(run_dir, settings=in_force.cfg.monitoring, total_steps=stop_after,
                            interactive=interactive, tokens_fn=tokens_fn, progress=progress,
                            shape=(in_force.cfg.training.micro_batch, in_force.cfg.training.seq_len), say=say,
                            **_fake_monitor_arguments(fake_machine))
    # metrics.jsonl is trimmed to the resumed trajectory only once the checkpoint has loaded; the
    # config changes made so far are written then too (a start that fails earlier writes nothing)
    trim = BeforeFirstStep((lambda: (trim_metrics(run_dir, resume_step), in_force.record_to(metrics)))
                           if rank == 0 else None)
    fault_plan = faults.from_env()
    injected = [faults.FaultInjector(fault_plan, rank, log)] if fault_plan is not None else []
    # The callbacks every attempt gets; extra_callbacks (monitor, safety policies) go before the
    # fault injector and the recovery callback, which stays last (it stops an attempt at a boundary).
    from trainfit.train.monitor.safety import safety_callbacks

    # Thermal / battery pauses, memory pressure, checkpoint cadence and clean stops on SIGINT /
    # SIGTERM (core/plan/modes.py: thresholds of the config's safety.mode). The policies read
    # the monitor's latest sample each time they look (a function, not the sample of now).
    if monitor.enabled:
        sample_fn, leak_events = (lambda: monitor.monitor.latest_sample), monitor.monitor.events_since
    else:
        sample_fn = leak_events = None
        say("monitoring.enabled is false: no machine readings, so thermal, battery and memory-pressure "
            "protection are off for this run")
    safety = safety_callbacks(in_force.cfg.safety.mode, sample_fn, run_dir=run_dir, leak_events=leak_events,
                              interactive=interactive, log=say, device=device, world_size=world_size, rank=rank,
                              interruption_hours=in_force.cfg.safety.interruption_hours,
                              **(fake_machine.safety_overrides if fake_machine is not None else {}))
    plan = RunPlan(metrics)
    callbacks = [trim, plan, timer, StopAt(stop_after), writer, progress, monitor] + \
        list(asked.extra_callbacks or []) + injected + safety + [session.callback]
    return _Watch(callbacks, timer, writer, plan, monitor, fault_plan)


def _restart_reason(requests: list[dict[str, Any]]) -> str:
    """Why RecoverySession.start changed the config: the failed ranks' requests, or (several
    processes) the ranks agreeing on one split."""
    asked = [r.get("reason") for r in requests if r.get("reason")]
    if asked:
        return "what failed ranks asked for before this restart: " + "; ".join(asked)
    return "every rank trains with the smallest split any rank computed"


def _checkpoint_step(checkpoint: str | None) -> int:
    """The step a checkpoint-<step> folder holds (0: no checkpoint, the start)."""
    return int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0


def _fake_monitor_arguments(machine) -> dict[str, Any]:
    """build_monitor's arguments for a scripted machine (trainfit.train.recovery.faults.FAKE_MACHINE_ENV)."""
    if machine is None:
        return {}
    from trainfit.train.monitor.leaks import LeakDetector

    spec = machine.spec
    out: dict[str, Any] = {"sampler": machine.sampler}
    if "interval_seconds" in spec:
        out["interval_seconds"] = float(spec["interval_seconds"])
    if "leak_detector" in spec:
        out["leak_detector"] = LeakDetector(**spec["leak_detector"])
    for key in ("leak_read_seconds", "leak_check_seconds"):
        if key in spec:
            out[key] = float(spec[key])
    if "memory_reading" in spec:
        out["memory_fn"] = machine.memory_reading
    return out


@dataclass
class _Built:
    """One attempt's Trainer and model description."""

    trainer: Any
    spec: Any
    spec_note: str
    weights: str


def _build(in_force: InForce, tokenizer, dataset, run_dir: Path, say: Log, probe_args, callbacks: list,
           ckpt_dir: Path, arg_inputs: dict, recover: bool, replan: Callable[[Any], None] = lambda spec: None):
    """The model (and DPO reference) and the Trainer of one attempt; `replan` may change the
    config in force once the model's description is known (after a device failure). Out of
    memory here (before a step ran) is not something a smaller micro-batch fixes: DoesNotFitError."""
    from trainfit.train.recovery.oom import classify

    try:
        model, ref, built = make_model(in_force.cfg, tokenizer, run_dir, say, probe_args)
        replan(built.spec)
        cfg = in_force.cfg
        trainer = make_trainer(cfg, model, ref, tokenizer, dataset, trainer_config(cfg, **arg_inputs), callbacks,
                               say, ckpt_dir)
    except BaseException as exc:
        failure = classify(exc) if recover else None
        if failure is None or failure.kind != "oom":
            raise
        raise DoesNotFitError(f"the model does not fit in memory before training starts: {failure.describe()}",
                              hint="use a smaller model, LoRA/QLoRA, or a device with more memory; `trainfit plan` "
                                   "finds a setting that fits") from None
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # it prints log dicts on stdout; ours go to stderr
    return model, ref, _Built(trainer, built.spec, built.spec_note, built.weights)


def _release(trainer) -> None:
    """Drop what an abandoned attempt's Trainer holds (model wrappers, optimizer state) so that the
    next attempt starts with the device's memory free."""
    try:
        trainer.accelerator.free_memory()
    except Exception:  # noqa: BLE001  (a failed device: nothing to free there)
        pass
    for name in ("model_wrapped", "optimizer", "lr_scheduler", "deepspeed"):
        if hasattr(trainer, name):
            try:
                setattr(trainer, name, None)
            except Exception:  # noqa: BLE001
                pass


def _logged_losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of the logged steps in metrics.jsonl (the last record of a step counts)."""
    out: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "event" not in rec and "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return sorted(out.items())


def _plan_details(built, cfg: RunConfig, device: str, world_size: int, stop_after: int | None) -> dict[str, Any]:
    """What an attempt is planned to do (the run_plan event; the dashboard draws its memory curve
    against the predicted total). A prediction that fails never stops a run: its reason is kept."""
    from trainfit.train.predictions import predict

    try:
        pred = predict(built.spec, cfg.to_setup(device, num_gpus=world_size if device == "cuda" else 1),
                       built.spec_note)
        predicted = {"tensor_peak_bytes": pred.tensor_peak_bytes, "total_bytes": pred.total_bytes,
                     "step_seconds": pred.step_seconds, "unavailable": pred.unavailable}
    except Exception as exc:  # noqa: BLE001 - the summary reports why, when it predicts again
        predicted = {"unavailable": {"total_bytes": f"{type(exc).__name__}: {exc}"}}
    t = cfg.training
    return {"method": cfg.method, "model": built.spec.id if built.spec else cfg.model.path, "device": device,
            "processes": world_size, "stop_step": stop_after, "predicted": predicted,
            "training": {"micro_batch": t.micro_batch, "grad_accum": t.grad_accum,
                         "grad_checkpointing": t.grad_checkpointing, "precision": t.precision},
            "global_batch": t.micro_batch * t.grad_accum * world_size}


def build_summary(cfg, built, trainer, timer, writer, device, world_size, wall, resume_from, tok_note,
                  memory, session=None, config_changes=()) -> dict[str, Any]:
    from trainfit.train.predictions import predict

    model = trainer.model
    measured_step = median_after_warmup(timer.step_seconds)
    pred = predict(built.spec, cfg.to_setup(device, num_gpus=world_size if device == "cuda" else 1),
                   built.spec_note)
    measured_peak = memory.get("cuda_max_allocated_bytes", memory["peak_rss_bytes"])
    records = writer.records
    return {
        "method": cfg.method, "name": cfg.name, "model": built.spec.id if built.spec else cfg.model.path,
        "weights": built.weights, "tokenizer": tok_note, "device": device, "processes": world_size,
        "params_total": sum(p.numel() for p in model.parameters()),
        "params_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "global_batch": cfg.training.micro_batch * cfg.training.grad_accum * world_size,
        # how a step was computed at the end (a recovery may have split the micro-batch or changed the
        # precision; RUN_DIR/adjustments.json) and what recovered
        "training": {"micro_batch": cfg.training.micro_batch, "grad_accum": cfg.training.grad_accum,
                     "grad_checkpointing": cfg.training.grad_checkpointing, "precision": cfg.training.precision},
        "recoveries": list(session.adj.history) if session is not None else [],
        # how this invocation's config in force came from config.yaml (train/in_force.py)
        "config_changes": [{k: v for k, v in c.as_event().items() if k not in ("event", "time")}
                           for c in config_changes],
        "global_step": trainer.state.global_step, "max_steps": trainer.state.max_steps,
        "resumed_from": resume_from.path.name if resume_from else None,
        "first_loss": records[0]["loss"] if records else None, "final_loss": records[-1]["loss"] if records else None,
        "wall_seconds": wall,
        "measured": {"step_seconds_median": measured_step, "steps_timed": len(timer.step_seconds),
                     "peak_bytes": measured_peak,
                     "peak_kind": "cuda_max_allocated" if "cuda_max_allocated_bytes" in memory else "peak_rss",
                     **memory,
                     "tokens_per_second_median": statistics.median([r["tokens_per_second"] for r in records])
                     if records else None},
        "predicted": {"tensor_peak_bytes": pred.tensor_peak_bytes, "total_bytes": pred.total_bytes,
                      "step_seconds": pred.step_seconds, "unavailable": pred.unavailable},
        "ratios": {
            "peak_memory_measured_over_predicted_total": (measured_peak / pred.total_bytes
                                                          if pred.total_bytes else None),
            "step_seconds_measured_over_predicted": (measured_step / pred.step_seconds
                                                     if measured_step and pred.step_seconds else None),
        },
    }
