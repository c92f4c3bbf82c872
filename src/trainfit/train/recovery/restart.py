"""Training on in another process: after a device failure a fresh process continues the run on
the remaining devices; a worker group torchrun started again initialises its process group on
store keys of its own (trainfit.train.recovery)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainfit.errors import BadInputError, DoesNotFitError, TrainfitError, UnavailableError
from trainfit.train.recovery.oom import Failure

MAX_RELAUNCHES = 8  # fresh processes one run may start after device failures (bounded by devices)
RELAUNCH_ENV = "TRAINFIT_RELAUNCH_DEPTH"


@dataclass(frozen=True)
class Relaunch:
    """Continue in a fresh process (the device failed)."""

    failure: Failure
    step: int


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


def relaunch_in_fresh_process(run_dir: Path, device: str, *, stop_after: int | None, quiet: bool, faults_plan,
                              say: Callable[[str], None], before_start: Callable[[], None]) -> dict[str, Any]:
    """Run the rest of the training in a fresh process on the remaining devices (`before_start`
    runs just before it starts); its summary."""
    depth = int(os.environ.get(RELAUNCH_ENV, "0") or 0) + 1
    if depth > MAX_RELAUNCHES:
        raise UnavailableError(f"devices failed {depth - 1} times in a row; not starting another process",
                               hint="check the machine (nvidia-smi, dmesg Xid lines), then run again with --resume")
    env = dict(os.environ)
    visible = remaining_devices(device)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
    env[RELAUNCH_ENV] = str(depth)
    from trainfit.train.recovery import faults

    env[faults.ENV] = faults_plan.remaining_spec() if faults_plan is not None else env.get(faults.ENV, "")
    # --json: its summary goes to a pipe, not to the terminal (this process reports the run)
    cmd = [sys.executable, "-m", "trainfit.cli.main", "train", str(run_dir / "config.yaml"),
           "--out", str(run_dir), "--resume", "--json"]
    if stop_after is not None:
        cmd += ["--max-steps", str(stop_after)]
    if quiet:
        cmd.append("--quiet")
    where = f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r}" if visible is not None else "same devices"
    say(f"recovery: continuing in a fresh process ({where})")
    before_start()
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        cls = {2: BadInputError, 3: DoesNotFitError, 4: UnavailableError}.get(proc.returncode, TrainfitError)
        raise cls(f"the run continued in a fresh process after the device failure, which failed (exit "
                  f"{proc.returncode}); see its messages above", hint="fix what it says, then --resume")
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))


def current_device_name(device: str) -> str:
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


def remaining_devices(device: str) -> list[str] | None:
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
