"""Atomic, verifiable checkpoints.

A checkpoint is written into a staging directory (`.staging-checkpoint-<step>-<token>`), every
file is fsynced, a manifest (`trainfit-manifest.json`: name, size and SHA-256 of every file) is
written and fsynced last, then the directory is renamed to `checkpoint-<step>` and the parent
directory is fsynced. A crash at any moment leaves either a staging directory (never mistaken
for a checkpoint; clean_leftovers removes it when the run starts again) or a complete one.

On resume a `checkpoint-<step>` counts only when its manifest matches the files byte for byte;
anything else is reported and skipped, and never deleted or overwritten: when a new checkpoint
needs the name of a corrupt one, the corrupt one is moved aside to `checkpoint-<step>.corrupt-<n>`.
Before resuming, the chosen checkpoint's files are also read the way resuming reads them
(check_loadable), so a checkpoint that matches its manifest but cannot be loaded is refused with
the file named instead of failing inside the Trainer.

Rotation (keep_last) only ever removes complete checkpoints, and removes each by renaming it to
a hidden trash name first (`.checkpoint-<step>.trash-<token>`, atomic) and deleting that: a crash
during the delete never leaves a half-deleted `checkpoint-<step>`; clean_leftovers removes the
trash later (at start-up and at every rotation).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trainfit.files import clean_stale_dirs, fsync_dir, remove_tree_atomic

MANIFEST = "trainfit-manifest.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")
# Files that resuming reads with torch.load (weights_only=True), as Transformers' Trainer does.
_TORCH_FILES = re.compile(r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|"
                          r"pytorch_model(-\d+-of-\d+)?\.bin|adapter_model\.bin)$")


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    complete: bool
    problem: str = ""  # why it is not complete


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def seal(staging: Path, labels: dict | None = None) -> None:
    """fsync every file, then write and fsync the manifest: after this the content is durable.
    `labels`: facts about the state, kept in the manifest (e.g. parameters_finite)."""
    entries = []
    for f in _files(staging):
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
        entries.append({"file": f.relative_to(staging).as_posix(), "bytes": f.stat().st_size,
                        "sha256": _sha256(f)})
    for d in sorted({f.parent for f in _files(staging)} | {staging}):
        fsync_dir(d)
    tmp = staging / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"version": 1, **(labels or {}), "files": entries}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, staging / MANIFEST)
    fsync_dir(staging)


def publish(staging: Path, final: Path, log=print) -> Path:
    """Rename a sealed staging directory to its final name (moving a corrupt holder aside)."""
    if final.exists():
        info = inspect_checkpoint(final)
        n = 1
        while final.with_name(f"{final.name}.corrupt-{n}").exists():
            n += 1
        aside = final.with_name(f"{final.name}.corrupt-{n}")
        log(f"{final.name} already exists ({'complete' if info.complete else info.problem}); "
            f"kept as {aside.name}, not overwritten")
        os.replace(final, aside)
    os.replace(staging, final)
    fsync_dir(final.parent)
    return final


def inspect_checkpoint(path: Path, *, verify_hashes: bool = True) -> CheckpointInfo:
    m = _NAME.match(path.name)
    step = int(m.group(1)) if m else -1
    manifest = path / MANIFEST
    if not manifest.is_file():
        return CheckpointInfo(path, step, False, "no manifest: written incompletely or not by trainfit")
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return CheckpointInfo(path, step, False, "manifest is unreadable")
    if not _valid_entries(entries):
        return CheckpointInfo(path, step, False, "manifest is unreadable")
    if not entries:
        return CheckpointInfo(path, step, False, "manifest lists no files")
    for e in entries:
        f = path / e["file"]
        if not f.is_file():
            return CheckpointInfo(path, step, False, f"{e['file']} is missing")
        if f.stat().st_size != e["bytes"]:
            return CheckpointInfo(path, step, False, f"{e['file']} has {f.stat().st_size} bytes, "
                                                     f"{e['bytes']} were written")
        if verify_hashes and _sha256(f) != e["sha256"]:
            return CheckpointInfo(path, step, False, f"{e['file']} content changed since it was written")
    return CheckpointInfo(path, step, True)


def _valid_entries(entries) -> bool:
    """Manifest entries are {file: relative path inside the checkpoint, bytes: int, sha256: str}."""
    if not isinstance(entries, list):
        return False
    for e in entries:
        if not (isinstance(e, dict) and isinstance(e.get("file"), str) and type(e.get("bytes")) is int
                and isinstance(e.get("sha256"), str)):
            return False
        rel = PurePosixPath(e["file"])
        if not e["file"] or rel.is_absolute() or ".." in rel.parts:
            return False
    return True


def describe_error(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def check_loadable(path: Path) -> tuple[str, str] | None:
    """Read the checkpoint's top-level files the way resuming reads them (JSON parsed, the
    trainer state built, safetensors headers opened, torch files unpickled with weights_only and
    mmap, so tensor data is not read). Returns (file, what is wrong) for the first file that
    fails, or None. Catches what a manifest cannot: files that were damaged before the manifest
    was written, or a manifest written again over damaged files. Sub-directories (FSDP and
    DeepSpeed shards) are left to the loader."""
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        name = f.name
        if name == MANIFEST:
            continue
        try:
            if name == "trainer_state.json":
                from transformers import TrainerState

                state = TrainerState.load_from_json(str(f))
                m = _NAME.match(path.name)
                if not isinstance(state.global_step, int) or (m and state.global_step != int(m.group(1))):
                    raise ValueError(f"it says global_step {state.global_step!r}, not the checkpoint's step")
            elif name.endswith(".json"):
                json.loads(f.read_text(encoding="utf-8"))
            elif name.endswith(".safetensors"):
                from safetensors import safe_open

                with safe_open(str(f), framework="pt") as fh:
                    list(fh.keys())
            elif _TORCH_FILES.match(name):
                _torch_load_check(f)
        except Exception as exc:  # noqa: BLE001  (any failure to read it is the answer)
            return name, describe_error(exc)
    if not (path / "trainer_state.json").is_file():
        return "trainer_state.json", "missing (the step to resume from is stored there)"
    return None


def _torch_load_check(f: Path) -> None:
    import torch

    try:
        from transformers.trainer_pt_utils import safe_globals
    except ImportError:  # older Transformers: numpy globals are not needed there
        from contextlib import nullcontext as safe_globals
    if not zipfile.is_zipfile(f):  # torch.save writes a zip archive; its directory is at the end
        raise ValueError("not a complete torch.save archive (truncated or overwritten)")
    # mmap: tensor data is mapped, not read (an optimizer state can be twice the model's size)
    with safe_globals():
        torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)


def checkpoint_hint(ckpt_dir: Path, bad: Path) -> str:
    """What to do when checkpoint `bad` cannot be resumed from: the earlier complete ones, or
    starting over."""
    infos, _ = scan(ckpt_dir, verify_hashes=False)
    bad_step = int(_NAME.match(bad.name).group(1)) if _NAME.match(bad.name) else None
    earlier = [i.path.name for i in infos if i.complete and i.path != bad
               and (bad_step is None or i.step < bad_step)]
    if earlier:
        return (f"complete earlier checkpoint(s): {', '.join(earlier)}; move {bad.name} out of {ckpt_dir} "
                f"to resume from {earlier[-1]}, or start over with another --out")
    return "no earlier complete checkpoint; start over with another --out"


def clean_leftovers(ckpt_dir: Path) -> list[Path]:
    """Remove what interrupted writes and deletes left: `.checkpoint-<step>.trash-*` (a rotation
    killed mid-delete) and `.staging-checkpoint-*` directories, empty (a crash after publishing,
    before the empty root was removed) or not (a checkpoint write killed before it was published:
    never a checkpoint, since only the rename publishes one, and as large as one). Called by the
    main process before training starts (no write of this run in progress) and after each
    rotation (its own staging directory already published and removed)."""
    removed = clean_stale_dirs(ckpt_dir, lambda owner: bool(_NAME.match(owner)))
    if ckpt_dir.is_dir():
        for p in ckpt_dir.iterdir():
            if p.name.startswith(".staging-") and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def scan(ckpt_dir: Path, *, verify_hashes: bool = True) -> tuple[list[CheckpointInfo], list[Path]]:
    """(checkpoints sorted by step, staging leftovers from interrupted writes)."""
    if not ckpt_dir.is_dir():
        return [], []
    infos, staging = [], []
    for p in ckpt_dir.iterdir():
        if _NAME.match(p.name) and p.is_dir():
            infos.append(inspect_checkpoint(p, verify_hashes=verify_hashes))
        elif p.name.startswith(".staging-"):
            staging.append(p)
    return sorted(infos, key=lambda i: i.step), sorted(staging)


def latest_complete(ckpt_dir: Path, log=print) -> CheckpointInfo | None:
    """The newest complete checkpoint; every skipped partial/corrupt one is reported via log."""
    infos, staging = scan(ckpt_dir)
    for s in staging:
        log(f"skipping {s.name}: an interrupted checkpoint write (removed when training starts)")
    best = None
    for info in infos:
        if info.complete:
            best = info
    for info in infos:
        if not info.complete and (best is None or info.step > best.step):
            log(f"skipping {info.path.name}: {info.problem} (left in place)")
    return best


def rotate(ckpt_dir: Path, keep_last: int) -> list[Path]:
    """Delete complete checkpoints older than the newest `keep_last` complete ones (each renamed
    to a trash name first, so none is ever seen half-deleted under its own name)."""
    clean_leftovers(ckpt_dir)
    infos, _ = scan(ckpt_dir, verify_hashes=False)  # sizes suffice to pick what to delete
    complete = [i for i in infos if i.complete]
    removed = []
    for info in complete[:-keep_last] if keep_last > 0 else []:
        remove_tree_atomic(info.path)
        removed.append(info.path)
    return removed
