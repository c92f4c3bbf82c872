"""The configuration a run trains with, and every change made to it on the way.

`trainfit train` does not always train with the config as written. At start, `precision: auto`
is made concrete for the device, the split and precision earlier recoveries chose are applied
(RUN_DIR/adjustments.json), after a device failure the precision and micro-batch are re-planned
for the device the run landed on, and the data keys this machine cannot honour are adjusted;
during the run, a recovery splits the micro-batch or changes the precision. Each of these goes
through InForce.change, which records the fields that changed (dotted paths, old -> new) and why,
as a `config_change` event in metrics.jsonl (train/monitor/events.py), so the events file and
`trainfit report` show what the run really trained with.

Changes made before the run's first optimizer step are held back and written when that step
begins (with the run_plan event): a start that fails, e.g. a resume whose checkpoint does not
load, leaves metrics.jsonl as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.train.monitor.events import append_record, event

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

EVENT_KIND = "config_change"


@dataclass(frozen=True)
class ConfigChange:
    """One change of the config in force."""

    source: str  # what made it: "device", "adjustments", "data", "device_replan", "oom_recovered", ...
    reason: str  # one sentence a user can read
    step: int | None  # the optimizer step from which the new config trains
    fields: dict[str, tuple[Any, Any]]  # "training.micro_batch" -> (old, new)

    def as_event(self) -> dict[str, Any]:
        changes = {path: {"from": old, "to": new} for path, (old, new) in self.fields.items()}
        return event(EVENT_KIND, self.step, self.reason, source=self.source, changes=changes)


class InForce:
    """The run's config in force (`cfg`), the config as the user wrote it (`user`), and the
    changes between them, in order. `cfg` changes only through `change`."""

    def __init__(self, user_cfg: "RunConfig") -> None:
        self.user = user_cfg
        self.cfg = user_cfg
        self.changes: list[ConfigChange] = []
        self._metrics: Path | None = None
        self._recording = False
        self._written = 0  # changes already in metrics.jsonl

    def change(self, new_cfg: "RunConfig", reason: str, *, source: str, step: int | None = None) -> "RunConfig":
        """Make `new_cfg` the config in force; when a field differs, record what changed and why.
        Returns the config in force."""
        fields = changed_fields(self.cfg, new_cfg)
        self.cfg = new_cfg
        if fields:
            self.changes.append(ConfigChange(source, reason, step, fields))
            self._write_pending()
        return self.cfg

    def record_to(self, metrics_path: Path | None) -> None:
        """From now on, write each change into `metrics_path` as it is made, the held-back ones
        first (None: this process writes none: a rank other than 0)."""
        self._metrics, self._recording = metrics_path, True
        self._write_pending()

    def _write_pending(self) -> None:
        if not self._recording:
            return
        for change in self.changes[self._written:]:
            append_record(self._metrics, change.as_event())
        self._written = len(self.changes)


def changed_fields(old: "RunConfig", new: "RunConfig") -> dict[str, tuple[Any, Any]]:
    """The leaf fields that differ between two configs, as dotted paths -> (old, new)."""
    out: dict[str, tuple[Any, Any]] = {}
    _diff(old.to_dict(), new.to_dict(), "", out)
    return out


def _diff(old: Any, new: Any, path: str, out: dict[str, tuple[Any, Any]]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(old) + [k for k in new if k not in old]:
            _diff(old.get(key), new.get(key), f"{path}.{key}" if path else str(key), out)
    elif old != new:
        out[path] = (old, new)
