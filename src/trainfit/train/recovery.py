"""Automatic recovery inside `trainfit train`: the run goes on, with the same maths, after an
out-of-memory error, memory pressure, a streak of non-finite losses or a failed device.

What changes and what does not
------------------------------
The global batch (micro_batch x grad_accum x processes), the data order, the optimizer step count
and the LR schedule never change (but for the accumulation raised after an fp32 non-finite
streak, below). What may change is how a step is computed:

* out of memory: the micro-batch is split (halved: its largest divisor <= half) and the gradient
  accumulation multiplied by the same factor; at micro-batch 1 gradient checkpointing is turned on;
  with both done already an fp32 run steps down to 16-bit autocast (bf16-mixed, or fp16-mixed on a
  GPU without bf16: "AMP fallback on OOM", one process); with that done too the run stops with
  DoesNotFitError (exit 3), its progress checkpointed.
* memory pressure (`request_shrink(reason)`, from safety.MemoryPressurePolicy): the same split (or
  the same 16-bit step down), at the next optimizer-step boundary, before anything fails.
* non-finite losses or gradients (PrecisionPolicy; the gradient norm the Trainer computes is
  checked before each update, since NaN gradients can come with a finite loss): the step's update
  is skipped (its gradients are dropped, as a GradScaler skips an fp16 overflow step); a streak of
  them (3) or a collapsed fp16 loss scale switches the precision fp16 -> bf16 (where the device
  has it, core/plan/hardware_rules) -> fp32 and continues from the last good step (the steps of the
  streak are trained again). A streak in fp32 doubles the gradient accumulation once ("gradient
  accumulation adjustment for stability": the one recovery that changes the global batch, on
  purpose, recorded in adjustments.json); a streak after that is divergence:
  TrainingDivergedError (exit 5). No checkpoint is written of non-finite parameters
  (trainer_ext), so "the last good step" is always finite.
* a failed device (lost, ECC, poisoned CUDA context): the in-memory state is not trusted; the run
  continues from its last complete checkpoint in a FRESH process (`python -m trainfit.cli.main train
  RUN_DIR/config.yaml --out RUN_DIR --resume`) with CUDA_VISIBLE_DEVICES narrowed to the remaining
  GPUs (empty: the CPU), re-planned for the device it lands on (precision, micro-batch checked with
  the memory model under the safety mode's memory share).

How a recovery continues the same run (one process)
---------------------------------------------------
An OOM happens in the middle of optimizer step s+1; the weights, optimizer, scheduler, step count
and data position are still those of step s (only partial gradients exist; they are dropped). The
state of step s is saved through the Trainer's own checkpoint writer (`_save_checkpoint`: atomic,
with manifest), with the RNG states as they were at the end of step s (snapshotted at every step
end), i.e. exactly the checkpoint a periodic save at step s writes. A new Trainer with the new
split resumes from it through `resume_from_checkpoint`: Transformers skips steps x grad_accum
micro-batches of the same seeded sampler, which with micro_batch/k x grad_accum*k are exactly the
samples of the first s steps; each later step trains on the same samples as before (tested by
sample digests, tests/train/test_recovery.py; bench/oom_recovery.py). An OOM inside the optimizer
update itself (the state may be half updated) continues from the last complete checkpoint instead:
resume is exact, so the steps since then are trained again to the same values.

Several processes
-----------------
An OOM on one rank leaves the others inside a collective, which no Python code can leave safely.
So the failing rank records the request (RUN_DIR/.recovery/request-rank<N>.json) and exits with
exit code 3; torchrun stops every rank (it always does when one fails) and, when launched with
`--max-restarts`, starts them again. Every restarted rank reads the requests, they agree (all_gather)
on the split, continue from the last complete checkpoint with it, and rank 0 folds the requests into
adjustments.json. Without `--max-restarts`, running the same command with --resume does the same.
Requests made at a step boundary (request_shrink, the non-finite check) need no restart: the ranks
all-reduce their flags once per optimizer step, before the update, and shrink or fall back together.
A failed device under torchrun is recorded the same way and stops the job (exit code 4): launched
again on the remaining devices with --resume, the global batch is split over the new number of
processes (grad_accum raised). A restarted worker group initialises its process group on store
keys of its own attempt (init_restarted_process_group: torchrun keeps the old ranks' addresses).

What is recorded
----------------
RUN_DIR/adjustments.json (written atomically, rank 0): the split and precision in force, the
global batch and the process count it was planned for, and the history of recoveries; a later
--resume applies it. Every recovery is an event in metrics.jsonl (train/events.py) with its reason,
and summary.json carries the split in force and the history. config.sha256 hashes the global batch,
not its split (RunConfig.config_hash), so the adjusted run still resumes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from trainfit.errors import BadInputError, DoesNotFitError, TrainfitError, TrainingDivergedError, UnavailableError
from trainfit.train import checkpoints as ck
from trainfit.train.events import append_record, event
from trainfit.train.oom import Failure, classify, free_device_memory

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

ADJUSTMENTS = "adjustments.json"
REQUEST_DIR = ".recovery"
NONFINITE_STREAK = 3  # non-finite steps in a row before the precision falls back
MIN_LOSS_SCALE = 1.0  # an fp16 loss scale below this: gradients overflow even unscaled
MAX_RELAUNCHES = 8  # fresh processes one run may start after device failures (bounded by devices)
RELAUNCH_ENV = "TRAINFIT_RELAUNCH_DEPTH"
# fp16 -> bf16 (where the device has it) -> fp32, keeping "mixed" (fp32 master weights) or "pure".
_FALLBACK = {"fp16-mixed": ("bf16-mixed", "fp32"), "fp16": ("bf16", "fp32"), "bf16-mixed": ("fp32",),
             "bf16": ("fp32",), "fp32": ()}
# Out of memory with the smallest split: fp32 -> 16-bit autocast (activations and their saved
# copies in 16 bits, about half of the activation memory; weights and optimizer stay fp32).
_MEMORY_STEP_DOWN = {"fp32": ("bf16-mixed", "fp16-mixed")}
# Non-finite steps in fp32: the accumulation is raised this many times (x2 each) before the run
# is declared diverged (exit 5).
MAX_ACCUMULATION_RAISES = 1


# ---------------------------------------------------------------------------------------------
# the pure rules
@dataclass(frozen=True)
class Split:
    """How one optimizer step is computed: micro_batch x grad_accum per process, checkpointing."""

    micro_batch: int
    grad_accum: int
    grad_checkpointing: str = "none"

    @classmethod
    def of(cls, cfg: "RunConfig") -> "Split":
        t = cfg.training
        return cls(t.micro_batch, t.grad_accum, t.grad_checkpointing)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        gc = ", gradient checkpointing" if self.grad_checkpointing != "none" else ""
        return f"micro-batch {self.micro_batch} x accumulation {self.grad_accum}{gc}"


def shrink(split: Split) -> Split | None:
    """The next smaller way to compute the same step: the micro-batch's largest divisor <= half of
    it, with the accumulation multiplied by the same factor (the product stays); at micro-batch 1
    gradient checkpointing; None when that is on already."""
    mb = split.micro_batch
    if mb > 1:
        new = max(d for d in range(1, mb // 2 + 1) if mb % d == 0)
        return Split(new, split.grad_accum * (mb // new), split.grad_checkpointing)
    if split.grad_checkpointing == "none":
        return Split(1, split.grad_accum, "full")
    return None


def split_for_world(global_batch: int, processes: int, micro_batch_max: int,
                    grad_checkpointing: str = "none") -> Split | None:
    """The largest micro-batch <= micro_batch_max with micro_batch x grad_accum x processes equal to
    the global batch; None when the global batch does not divide over the processes."""
    if processes < 1 or global_batch % processes:
        return None
    per_process = global_batch // processes
    for mb in range(min(micro_batch_max, per_process), 0, -1):
        if per_process % mb == 0:
            return Split(mb, per_process // mb, grad_checkpointing)
    return None


def next_precision(current: str, supported: tuple[str, ...] | None = None) -> str | None:
    """The precision to fall back to from `current` (None: nothing left). `supported`: what the
    device trains in (hardware_rules.DeviceRules.precisions); None: assume every one."""
    for candidate in _FALLBACK.get(current, ("fp32",) if current != "fp32" else ()):
        if supported is None or candidate in supported or candidate == "fp32":
            return candidate
    return None


def memory_precision(current: str, supported: tuple[str, ...] | None, device: str) -> str | None:
    """The 16-bit autocast precision to step down to from `current` when memory runs out (None:
    none the device trains in; fp16 never on CPU)."""
    for candidate in _MEMORY_STEP_DOWN.get(current, ()):
        if device == "cpu" and candidate.startswith("fp16"):
            continue
        if supported is None or candidate in supported:
            return candidate
    return None


@dataclass
class PrecisionPolicy:
    """Watches each optimizer step: "ok", "skip" (non-finite: drop this update) or "fallback"
    (a streak of `streak` non-finite steps, or the fp16 loss scale under `min_loss_scale`)."""

    streak: int = NONFINITE_STREAK
    min_loss_scale: float = MIN_LOSS_SCALE
    run: int = 0  # non-finite steps in a row so far
    first_bad_step: int | None = None  # the first step of the current streak

    def observe(self, step: int, nonfinite: bool) -> str:
        """One optimizer step's loss (on any rank): finite or not."""
        if not nonfinite:
            self.run, self.first_bad_step = 0, None
            return "ok"
        if self.run == 0:
            self.first_bad_step = step
        self.run += 1
        return "fallback" if self.run >= self.streak else "skip"

    def scale_collapsed(self, loss_scale: float | None) -> bool:
        """The fp16 GradScaler's scale after a step: under min_loss_scale it cannot recover."""
        return loss_scale is not None and loss_scale < self.min_loss_scale

    def reset(self) -> None:
        self.run, self.first_bad_step = 0, None


# ---------------------------------------------------------------------------------------------
# adjustments.json and the requests of failed ranks
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


def init_restarted_process_group(backend: str, timeout_seconds: float = 1800.0) -> bool:
    """In a worker group torchrun started again: initialise the default process group on a store
    key space of its own. torchrun's rendezvous shares one TCPStore server across rounds
    (torch.distributed.elastic.rendezvous.dynamic_rendezvous), so the addresses the previous
    attempt's ranks published are still there, and a restarted rank can read a dead peer's
    (gloo: "connectFullMesh failed ... Connection refused", seen here about one time in two).
    Prefixing the keys with the attempt number avoids that. True when it initialised the group
    (accelerate then finds it initialised and uses it)."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart in ("", "0") or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return False
    import torch
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return False
    from datetime import timedelta

    timeout = timedelta(seconds=timeout_seconds)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, store=dist.PrefixStore(f"trainfit/attempt_{restart}/default_pg", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    return True


def _with_training(cfg: "RunConfig", **changes: Any) -> "RunConfig":
    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, **changes))


def _with_split(cfg: "RunConfig", split: Split) -> "RunConfig":
    return _with_training(cfg, micro_batch=split.micro_batch, grad_accum=split.grad_accum,
                          grad_checkpointing=split.grad_checkpointing)


def planned_processes(adj: Adjustments, world_size: int) -> int:
    return adj.processes or world_size


def apply_adjustments(cfg: "RunConfig", adj: Adjustments, world_size: int) -> "RunConfig":
    """`cfg` (the user's config, precision resolved for the device) with the recorded split and
    precision, split for `world_size` processes so that the global batch stays the planned one."""
    t = cfg.training
    target = adj.global_batch or t.micro_batch * t.grad_accum * planned_processes(adj, world_size)
    out = _with_training(cfg, **adj.training)
    split = Split.of(out)
    if split.micro_batch * split.grad_accum * world_size != target:
        new = split_for_world(target, world_size, split.micro_batch, split.grad_checkpointing)
        if new is None:
            raise BadInputError(f"the run's global batch {target} (micro_batch x grad_accum x processes) cannot be "
                                f"split over {world_size} process(es)",
                                hint="launch a number of processes that divides it")
        out = _with_split(out, new)
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


# ---------------------------------------------------------------------------------------------
# RNG states at a step boundary (the ones Transformers' _save_rng_state writes)
def rng_snapshot() -> dict[str, Any]:
    import random

    import numpy as np
    import torch

    snap: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                            "cpu": torch.random.get_rng_state()}
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            snap["cuda"] = torch.cuda.random.get_rng_state_all()
    except Exception:
        pass
    for name in ("mps", "xpu"):
        backend = getattr(torch, name, None)
        try:
            if backend is not None and backend.is_available():
                snap[name] = backend.get_rng_state()
        except Exception:
            pass
    return snap


def rng_restore(snap: dict[str, Any] | None) -> None:
    if not snap:
        return
    import random

    import numpy as np
    import torch

    random.setstate(snap["python"])
    np.random.set_state(snap["numpy"])
    torch.random.set_rng_state(snap["cpu"])
    if "cuda" in snap:
        torch.cuda.random.set_rng_state_all(snap["cuda"])
    for name in ("mps", "xpu"):
        if name in snap:
            getattr(torch, name).set_rng_state(snap[name])


# ---------------------------------------------------------------------------------------------
# the API the monitor / safety policies call (any thread)
_ACTIVE: "RecoverySession | None" = None
_ACTIVE_LOCK = threading.Lock()


def request_shrink(reason: str) -> bool:
    """Ask the running training to split its micro-batch at the next optimizer-step boundary (as
    after an OOM, before one happens). Thread-safe; False when no training runs in this process."""
    with _ACTIVE_LOCK:
        session = _ACTIVE
    return session.request("shrink", reason) if session is not None else False


def request_precision_fallback(reason: str) -> bool:
    """Ask the running training to fall back to the next precision (fp16 -> bf16 -> fp32) at the
    next optimizer-step boundary. Thread-safe; False when no training runs in this process."""
    with _ACTIVE_LOCK:
        session = _ACTIVE
    return session.request("fallback", reason) if session is not None else False


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    """Train again: with `cfg`, from `checkpoint` (None: from the start); `kind` and `reason`
    say why (the recovery's event kind and its sentence)."""

    cfg: "RunConfig"
    checkpoint: str | None
    kind: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Relaunch:
    """Continue in a fresh process (the device failed)."""

    failure: Failure
    step: int


class RecoverySession:
    """The recovery state of one `run_training` call: owns adjustments.json, the step-boundary
    checks (its callback), and decides what happens after each train() attempt."""

    def __init__(self, run_dir: Path, user_cfg: "RunConfig", *, device: str, rank: int, world_size: int,
                 say, log, config_hash: str, stop_after: int | None, enabled: bool = True) -> None:
        self.run_dir = run_dir
        self.ckpt_dir = run_dir / "checkpoints"
        self.user_cfg = user_cfg
        self.device = device
        self.rank, self.world = rank, world_size
        self.say, self.log = say, log
        self.config_hash = config_hash
        self.stop_after = stop_after
        self.enabled = enabled
        self.metrics = run_dir / "metrics.jsonl" if rank == 0 else None
        self.adj = Adjustments()
        self.policy = PrecisionPolicy()
        self.cfg: RunConfig | None = None  # the config in force
        self.trainer = None
        self.callback = RecoveryCallback(self)
        self.attempts = 0
        self._lock = threading.Lock()
        self._requests: dict[str, str] = {}  # "shrink" / "fallback" -> reason (from any thread)
        self._refused: set[str] = set()
        self.pending: tuple[str, str, int] | None = None  # (what, reason, step) decided at a boundary
        self.fallback_from: int | None = None  # the last good step of a non-finite streak
        self.phase = "boundary"  # compute | optimizer | boundary: is the in-memory state a whole step?
        self._snapshot: tuple[int, dict[str, Any]] | None = None
        self.precision_override: str | None = None  # a precision a recovery chose (pinned in adjustments.json)

    # -- set-up -----------------------------------------------------------------------------
    def start(self, cfg: "RunConfig", adj: Adjustments, requests: list[dict[str, Any]], distributed_state) -> "RunConfig":
        """Fold the failed ranks' requests into the adjustments, agree across ranks, write them (rank
        0) and return the config in force."""
        global _ACTIVE
        base = cfg
        self.precision_override = adj.training.get("precision")
        for req in requests:
            if apply_request(base, adj, req, self.world):
                self._event(req.get("event", "oom_recovered" if req.get("kind") == "oom" else req.get("kind")),
                            req.get("step"), req.get("reason", ""),
                            **{k: v for k, v in req.items() if k not in ("config_hash", "reason", "step", "kind",
                                                                            "event", "time")})
        # (base has the adjustments applied already, and its precision made fit for the device)
        cfg = _with_training(apply_adjustments(base, adj, self.world), precision=base.training.precision)
        if self.world > 1:
            cfg = self._agree_on_split(cfg)
        if requests or (not adj.empty and (adj.processes is None or adj.global_batch is None)):
            t = cfg.training
            adj.processes = adj.processes or self.world
            adj.global_batch = adj.global_batch or t.micro_batch * t.grad_accum * self.world
        distributed_state.wait_for_everyone()
        if self.rank == 0 and requests:
            self._store(adj, cfg)
            clear_requests(self.run_dir)
        distributed_state.wait_for_everyone()
        self.adj, self.cfg = adj, cfg
        if not adj.empty:
            self.log(f"recovery: rank {self.rank} trains with {Split.of(cfg).describe()}, "
                     f"precision {cfg.training.precision} (RUN_DIR/{ADJUSTMENTS})")
        with _ACTIVE_LOCK:
            _ACTIVE = self
        return cfg

    def close(self) -> None:
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None

    def _agree_on_split(self, cfg: "RunConfig") -> "RunConfig":
        """Every rank computed the split from the same files; a rank that saw them late (a network
        file system) must not differ: all take the smallest micro-batch any rank computed."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cfg
        views: list[Any] = [None] * self.world
        dist.all_gather_object(views, (Split.of(cfg).as_dict(), cfg.training.precision))
        split, precision = min(views, key=lambda v: (v[0]["micro_batch"], -v[0]["grad_accum"]))
        return _with_training(_with_split(cfg, Split(**split)), precision=precision)

    def replan_for_device(self, cfg: "RunConfig", spec, device: str,
                          precision_note: str | None = None) -> tuple["RunConfig", str]:
        """After a device failure, in the fresh process: the micro-batch the memory model says fits
        the device the run landed on (global batch kept), and the record of it (rank 0); (that
        config, why). The precision was made one the device trains in before
        (runner._precision_for_device)."""
        if not self.adj.replan:
            return cfg, ""
        notes = [precision_note] if precision_note else []
        if precision_note:
            self.precision_override = cfg.training.precision
        split, why = fit_micro_batch(cfg, spec, device, self.world, _profile())
        if split != Split.of(cfg):
            notes.append(f"{Split.of(cfg).describe()} -> {split.describe()} ({why})")
            cfg = _with_split(cfg, split)
        elif why:
            notes.append(why)
        lost = self.adj.replan
        reason = f"continued on {device} after a device failure in step {(lost.get('step') or 0) + 1}" + (
            f": {'; '.join(notes)}" if notes else "")
        self.adj.history.append({"time": time.time(), "kind": "device_replan", "step": lost.get("step"),
                                 "reason": reason, "device": device, "lost_device": lost.get("lost_device"),
                                 "to": {**Split.of(cfg).as_dict(), "precision": cfg.training.precision}})
        self.adj.replan = None
        if self.rank == 0:
            self._store(self.adj, cfg)
            self._event("device_replan", lost.get("step"), reason, device=device,
                        to={**Split.of(cfg).as_dict(), "precision": cfg.training.precision})
        self.say(f"recovery: {reason}")
        self.cfg = cfg
        return cfg, reason

    def _store(self, adj: Adjustments, cfg: "RunConfig") -> None:
        t = cfg.training
        adj.training = {"micro_batch": t.micro_batch, "grad_accum": t.grad_accum,
                        "grad_checkpointing": t.grad_checkpointing}
        if self.precision_override is not None:  # only a precision a recovery chose is pinned
            adj.training["precision"] = self.precision_override
        adj.processes = adj.processes or self.world
        adj.global_batch = adj.global_batch or t.micro_batch * t.grad_accum * self.world
        save_adjustments(self.run_dir, adj)

    def _event(self, kind: str, step: int | None, reason: str, **details: Any) -> None:
        append_record(self.metrics, event(kind, step, reason, **details))

    # -- requests from other threads ---------------------------------------------------------
    def request(self, what: str, reason: str) -> bool:
        if not self.enabled:
            return False
        with self._lock:
            self._requests.setdefault(what, reason)
        return True

    def _take_requests(self) -> dict[str, str]:
        with self._lock:
            out, self._requests = self._requests, {}
        return out

    # -- per attempt ---------------------------------------------------------------------------
    def attach(self, trainer, cfg: "RunConfig") -> None:
        self.trainer, self.cfg = trainer, cfg
        self.attempts += 1
        self._take_requests()  # made while the last attempt wound up: about the split just replaced
        self.pending = None
        self.fallback_from = None
        self.policy.reset()
        self.phase = "boundary"
        trainer._tf_block_saves = False

    def classify(self, exc: BaseException) -> Failure | None:
        return classify(exc) if self.enabled else None

    def after_attempt(self, trainer, failure: Failure | None) -> Attempt | Relaunch | None:
        """What to do once trainer.train() returned (failure None) or failed with `failure`."""
        if failure is not None:
            self._end_callbacks(trainer, failure)
            if failure.kind == "oom":
                return self._after_oom(trainer, failure)
            if failure.kind == "device_lost":
                return self._after_device_failure(trainer, failure)
            return self._fallback(trainer, f"a non-finite loss raised {failure.describe()}",
                                  self._latest_step(), failure.describe())
        if self.pending is None:
            return None
        what, reason, step = self.pending
        if what == "fallback":
            return self._fallback(trainer, reason, self.fallback_from if self.fallback_from is not None else step,
                                  reason)
        kind = "memory_pressure"
        if what == "amp":
            kind, cfg = "amp_fallback", self._amp_config()
            reason = f"{reason}: the smallest split already; precision {self.cfg.training.precision} -> " \
                     f"{cfg.training.precision} (16-bit activations)"
        else:
            new = shrink(Split.of(self.cfg))
            if new is None:
                return None
            cfg = _with_split(self.cfg, new)
        if self._finished(trainer):  # the last step: nothing left to compute with it, a --resume will
            self._record(kind, step, reason, self.cfg, cfg, trainer)
            return None
        checkpoint = self._checkpoint_now(trainer)
        self._record(kind, step, reason, self.cfg, cfg, trainer)
        return Attempt(cfg, checkpoint, kind, reason)

    def amp_step_down(self) -> str | None:
        """The 16-bit precision an out-of-memory run steps down to, where the device has one; None
        after a non-finite fallback went the other way (no back and forth)."""
        if any(h.get("kind") == "precision_fallback" for h in self.adj.history):
            return None
        return memory_precision(self.cfg.training.precision, _supported_precisions(self.device), self.device)

    def _amp_config(self) -> "RunConfig":
        new = self.amp_step_down()
        self.precision_override = new
        return _with_training(self.cfg, precision=new)

    def _finished(self, trainer) -> bool:
        s = trainer.state
        return bool(s.max_steps and s.global_step >= s.max_steps) or (
            self.stop_after is not None and s.global_step >= self.stop_after)

    def _end_callbacks(self, trainer, failure: Failure) -> None:
        """A train() that raised never told its callbacks that it ended (progress bars, the
        monitor's thread): do it, so every attempt is one on_train_begin .. on_train_end."""
        try:
            trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
        except Exception as exc:  # noqa: BLE001  (a callback's problem must not hide the failure)
            self.log(f"recovery: a callback failed while the attempt was wound up: {type(exc).__name__}: {exc}")

    # -- out of memory ---------------------------------------------------------------------------
    def _after_oom(self, trainer, failure: Failure) -> Attempt:
        step = trainer.state.global_step
        current = Split.of(self.cfg)
        new = shrink(current)
        if self.world > 1:
            self._ask_for_restart(failure, step, current, new)
        trusted = self.phase != "optimizer"
        try:
            trainer.model.zero_grad(set_to_none=True)  # the partial gradients of the failed step
        except Exception:
            pass
        free_device_memory()
        checkpoint = self._checkpoint_now(trainer) if trusted else self._latest_checkpoint()  # (one process here)
        resumed_at = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0
        if resumed_at < step:  # the steps after the checkpoint are trained again: their records go
            _trim_steps_after(self.run_dir, resumed_at)
        if new is None and self.amp_step_down() is not None:  # one process: world > 1 asked for a restart above
            cfg = self._amp_config()
            reason = (f"out of memory in step {step + 1} ({failure.backend}) with {current.describe()}, the smallest "
                      f"split: precision {self.cfg.training.precision} -> {cfg.training.precision} (16-bit "
                      "activations), global batch kept")
            self._record("amp_fallback", step, reason, self.cfg, cfg, trainer, backend=failure.backend,
                         message=failure.message, continued_from=Path(checkpoint).name if checkpoint else "start",
                         replayed=not trusted)
            self.say(f"recovery: {reason}; continuing from {Path(checkpoint).name if checkpoint else 'the start'}")
            return Attempt(cfg, checkpoint, "amp_fallback", reason)
        if new is None:
            where = f"; the last complete checkpoint is {Path(checkpoint).name}" if checkpoint else ""
            raise DoesNotFitError(
                f"out of memory in step {step + 1} ({failure.backend}) with {current.describe()}: micro-batch 1 "
                f"with gradient checkpointing is the smallest step trainfit can make{where}",
                hint="use a smaller model, a shorter training.seq_len, LoRA/QLoRA, or a device with more memory; "
                     "`trainfit plan` finds a setting that fits")
        cfg = _with_split(self.cfg, new)
        reason = (f"out of memory in step {step + 1} ({failure.backend}): {current.describe()} -> {new.describe()}, "
                  f"global batch kept")
        self._record("oom_recovered", step, reason, self.cfg, cfg, trainer, backend=failure.backend,
                     message=failure.message, continued_from=Path(checkpoint).name if checkpoint else "start",
                     replayed=not trusted)
        self.say(f"recovery: {reason}; continuing from {Path(checkpoint).name if checkpoint else 'the start'}")
        return Attempt(cfg, checkpoint, "oom_recovered", reason)

    def _ask_for_restart(self, failure: Failure, step: int, current: Split, new: Split | None) -> None:
        """Several processes: record what this rank needs and stop; torchrun restarts every rank."""
        if new is None:
            raise DoesNotFitError(f"out of memory on rank {self.rank} in step {step + 1} ({failure.backend}) with "
                                  f"{current.describe()}: nothing smaller to try",
                                  hint="use a smaller model, a shorter seq_len, LoRA/QLoRA or more memory per GPU")
        t = self.cfg.training
        reason = (f"out of memory on rank {self.rank} in step {step + 1} ({failure.backend}): {current.describe()} -> "
                  f"{new.describe()} on every rank, global batch kept")
        write_request(self.run_dir, self.rank, {
            "config_hash": self.config_hash, "time": time.time(), "kind": "oom", "event": "oom_recovered",
            "rank": self.rank, "step": step, "reason": reason, "backend": failure.backend, "message": failure.message,
            "from": current.as_dict(), "to": new.as_dict(), "processes": self.adj.processes or self.world,
            "global_batch": self.adj.global_batch or t.micro_batch * t.grad_accum * self.world})
        raise DoesNotFitError(f"{reason}; all ranks must restart with it (recorded in RUN_DIR/{REQUEST_DIR})",
                              hint="under `torchrun --max-restarts N` the ranks restart and continue by themselves; "
                                   "otherwise run the same command again with --resume")

    # -- non-finite losses ---------------------------------------------------------------------
    def _fallback(self, trainer, reason: str, good_step: int, detail: str) -> Attempt:
        current = self.cfg.training.precision
        supported = _supported_precisions(self.device)
        new = next_precision(current, supported)
        checkpoint = self._bcast(self._checkpoint_path(good_step) if self.rank == 0 else None)
        raised = sum(1 for h in self.adj.history if h.get("kind") == "accumulation_raised")
        if new is None and raised >= MAX_ACCUMULATION_RAISES:
            where = f"; the last good state is {Path(checkpoint).name}" if checkpoint else ""
            raise TrainingDivergedError(
                f"training diverged: {reason}, in fp32 and with the accumulation raised {raised} time(s) already; "
                f"nothing left to try{where}",
                hint="lower schedule.lr, raise warmup_steps or check the data; --resume continues from the last good "
                     "checkpoint")
        if new is None:  # fp32 already: a larger effective batch averages the noisy gradients out
            cfg = _with_training(self.cfg, grad_accum=self.cfg.training.grad_accum * 2)
            kind, change = "accumulation_raised", (f"gradient accumulation {self.cfg.training.grad_accum} -> "
                                                    f"{cfg.training.grad_accum} (global batch x2)")
        else:
            cfg = _with_training(self.cfg, precision=new)
            self.precision_override = new
            kind, change = "precision_fallback", f"precision {current} -> {new}"
        if checkpoint is None and good_step > 0 and good_step == trainer.state.global_step and self.phase != "optimizer":
            checkpoint = self._checkpoint_now(trainer)  # asked for at a boundary: this step is good
        if checkpoint is None and good_step > 0:  # the save at the streak's start failed: an earlier one
            checkpoint = self._bcast(self._latest_checkpoint(at_most=good_step) if self.rank == 0 else None)
        good_step = int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0
        if self.rank == 0:
            dropped = _remove_newer_checkpoints(self.ckpt_dir, good_step, self.say)
            _trim_steps_after(self.run_dir, good_step)
        else:
            dropped = []
        if self.world > 1:
            trainer.accelerator.wait_for_everyone()
        full = (f"{reason}: {change}, continuing from the last good step {good_step} "
                f"(steps after it are trained again)")
        if kind == "accumulation_raised":
            t = cfg.training
            self.adj.global_batch = t.micro_batch * t.grad_accum * self.world  # on purpose: a larger batch
        self._record(kind, good_step, full, self.cfg, cfg, trainer, detail=detail,
                     continued_from=Path(checkpoint).name if checkpoint else "start",
                     abandoned_checkpoints=[p.name for p in dropped])
        self.say(f"recovery: {full}")
        return Attempt(cfg, checkpoint, kind, full)

    # -- device failure ----------------------------------------------------------------------------
    def _after_device_failure(self, trainer, failure: Failure) -> Relaunch:
        step = trainer.state.global_step
        lost = _current_device_name(self.device)
        latest = self._latest_checkpoint()
        where = Path(latest).name if latest else "the start"
        reason = (f"{failure.describe()} in step {step + 1} on {lost}: the in-memory state is not trusted; the run "
                  f"continues from {where} in a fresh process")
        if self.world > 1:
            reason = (f"{failure.describe()} in step {step + 1} on {lost}: the in-memory state is not trusted; the "
                      f"run continues from {where} when launched again with --resume")
            t = self.cfg.training
            write_request(self.run_dir, self.rank, {
                "config_hash": self.config_hash, "time": time.time(), "kind": "device_lost", "event": "device_lost",
                "rank": self.rank, "step": step, "reason": reason, "device": lost, "backend": failure.backend,
                "processes": self.adj.processes or self.world,
                "global_batch": self.adj.global_batch or t.micro_batch * t.grad_accum * self.world})
            raise UnavailableError(f"rank {self.rank}: {reason}",
                                   hint="launch on the remaining devices (fewer processes are fine: the global batch "
                                        "is kept by raising grad_accum)")
        self._event("device_lost", step, reason, device=lost, backend=failure.backend, message=failure.message,
                    continued_from=Path(latest).name if latest else "start")
        self.adj.replan = {"reason": reason, "step": step, "lost_device": lost}
        self.adj.history.append({"time": time.time(), "kind": "device_lost", "step": step, "reason": reason,
                                 "device": lost, "backend": failure.backend})
        self._store(self.adj, self.cfg)
        self.say(f"recovery: {reason}")
        return Relaunch(failure, step)

    # -- checkpoints -------------------------------------------------------------------------------
    def _checkpoint_path(self, step: int) -> str | None:
        if step <= 0:
            return None
        path = self.ckpt_dir / f"checkpoint-{step}"
        return str(path) if ck.inspect_checkpoint(path, verify_hashes=False).complete else None

    def _latest_step(self) -> int:
        latest = self._latest_checkpoint()
        return int(Path(latest).name.split("-")[-1]) if latest else 0

    def _latest_checkpoint(self, at_most: int | None = None) -> str | None:
        # this run wrote them: the manifest and the sizes suffice (no hashing of every byte)
        infos, _ = ck.scan(self.ckpt_dir, verify_hashes=False)
        ok = [i for i in infos if i.complete and (at_most is None or i.step <= at_most)]
        return str(ok[-1].path) if ok else None

    def _checkpoint_now(self, trainer) -> str | None:
        """The checkpoint of the last completed step (written now unless it exists): what a periodic
        save at that step writes, RNG states included (from the step-end snapshot)."""
        step = trainer.state.global_step
        if step == 0:
            return None
        existing = self._bcast(self._checkpoint_path(step) if self.rank == 0 else None)
        if existing:
            return existing
        snap = self._snapshot[1] if self._snapshot and self._snapshot[0] == step else None
        now = rng_snapshot() if snap else None
        try:
            rng_restore(snap)
            trainer._tf_force_save = True
            trainer._save_checkpoint(trainer.model_wrapped, trial=None)
            if step in getattr(trainer, "_tf_refused_saves", ()):  # non-finite parameters: not a good state
                latest = self._bcast(self._latest_checkpoint() if self.rank == 0 else None)
                self.say(f"recovery: the state of step {step} has non-finite parameters; continuing from "
                         f"{Path(latest).name if latest else 'the start'} instead")
                return latest
            trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
        except Exception as exc:  # noqa: BLE001  (e.g. out of memory again while saving, a full disk)
            if self.world > 1:
                raise
            latest = self._latest_checkpoint()
            self.say(f"recovery: could not save step {step} ({type(exc).__name__}: {exc}); continuing from "
                     f"{Path(latest).name if latest else 'the start'} instead (resume is exact: the steps since "
                     "are trained again)")
            return latest
        finally:
            trainer._tf_force_save = False
            rng_restore(now)
        return str(self.ckpt_dir / f"checkpoint-{step}")

    def _bcast(self, value):
        if self.world <= 1:
            return value
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box)
        return box[0]

    def _record(self, kind: str, step: int, reason: str, before: "RunConfig", after: "RunConfig", trainer,
                **details: Any) -> None:
        frm = {**Split.of(before).as_dict(), "precision": before.training.precision}
        to = {**Split.of(after).as_dict(), "precision": after.training.precision}
        t = after.training
        self.adj.processes = self.adj.processes or self.world
        self.adj.global_batch = self.adj.global_batch or t.micro_batch * t.grad_accum * self.world
        entry = {"time": time.time(), "kind": kind, "step": step, "reason": reason, "rank": self.rank,
                 "from": frm, "to": to, **details}
        self.adj.history.append(entry)
        if self.rank == 0:
            self._store(self.adj, after)
            self._event(kind, step, reason, **{k: v for k, v in entry.items()
                                               if k not in ("time", "kind", "step", "reason")},
                        global_batch=self.adj.global_batch)

    # -- relaunch --------------------------------------------------------------------------------
    def relaunch(self, relaunch: Relaunch, *, stop_after: int | None, quiet: bool, faults_plan) -> dict[str, Any]:
        """Run the rest of the training in a fresh process on the remaining devices; its summary."""
        depth = int(os.environ.get(RELAUNCH_ENV, "0") or 0) + 1
        if depth > MAX_RELAUNCHES:
            raise UnavailableError(f"devices failed {depth - 1} times in a row; not starting another process",
                                   hint="check the machine (nvidia-smi, dmesg Xid lines), then run again with --resume")
        env = dict(os.environ)
        visible = _remaining_devices(self.device)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        env[RELAUNCH_ENV] = str(depth)
        from trainfit.train import faults

        env[faults.ENV] = faults_plan.remaining_spec() if faults_plan is not None else env.get(faults.ENV, "")
        # --json: its summary goes to a pipe, not to the terminal (this process reports the run)
        cmd = [sys.executable, "-m", "trainfit.cli.main", "train", str(self.run_dir / "config.yaml"),
               "--out", str(self.run_dir), "--resume", "--json"]
        if stop_after is not None:
            cmd += ["--max-steps", str(stop_after)]
        if quiet:
            cmd.append("--quiet")
        where = f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r}" if visible is not None else "same devices"
        self.say(f"recovery: continuing in a fresh process ({where})")
        self.close()
        proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
        if proc.returncode != 0:
            cls = {2: BadInputError, 3: DoesNotFitError, 4: UnavailableError}.get(proc.returncode, TrainfitError)
            raise cls(f"the run continued in a fresh process after the device failure, which failed (exit "
                      f"{proc.returncode}); see its messages above", hint="fix what it says, then --resume")
        return json.loads((self.run_dir / "summary.json").read_text(encoding="utf-8"))


class RecoveryCallback(TrainerCallback):
    """The session's eyes inside the training loop: the phase of the step (is the in-memory state a
    whole step?), the RNG snapshot at every step end, the once-per-step agreement on non-finite
    losses and shrink / fallback requests, and stopping the attempt at a boundary when needed."""

    def __init__(self, session: RecoverySession) -> None:
        self.s = session

    def on_train_begin(self, args, state, control, **kw):
        self.s.phase = "boundary"

    def on_step_begin(self, args, state, control, **kw):
        self.s.phase = "compute"

    def on_pre_optimizer_step(self, args, state, control, **kw):
        s = self.s
        trainer = s.trainer
        if trainer is None or not s.enabled:
            return
        requests = s._take_requests()
        # NaN / inf gradients can come with a finite loss (an overflow in the backward pass): the
        # gradient norm the Trainer computed for this step is checked as well
        nonfinite, bad_grads = (trainer._tf_take_nonfinite() if hasattr(trainer, "_tf_take_nonfinite")
                                else (False, False))
        flags = [int(nonfinite or bad_grads), int("shrink" in requests), int("fallback" in requests),
                 int(nonfinite)]
        if s.world > 1:
            flags = _all_reduce_max(flags, trainer.args.device)
        reasons = requests
        step = state.global_step  # the last completed step (this one is not counted yet)
        if flags[0]:
            self._nonfinite(trainer, state, step, what="loss" if flags[3] else "gradient")
        else:
            s.policy.observe(step + 1, False)
        if s.pending is None and flags[2]:
            s.pending = ("fallback", reasons.get("fallback", "a precision fallback was requested on another rank"),
                         step)
            s.fallback_from = step
            trainer._tf_block_saves = True
        if s.pending is None and flags[1]:
            reason = reasons.get("shrink", "a shrink was requested on another rank")
            if shrink(Split.of(s.cfg)) is not None:
                s.pending = ("shrink", reason, step + 1)
            elif s.amp_step_down() is not None:
                s.pending = ("amp", reason, step + 1)
            elif "shrink" not in s._refused:
                s._refused.add("shrink")
                s._event("shrink_refused", step, f"{reason}; but micro-batch 1 with gradient checkpointing in "
                                                 f"{s.cfg.training.precision} is the smallest step already")
        s.phase = "optimizer"

    def _nonfinite(self, trainer, state, step: int, what: str = "loss") -> None:
        s = self.s
        decision = s.policy.observe(step + 1, True)
        scaler = getattr(trainer.accelerator, "scaler", None)
        if s.policy.run == 1:  # the first of a streak: keep the last good state (step `step`)
            s.fallback_from = step
            if scaler is None:
                trainer.model.zero_grad(set_to_none=True)
            if step > 0:
                s._checkpoint_now(trainer)
        if scaler is None:  # drop this update (a GradScaler skips it by itself)
            trainer.model.zero_grad(set_to_none=True)
        said = (f"the loss of step {step + 1} is not finite" if what == "loss" else
                f"the gradients of step {step + 1} are not finite (its loss is)")
        s._event(f"nonfinite_{what}", step + 1, f"{said}: its update is skipped ({s.policy.run} in a row; at "
                                                f"{s.policy.streak} the precision falls back)",
                 precision=s.cfg.training.precision, streak=s.policy.run)
        if decision == "fallback" and s.pending is None:
            s.pending = ("fallback", f"{s.policy.run} non-finite losses in a row (steps {s.policy.first_bad_step}-"
                                     f"{step + 1})", step + 1)
            trainer._tf_block_saves = True  # the state of a streak is not worth a checkpoint

    def on_optimizer_step(self, args, state, control, **kw):
        self.s.phase = "optimizer"

    def on_step_end(self, args, state, control, **kw):
        s = self.s
        s.phase = "boundary"
        trainer = s.trainer
        if trainer is None or not s.enabled:
            return
        if s.policy.run == 0:  # a good step: its RNG states, for a checkpoint written after a failure
            s._snapshot = (state.global_step, rng_snapshot())
        scaler = getattr(trainer.accelerator, "scaler", None)
        if scaler is not None and s.pending is None:
            scale = float(scaler.get_scale())
            if s.policy.scale_collapsed(scale):
                s.pending = ("fallback", f"the fp16 loss scale fell to {scale:g} (under {s.policy.min_loss_scale:g}): "
                                         "gradients overflow even unscaled", state.global_step)
                s.fallback_from = state.global_step
        if s.pending is not None:
            control.should_training_stop = True


def _all_reduce_max(flags: list[int], device) -> list[int]:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flags
    t = torch.tensor(flags, dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


# ---------------------------------------------------------------------------------------------
# helpers
def _profile():
    try:
        from trainfit.train.predictions import hardware_profile

        return hardware_profile()
    except Exception:  # noqa: BLE001  (probes are best effort)
        return None


def _supported_precisions(device: str) -> tuple[str, ...] | None:
    from trainfit.core.plan.hardware_rules import rules_for

    profile = _profile()
    if profile is None:
        return ("fp32", "bf16-mixed", "bf16") if device == "cpu" else None
    try:
        return rules_for(profile, device).precisions
    except Exception:  # noqa: BLE001
        return None


def fit_micro_batch(cfg: "RunConfig", spec, device: str, world_size: int, profile=None) -> tuple[Split, str]:
    """The largest micro-batch (at most the current one, same global batch) that the memory model
    fits into the safety mode's share of the device's memory; gradient checkpointing when even
    micro-batch 1 does not fit without it. Returns (split, note)."""
    current = Split.of(cfg)
    if spec is None or profile is None:
        return current, "micro-batch kept: no model description or hardware profile to check it with"
    try:
        from trainfit.core.memory import estimate_memory
        from trainfit.core.plan.engine import Budget, need_ratio
        from trainfit.core.plan.modes import targets

        mode = getattr(getattr(cfg, "safety", None), "mode", "balanced")
        budget = Budget(share=targets(mode).memory_share)
        per_process = current.micro_batch * current.grad_accum
        candidates = [Split(mb, per_process // mb, current.grad_checkpointing)
                      for mb in range(current.micro_batch, 0, -1) if per_process % mb == 0]
        if current.grad_checkpointing == "none":
            candidates.append(Split(1, per_process, "full"))
        for split in candidates:
            setup = _with_split(cfg, split).to_setup(device, num_gpus=world_size, hardware=profile)
            if need_ratio(estimate_memory(spec, setup, profile), budget) <= 1.0:
                return split, f"memory model: fits {mode} mode's {budget.share:.0%} of {device} memory"
        return candidates[-1], f"memory model: even {candidates[-1].describe()} is over the {mode} budget; trying it"
    except Exception as exc:  # noqa: BLE001  (an estimate is not worth a failed recovery)
        return current, f"micro-batch kept: the memory model could not check it ({type(exc).__name__}: {exc})"


def _current_device_name(device: str) -> str:
    if device != "cuda":
        return device
    try:
        import torch

        index = torch.cuda.current_device()
    except Exception:  # noqa: BLE001
        return "cuda"
    visible = _visible_cuda_devices()
    return f"cuda:{index}" + (f" (CUDA_VISIBLE_DEVICES entry {visible[index]})" if visible and index < len(visible)
                              else "")


def _visible_cuda_devices() -> list[str] | None:
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    return [d.strip() for d in text.split(",") if d.strip()]


def _remaining_devices(device: str) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for the fresh process: without the device this process used; None:
    leave it as it is (the failed device was not a CUDA device)."""
    if device != "cuda":
        return [] if device == "cpu" else None
    try:
        import torch

        index, count = torch.cuda.current_device(), torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        index, count = 0, 1
    visible = _visible_cuda_devices()
    if visible is None:
        visible = [str(i) for i in range(count)]
    return [d for i, d in enumerate(visible) if i != index]


def _remove_newer_checkpoints(ckpt_dir: Path, step: int, say) -> list[Path]:
    """Checkpoints after `step` belong to a trajectory that is abandoned (a non-finite streak)."""
    from trainfit.files import remove_tree_atomic

    infos, _ = ck.scan(ckpt_dir, verify_hashes=False)
    removed = []
    for info in infos:
        if info.step > step and info.complete:
            remove_tree_atomic(info.path)
            removed.append(info.path)
            say(f"recovery: removed {info.path.name} (written during the non-finite streak)")
    return removed


def _trim_steps_after(run_dir: Path, step: int) -> None:
    """metrics.jsonl without the logged steps after `step` (they are trained again); events stay."""
    from trainfit.files import write_atomic

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "event" not in rec and rec.get("step", 0) > step:
            continue
        keep.append(line)
    write_atomic(path, "\n".join(keep) + ("\n" if keep else ""))
