"""Shared output helpers: JSON to stdout, talk to stderr (console and atomic writes re-exported)."""

from __future__ import annotations

import json
import sys
from typing import Any

from trainfit.core.serde import to_jsonable
from trainfit.files import write_atomic  # noqa: F401  (re-exported for the commands)
from trainfit.terminal import console  # noqa: F401

__all__ = ["print_json", "say", "console", "write_atomic", "device_memory_json"]


def print_json(obj: Any) -> None:
    """Print one JSON document on stdout (and nothing else goes to stdout under --json)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()


def say(message: str) -> None:
    print(message, file=sys.stderr)


def device_memory_json(dev) -> dict[str, Any]:
    """One device of a memory estimate as JSON: its fields, the verdict and what each tool would
    read (max_memory_allocated = tensor_peak_bytes, max_memory_reserved = reserved_peak_bytes,
    nvidia-smi = device_total_bytes), and the paged optimizer states that wait in CPU RAM (spilled_bytes)."""
    doc = to_jsonable(dev)
    doc.update(fits=dev.fits, reserved_peak_bytes=dev.reserved_peak_bytes, device_total_bytes=dev.device_total_bytes,
               spilled_bytes=dev.spilled_bytes)
    return doc
