"""Going back to an earlier step: the RNG states of a step boundary (the ones Transformers'
_save_rng_state writes), the run's complete checkpoints, the checkpoints and logged steps after
the step the run continues from (trainfit.train.recovery)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainfit.train.recovery import checkpoints as ck


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


def complete_checkpoint(ckpt_dir: Path, step: int) -> str | None:
    """The complete checkpoint of `step` (None: step 0, or none complete)."""
    if step <= 0:
        return None
    path = ckpt_dir / f"checkpoint-{step}"
    return str(path) if ck.inspect_checkpoint(path, verify_hashes=False).complete else None


def latest_checkpoint(ckpt_dir: Path, at_most: int | None = None) -> str | None:
    """The newest complete checkpoint (of a step <= at_most)."""
    # this run wrote them: the manifest and the sizes suffice (no hashing of every byte)
    infos, _ = ck.scan(ckpt_dir, verify_hashes=False)
    ok = [i for i in infos if i.complete and (at_most is None or i.step <= at_most)]
    return str(ok[-1].path) if ok else None


def checkpoint_step(checkpoint: str | None) -> int:
    """The step of a checkpoint-<step> path (0: None, the start)."""
    return int(Path(checkpoint).name.split("-")[-1]) if checkpoint else 0


def remove_newer_checkpoints(ckpt_dir: Path, step: int, say) -> list[Path]:
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


def trim_steps_after(run_dir: Path, step: int) -> None:
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
