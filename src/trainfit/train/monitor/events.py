"""Records of metrics.jsonl: one JSON object per line, appended and fsynced, so a crash loses at
most the line being written.

Three kinds of record share the file:
* a logged optimizer step: {"step", "loss", "learning_rate", "tokens_per_second", ...} (no "event");
* a machine reading: {"event": "sample", "time", "host", "gpus"} (hardware/sample_types.Sample);
* something that happened: {"event": KIND, "time", "step", "reason", ...details}, where KIND is
  e.g. "resume", "oom_recovered", "precision_fallback", "thermal_pause", "thermal_resume",
  "battery_pause", "power_resume", "checkpoint", "device_lost", "memory_leak", "signal".
  `reason` is one sentence a user can read; details are plain JSON values.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()  # the sampler thread and the training loop append to the same file


def event(kind: str, step: int | None, reason: str, **details: Any) -> dict[str, Any]:
    """An event record (see the module doc)."""
    return {"event": kind, "time": time.time(), "step": step, "reason": reason, **details}


def append_record(path: str | os.PathLike | None, record: dict[str, Any]) -> None:
    """Append one record to metrics.jsonl (no-op when path is None: a rank that does not write)."""
    if path is None:
        return
    line = json.dumps(record) + "\n"
    with _LOCK, open(Path(path), "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
