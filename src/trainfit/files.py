"""Atomic file writes, used by every layer that writes a file (CLI, trainer, exporters).

A file is written to a temporary name in the same directory, fsynced and renamed over the
target, so a crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainfit.errors import BadInputError

def write_atomic(path: str | os.PathLike, text: str, *, force: bool = True) -> Path:
    """Write text to path via a temp file + fsync + rename, so no half-written file is left."""
    path = Path(path)
    if path.exists() and not force:
        raise BadInputError(f"{path} exists", hint="pass --force to overwrite it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise BadInputError(f"cannot write {path}: directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
