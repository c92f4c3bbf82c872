"""Load a run directory written by `trainfit train` for `trainfit report`: config.yaml (shown as
it is; absent in the folder of a run monitored with MonitorCallback / monitor_training, whose
metrics.jsonl the monitor wrote), summary.json (optional: a run that crashed or is still running
has none yet; its `run_plan` event then says what it was planned to do) and
metrics.jsonl, whose three kinds of record (train/monitor/events.py) are sorted into logged steps, machine
samples (hardware/sample_types.py) and events.

metrics.jsonl is read line by line (no size limit; what is kept per line is small). A line that
is not a JSON object, or a known field with a value of the wrong type, is a BadInputError naming
the line and what is wrong. One exception: the last line, when it does not end with a newline and
does not parse, is the record a crash (or the still running writer) cut short; it is skipped with
a note. Unknown keys are ignored, so a newer writer's extra fields do not break an older reader.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from trainfit.errors import BadInputError
from trainfit.hardware.sample_types import GpuSample, HostSample, Sample

REQUIRED_FILES = ("config.yaml", "metrics.jsonl")  # config.yaml: absent for a run monitored from Python
# Numbers a logged-step record may carry (train/callbacks.MetricsWriter); other keys are ignored.
STEP_FIELDS = ("loss", "learning_rate", "grad_norm", "tokens_per_second", "samples_per_second", "step_seconds",
               "elapsed_seconds", "time", "peak_rss_bytes", "cuda_max_allocated_bytes", "cuda_max_reserved_bytes")
_HINT = ("metrics.jsonl is written by `trainfit train`, one JSON object per line; only a last line cut short "
         "by a crash is skipped")


@dataclass(frozen=True)
class Event:
    """One {"event": kind, ...} record other than a machine sample."""

    line: int
    kind: str
    time: float | None
    step: int | None
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunData:
    run_dir: Path
    config_text: str | None  # None: a run monitored with MonitorCallback / monitor_training (no config.yaml)
    summary: dict[str, Any] | None  # summary.json; None until the run has finished
    # Logged optimizer steps, one column per field ("step" plus STEP_FIELDS), None where absent.
    steps: dict[str, list[Any]]
    samples: list[Sample]
    events: list[Event]
    # "host.cpu_temperature_c" / "gpu0.power_watts" -> why the sampler could not read it (first reason seen).
    unavailable: dict[str, str]
    notes: list[str]
    lines: int  # lines of metrics.jsonl read

    @property
    def step_count(self) -> int:
        return len(self.steps["step"])


def check_run_dir(run_dir: str | Path) -> Path:
    """The run directory as a Path; BadInputError when it is absent, a file, or lacks the files a
    run writes first (config.yaml, metrics.jsonl)."""
    text = str(run_dir)
    if not text.strip():
        raise BadInputError("RUN_DIR: empty path", hint="give the directory `trainfit train --out` wrote")
    p = Path(text).expanduser()
    try:
        if not p.exists():
            raise BadInputError(f"RUN_DIR {p} does not exist", hint="give the directory `trainfit train --out` wrote")
        if not p.is_dir():
            raise BadInputError(f"RUN_DIR {p} is a file, not a run directory",
                                hint="give the directory `trainfit train --out` wrote")
        missing = [name for name in REQUIRED_FILES if not (p / name).is_file()]
    except OSError as exc:
        raise BadInputError(f"RUN_DIR {p} cannot be read: {exc.strerror or exc}") from None
    if len(missing) == len(REQUIRED_FILES):
        raise BadInputError(f"RUN_DIR {p} is not a trainfit run directory: {' and '.join(missing)} are missing",
                            hint="a run directory is written by `trainfit train`")
    if missing == ["config.yaml"]:
        return p  # a run monitored with MonitorCallback / monitor_training: its metrics.jsonl only
    if missing:
        why = " (the run has not logged a step yet)" if missing == ["metrics.jsonl"] else ""
        raise BadInputError(f"RUN_DIR {p}: {missing[0]} is missing{why}",
                            hint="a run directory written by `trainfit train` holds config.yaml and metrics.jsonl")
    return p


def load_run(run_dir: str | Path) -> RunData:
    """Read and check a run directory (see the module doc)."""
    from trainfit.validate import parse_json, read_text_file

    p = check_run_dir(run_dir)
    config_text = (read_text_file(p / "config.yaml", "config.yaml") if (p / "config.yaml").exists() else None)
    summary = None
    notes: list[str] = []
    if (p / "summary.json").exists():
        summary = parse_json(read_text_file(p / "summary.json", "summary.json"), str(p / "summary.json"))
        if not isinstance(summary, dict):
            raise BadInputError(f"{p / 'summary.json'}: expected a JSON object, got a {_json_type(summary)}")
    else:
        notes.append("summary.json is absent (the run has not finished, or stopped early): predicted figures and "
                     "the run's own measured peak are unavailable")
    data = RunData(run_dir=p, config_text=config_text, summary=summary,
                   steps={"step": [], **{k: [] for k in STEP_FIELDS}}, samples=[], events=[], unavailable={},
                   notes=notes, lines=0)
    _read_metrics(p / "metrics.jsonl", data)
    if summary is None and any(e.kind == "run_plan" for e in data.events):
        data.notes[0] = ("summary.json is absent (the run has not finished, or stopped early): the predicted figures "
                         "and the planned length come from the run_plan event it wrote when it started")
    if not (data.step_count or data.samples or data.events):
        raise BadInputError(f"{p / 'metrics.jsonl'} holds no records yet: nothing to report",
                            hint="run `trainfit report` once the run has logged a step")
    return data


def _read_metrics(path: Path, data: RunData) -> None:
    if not path.is_file():  # a FIFO or a device named metrics.jsonl
        raise BadInputError(f"{path} is not a regular file")
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise BadInputError(f"{path} cannot be read: {exc.strerror or exc}") from None
    with fh:
        pending: tuple[int, bytes] | None = None  # parsed one line late, to know which line is the last
        n = 0
        try:
            for n, raw in enumerate(fh, start=1):
                if pending is not None:
                    _take(path, *pending, data, last=False)
                pending = (n, raw)
        except OSError as exc:
            raise BadInputError(f"{path} cannot be read: {exc.strerror or exc}") from None
        if pending is not None:
            _take(path, *pending, data, last=True)
        data.lines = n


def _take(path: Path, n: int, raw: bytes, data: RunData, *, last: bool) -> None:
    if not raw.strip(b" \t\r\n"):
        return  # a blank line carries nothing
    try:
        rec = _parse(path, n, raw)
    except BadInputError:
        if last and not raw.endswith(b"\n"):
            data.notes.append(f"metrics.jsonl line {n} is cut short (the run stopped while writing it, or is still "
                              "writing it): skipped")
            return
        raise
    _classify(path, n, rec, data)


def _parse(path: Path, n: int, raw: bytes) -> dict[str, Any]:
    where = f"{path} line {n}"
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{where}: not UTF-8 text (invalid byte at column {exc.start + 1})", hint=_HINT) from None
    if "\0" in text:
        raise BadInputError(f"{where}: holds NUL bytes, not a JSON record", hint=_HINT)
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInputError(f"{where}: not valid JSON (column {exc.colno}: {exc.msg})", hint=_HINT) from None
    except RecursionError:
        raise BadInputError(f"{where}: nested too deeply to be a metrics record", hint=_HINT) from None
    except ValueError:  # an integer over Python's 4,300-digit limit
        raise BadInputError(f"{where}: holds an integer with more than 4,300 digits", hint=_HINT) from None
    if not isinstance(rec, dict):
        raise BadInputError(f"{where}: a JSON {_json_type(rec)}, expected an object", hint=_HINT)
    return rec


def _classify(path: Path, n: int, rec: dict[str, Any], data: RunData) -> None:
    where = f"{path} line {n}"
    kind = rec.get("event")
    if kind is None:
        if "step" not in rec:
            raise BadInputError(f"{where}: neither a logged step (no \"step\") nor an event (no \"event\")", hint=_HINT)
        data.steps["step"].append(_integer(rec["step"], where, "step", required=True))
        for key in STEP_FIELDS:
            value = _number(rec.get(key), where, key)
            if key == "time" and value is not None and not math.isfinite(value):
                raise BadInputError(f"{where}: \"time\" must be a finite number, got {value}", hint=_HINT)
            data.steps[key].append(value)
    elif not isinstance(kind, str) or not kind:
        raise BadInputError(f"{where}: \"event\" must be a non-empty string, got {_show(kind)}", hint=_HINT)
    elif kind == "sample":
        data.samples.append(_sample(rec, where, data.unavailable))
    else:
        data.events.append(_event(n, kind, rec, where))


def _event(n: int, kind: str, rec: dict[str, Any], where: str) -> Event:
    time = _time(rec.get("time"), where, required=False)
    step = _integer(rec.get("step"), where, "step")
    if step is None and "from_step" in rec:  # the resume / restart record (train/run_dir.trim_metrics)
        step = _integer(rec.get("from_step"), where, "from_step")
    reason = rec.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise BadInputError(f"{where}: \"reason\" must be a string, got {_show(reason)}", hint=_HINT)
    details = {k: v for k, v in rec.items() if k not in ("event", "time", "step", "reason")}
    if not reason and kind in ("resume", "restart"):
        reason = (f"resumed from the checkpoint of step {step}" if kind == "resume" else "started again from step 0")
        if details.get("dropped_records"):
            reason += f"; {details['dropped_records']} later records dropped"
    return Event(line=n, kind=kind, time=time, step=step, reason=reason or "", details=details)


def _sample(rec: dict[str, Any], where: str, unavailable: dict[str, str]) -> Sample:
    time = _time(rec.get("time"), where, required=True)
    host = rec.get("host")
    if host is None:
        host = {}
    if not isinstance(host, dict):
        raise BadInputError(f"{where}: \"host\" must be an object, got {_show(host)}", hint=_HINT)
    gpus = rec.get("gpus")
    if gpus is None:
        gpus = []
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise BadInputError(f"{where}: \"gpus\" must be a list of objects, got {_show(gpus)}", hint=_HINT)
    host_sample = HostSample(**_sample_fields(HostSample, host, f"{where}: host", "host", unavailable))
    gpu_samples = []
    for i, g in enumerate(gpus):
        values = _sample_fields(GpuSample, g, f"{where}: gpus[{i}]", f"gpu{g.get('index', i)}", unavailable)
        values.setdefault("index", i)
        gpu_samples.append(GpuSample(**values))
    return Sample(time=time, host=host_sample, gpus=tuple(gpu_samples))


def _sample_fields(cls, raw: dict[str, Any], where: str, prefix: str, unavailable: dict[str, str]) -> dict[str, Any]:
    """The known fields of a HostSample / GpuSample, type-checked. The `unavailable` reasons are
    gathered once per field into `unavailable` (not kept per sample: a long run has many)."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in raw:
            continue
        value = raw[f.name]
        if f.name == "unavailable":
            if value is None:
                continue
            if not isinstance(value, dict):
                raise BadInputError(f"{where}.unavailable must be an object, got {_show(value)}", hint=_HINT)
            for key, why in value.items():
                unavailable.setdefault(f"{prefix}.{key}", str(why))
        elif f.name == "throttle_reasons":
            if value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
                raise BadInputError(f"{where}.throttle_reasons must be a list of strings, got {_show(value)}",
                                    hint=_HINT)
            out[f.name] = tuple(value)
        elif f.name == "on_ac":
            if value is not None and not isinstance(value, bool):
                raise BadInputError(f"{where}.on_ac must be true, false or null, got {_show(value)}", hint=_HINT)
            out[f.name] = value
        elif f.name == "index":
            out[f.name] = _integer(value, where, "index", required=True)
        else:
            out[f.name] = _number(value, where, f.name)
    return out


def _number(value: Any, where: str, key: str) -> float | int | None:
    """A measured number or None. NaN and infinity pass (a diverged loss is a finding, not a
    broken file); the report counts them and plots leave them out."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"{where}: \"{key}\" must be a number or null, got {_show(value)}", hint=_HINT)
    return value


def _integer(value: Any, where: str, key: str, *, required: bool = False) -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInputError(f"{where}: \"{key}\" must be a whole number >= 0, got {_show(value)}", hint=_HINT)
    return value


def _time(value: Any, where: str, *, required: bool) -> float | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadInputError(f"{where}: \"time\" must be a finite number of seconds (time.time()), got {_show(value)}",
                            hint=_HINT)
    return float(value)


def _json_type(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
