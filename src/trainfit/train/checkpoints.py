"""Atomic, verifiable checkpoints.

A checkpoint is written into a staging directory (`.staging-checkpoint-<step>-<token>`), every
file is fsynced, a manifest (`trainfit-manifest.json`: name, size and SHA-256 of every file) is
written and fsynced last, then the directory is renamed to `checkpoint-<step>` and the parent
directory is fsynced. A crash at any moment leaves either a staging directory (never mistaken
for a checkpoint) or a complete one.

On resume a `checkpoint-<step>` counts only when its manifest matches the files byte for byte;
anything else is reported and skipped, and never deleted or overwritten: when a new checkpoint
needs the name of a corrupt one, the corrupt one is moved aside to `checkpoint-<step>.corrupt-<n>`.
Rotation (keep_last) only ever removes complete checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "trainfit-manifest.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def seal(staging: Path) -> None:
    """fsync every file, then write and fsync the manifest: after this the content is durable."""
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
        json.dump({"version": 1, "files": entries}, fh, indent=1)
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
    except (ValueError, KeyError, TypeError):
        return CheckpointInfo(path, step, False, "manifest is unreadable")
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
        log(f"skipping {s.name}: an interrupted checkpoint write (left in place)")
    best = None
    for info in infos:
        if info.complete:
            best = info
    for info in infos:
        if not info.complete and (best is None or info.step > best.step):
            log(f"skipping {info.path.name}: {info.problem} (left in place)")
    return best


def rotate(ckpt_dir: Path, keep_last: int) -> list[Path]:
    """Delete complete checkpoints older than the newest `keep_last` complete ones."""
    infos, _ = scan(ckpt_dir, verify_hashes=False)  # sizes suffice to pick what to delete
    complete = [i for i in infos if i.complete]
    removed = []
    for info in complete[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(info.path)
        removed.append(info.path)
    return removed
