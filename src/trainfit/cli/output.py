"""Shared output helpers: JSON to stdout, talk to stderr (console and atomic writes re-exported)."""

from __future__ import annotations

import json
import sys
from typing import Any

from trainfit.core.serde import to_jsonable
from trainfit.files import write_atomic  # noqa: F401  (re-exported for the commands)
from trainfit.terminal import console  # noqa: F401

__all__ = ["print_json", "say", "console", "write_atomic"]


def print_json(obj: Any) -> None:
    """Print one JSON document on stdout (and nothing else goes to stdout under --json)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()


def say(message: str) -> None:
    print(message, file=sys.stderr)
