"""RUN_DIR/adjustments.json (the split and precision in force, their history, the global batch
they keep) and the requests a failed rank leaves in RUN_DIR/.recovery for the ranks torchrun
starts again (trainfit.train.recovery)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.errors import BadInputError
from trainfit.train.recovery.split import Split, split_for_world, with_split, with_training

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

ADJUSTMENTS = "adjustments.json"
REQUEST_DIR = ".recovery"


@dataclass
class Adjustments:
    processes: int | None = None  # processes the global batch was planned for
    global_batch: int | None = None
    training: dict[str, Any] = field(default_factory=dict)  # micro_batch, grad_accum, grad_checkpointing, precision
    history: list[dict[str, Any]] = field(default_factory=list)
    replan: dict[str, Any] | None = None  # set by a device failure: the next start re-plans for its device

    def to_json(self) -> str:
        return json.dumps({"version": 1, **dataclasses.asdict(self)}, indent=2) + "\n"

    @property
    def empty(self) -> bool:
        return not (self.training or self.history or self.replan)


_TRAINING_KEYS = ("micro_batch", "grad_accum", "grad_checkpointing", "precision")


def load_adjustments(run_dir: Path) -> Adjustments:
    """RUN_DIR/adjustments.json (empty when there is none); BadInputError when it is damaged."""
    path = Path(run_dir) / ADJUSTMENTS
    if not path.is_file():
        return Adjustments()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.get("version") != 1:
            raise ValueError("not a version-1 adjustments record")
        training = {k: v for k, v in (raw.get("training") or {}).items() if k in _TRAINING_KEYS}
        for key in ("micro_batch", "grad_accum"):
            if key in training and (type(training[key]) is not int or training[key] < 1):
                raise ValueError(f"training.{key} must be a positive integer")
        adj = Adjustments(raw.get("processes"), raw.get("global_batch"), training,
                          list(raw.get("history") or []), raw.get("replan"))
        for key in ("processes", "global_batch"):
            value = getattr(adj, key)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{key} must be a positive integer")
    except (OSError, ValueError, TypeError) as exc:
        raise BadInputError(f"--resume: {path} is damaged ({exc}); it records how recoveries changed the run's "
                            "split and precision", hint="restore it, or delete it to resume with the config's "
                            "own split (an OOM may then recur)") from None
    return adj


def save_adjustments(run_dir: Path, adj: Adjustments) -> None:
    from trainfit.files import write_atomic

    write_atomic(Path(run_dir) / ADJUSTMENTS, adj.to_json())


def write_request(run_dir: Path, rank: int, payload: dict[str, Any]) -> Path:
    from trainfit.files import write_atomic

    folder = Path(run_dir) / REQUEST_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"request-rank{rank}.json"
    write_atomic(path, json.dumps(payload, indent=2) + "\n")
    return path


def read_requests(run_dir: Path, config_hash: str | None = None) -> list[dict[str, Any]]:
    """The recorded requests of failed ranks (of this config), oldest first; unreadable ones skipped."""
    folder = Path(run_dir) / REQUEST_DIR
    out = []
    for p in sorted(folder.glob("request-rank*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and (config_hash is None or rec.get("config_hash") == config_hash):
            out.append(rec)
    return sorted(out, key=lambda r: (r.get("time", 0), r.get("rank", 0)))


def clear_requests(run_dir: Path) -> None:
    shutil.rmtree(Path(run_dir) / REQUEST_DIR, ignore_errors=True)


def restart_pending(run_dir: Path, config_hash: str) -> bool:
    """True in a process torchrun started again after one of this run's ranks asked for it."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0"):
        return False
    return bool(read_requests(run_dir, config_hash))


def planned_processes(adj: Adjustments, world_size: int) -> int:
    return adj.processes or world_size


def apply_adjustments(cfg: "RunConfig", adj: Adjustments, world_size: int) -> "RunConfig":
    """`cfg` (the user's config, precision resolved for the device) with the recorded split and
    precision, split for `world_size` processes so that the global batch stays the planned one."""
    t = cfg.training
    target = adj.global_batch or t.micro_batch * t.grad_accum * planned_processes(adj, world_size)
    out = with_training(cfg, **adj.training)
    split = Split.of(out)
    if split.micro_batch * split.grad_accum * world_size != target:
        new = split_for_world(target, world_size, split.micro_batch, split.grad_checkpointing)
        if new is None:
            raise BadInputError(f"the run's global batch {target} (micro_batch x grad_accum x processes) cannot be "
                                f"split over {world_size} process(es)",
                                hint="launch a number of processes that divides it")
        out = with_split(out, new)
    return out


def apply_request(cfg: "RunConfig", adj: Adjustments, req: dict[str, Any], world_size: int) -> bool:
    """Fold one failed rank's request into `adj` (in place); False when it was applied already
    (several ranks failing at once ask for the same change once)."""
    kind = req.get("kind")
    adj.processes = adj.processes or req.get("processes")
    adj.global_batch = adj.global_batch or req.get("global_batch")
    if kind == "oom":
        current = Split.of(apply_adjustments(cfg, adj, world_size))
        before = req.get("from") or {}
        if before and Split(**before) != current:
            return False  # another rank's identical request was applied already
        adj.training.update(req.get("to") or {})
    elif kind == "device_lost":
        adj.replan = {"reason": req.get("reason", ""), "step": req.get("step"), "lost_device": req.get("device")}
    else:
        return False
    adj.history.append({k: v for k, v in req.items() if k != "config_hash"})
    return True
