"""Shared output helpers: JSON to stdout, talk to stderr, atomic file writes."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from trainfit.core.serde import to_jsonable
from trainfit.errors import BadInputError


def print_json(obj: Any) -> None:
    """Print one JSON document on stdout (and nothing else goes to stdout under --json)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()


def console(stderr: bool = False):
    """A rich Console; on stdout for human output, stderr for messages."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (logs, CI) gets a fixed 120 columns rather than rich's 80, so tables stay readable.
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 120
    return Console(stderr=stderr, highlight=False, width=width)


def say(message: str) -> None:
    print(message, file=sys.stderr)


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
