"""The run directory of `trainfit train` (the layout: trainfit.train.runner): what a start or a
--resume finds in it and checks, config.yaml / config.sha256 written, metrics.jsonl trimmed to the
resumed trajectory, and what a failed start created removed again."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

from trainfit.config.run_config import RunConfig, dump_run_config
from trainfit.errors import BadInputError
from trainfit.files import FolderAdditions
from trainfit.train.recovery import checkpoints as ck

Log = Callable[[str], None]


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
