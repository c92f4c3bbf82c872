"""The one validation layer for what comes in at the edge: numbers (command-line flags and config
keys), input files and output paths.

Numbers have one table of bounds, `BOUNDS`, keyed by the knob's name as the run config spells it;
command-line flags take `type=arg("name")` and config sections call `section_problems`. The bounds
are far above any real run (a million GPUs, 16M-token sequences) and low enough that nothing
loops, allocates or trains forever on a typo. NaN and infinity are never a valid value.

Input files are read through `read_text_file`: a directory, a binary file, a huge file or one
that is not UTF-8 is a BadInputError that names the file and says what was expected.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from trainfit.bounds import Bound  # the bound of one number (re-exported)
from trainfit.errors import BadInputError

# Configs, price lists, profiles and calibration files are small; 64 MiB is far above any.
MAX_TEXT_FILE_BYTES = 64 << 20


def _count(high: float, low: float = 1, **kw: Any) -> Bound:
    return Bound(low, high, integer=True, **kw)


def _number(low: float, high: float, **kw: Any) -> Bound:
    return Bound(low, high, integer=False, **kw)


_MILLION = 10**6
# Named by the run config's key where there is one; command-line flags map onto these names.
BOUNDS: dict[str, Bound] = {
    # training: the numeric knobs' bounds are declared in the knob table (trainfit.core.knobs),
    # which the run config (config.run_config) and the knob flags (cli.knob_flags) read
    "num_nodes": _count(1024),
    "dpo_beta": _number(0, 1000, low_open=True),
    # schedule
    "max_steps": _count(10**9),
    "epochs": _number(0, _MILLION, low_open=True),
    "lr": _number(0, 10, low_open=True),
    "warmup_steps": _count(10**9, 0),
    "weight_decay": _number(0, 100),
    "max_grad_norm": _number(0, 1e9),  # 0 turns clipping off
    "seed": _count(2**32 - 1, 0),
    "every_steps": _count(10**9),
    "keep_last": _count(10_000),
    # data, tokenizer, model shape
    "max_samples": _count(10**13),
    "num_workers": _count(1024, 0),  # DataLoader worker processes
    "prefetch_factor": _count(1024),  # batches each worker loads ahead
    "vocab_size": _count(1 << 24, 2),
    "train_max_bytes": _count(1 << 40),
    "layers": _count(100_000),
    "hidden": _count(1 << 20),
    "heads": _count(1 << 16),
    "kv_heads": _count(1 << 16),
    "intermediate": _count(1 << 22),
    "max_position_embeddings": _count(1 << 24),
    "vocab": _count(1 << 24, 2),
    # workload and money
    "dataset_tokens": _count(10**15, sizes=True),
    "examples": _count(10**13, sizes=True),
    "pairs": _count(10**13, sizes=True),  # DPO preference pairs of a pipeline (plan --pairs)
    "global_batch": _count(1 << 24),
    "target_batch": _count(1 << 24),
    "price_per_kwh": _number(0, 100),
    "usd_per_hour": _number(0, _MILLION),
    "budget_usd": _number(0, 1e12, low_open=True),
    "max_hours": _number(0, _MILLION, low_open=True),
    "setup_minutes": _number(0, _MILLION),
    "memory_share": _number(0, 1, low_open=True),
    "tokens_per_param": _number(0, _MILLION, low_open=True),
    "psu_watts": _number(0, _MILLION, low_open=True),
    "top": _count(_MILLION, 0),
    # measurement
    "timed_steps": _count(100_000),
    "warmup_timed_steps": _count(100_000, 0),
    "probe_seconds": _number(0, 3600, low_open=True),  # plan --probe-seconds
    # monitoring
    "interval_seconds": _number(0.05, 3600),
    # safety: a spot machine's mean hours between interruptions (36 seconds to ~114 years)
    "interruption_hours": _number(0.01, _MILLION),
}


def arg(name: str, bound: Bound | None = None):
    """An argparse `type=` for the bound `name` (BOUNDS[name] unless `bound` is given, as the knob
    table gives its numeric knobs' bounds): '--gpus 0' is a one-line error with exit 2."""
    bound = bound or BOUNDS[name]

    def parse(text: str) -> int | float:
        try:
            return bound.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def check(name: str, value: Any, where: str) -> Any:
    """`value` when it is within BOUNDS[name]; BadInputError naming `where` otherwise."""
    why = BOUNDS[name].problem(value)
    if why:
        raise BadInputError(f"{where}: {why}")
    return value


def section_problems(section: Any, path: str, names: dict[str, str] | None = None,
                     bounds: dict[str, Bound] | None = None) -> list[str]:
    """One message per field of a config dataclass that is outside its bound ('schedule.lr: must
    be ...'). `names` maps field names onto the keys of `bounds` (default BOUNDS) where they
    differ; None values (unset optional keys) are not checked."""
    import dataclasses

    bounds = BOUNDS if bounds is None else bounds
    errors = []
    for f in dataclasses.fields(section):
        key = (names or {}).get(f.name, f.name)
        value = getattr(section, f.name)
        if key in bounds and value is not None:
            why = bounds[key].problem(value)
            if why:
                errors.append(f"{path}.{f.name}: {why}")
    return errors


def read_text_file(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_TEXT_FILE_BYTES) -> str:
    """The text of a user's input file; BadInputError saying what is wrong with it otherwise."""
    p = Path(path)
    label = f"{what} {p}"
    if not str(path).strip():
        raise BadInputError(f"{what}: empty path")
    try:
        if p.is_dir():
            raise BadInputError(f"{label} is a directory, not a file")
        if not p.exists():
            raise BadInputError(f"{label} does not exist")
        if not p.is_file():
            raise BadInputError(f"{label} is not a regular file")
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise BadInputError(f"{label} cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise BadInputError(f"{label} is larger than {max_bytes >> 20} MiB; a {what} is a small text file")
    if b"\0" in data:
        raise BadInputError(f"{label} is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{label} is not UTF-8 text (invalid byte at offset {exc.start})") from None


def path_kind(path: str | os.PathLike) -> str:
    """'dir', 'file', 'other' (a pipe, a device, a socket) or 'none' for a user-given path. A name
    the filesystem cannot hold (a part over 255 bytes: 'File name too long') or may not look at is
    'none', not an OSError: such a path cannot be the user's file."""
    import stat

    try:
        mode = os.stat(os.path.expanduser(os.fspath(path))).st_mode
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return "none"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def output_file(path: str | os.PathLike, flag: str) -> Path:
    """A file path the command may write: not empty, not a directory or a device, in an existing
    directory that can be written."""
    text = str(path)
    if not text.strip():
        raise BadInputError(f"{flag}: empty path (give a file name)")
    p = Path(text).expanduser()
    if p.is_dir():
        raise BadInputError(f"{flag}: {p} is a directory; give a file name inside it")
    if p.exists() and not p.is_file():
        raise BadInputError(f"{flag}: {p} is not a regular file")
    _writable_dir(p.parent if str(p.parent) else Path("."), flag)
    return p


def output_dir(path: str | os.PathLike, flag: str) -> Path:
    """A directory the command may create or fill: not empty, not a file, its nearest existing
    ancestor a directory that can be written."""
    text = str(path)
    if not text.strip():
        raise BadInputError(f"{flag}: empty path (give a directory)")
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise BadInputError(f"{flag}: {p} is a file, not a directory")
    existing = p
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise BadInputError(f"{flag}: {existing} is a file, so {p} cannot be a directory")
    _writable_dir(existing, flag)
    return p


def _writable_dir(directory: Path, flag: str) -> None:
    if not directory.is_dir():
        raise BadInputError(f"{flag}: directory {directory} does not exist")
    # Kernel filesystems (/proc, /sys) accept no new files even for root.
    if not os.access(directory, os.W_OK | os.X_OK) or _is_pseudo_fs(directory):
        raise BadInputError(f"{flag}: cannot write in {directory}")


def _is_pseudo_fs(directory: Path) -> bool:
    resolved = directory.resolve()
    return any(resolved == Path(root) or Path(root) in resolved.parents for root in ("/proc", "/sys"))


def parse_json(text: str | bytes, origin: str) -> Any:
    """JSON from a user's file; BadInputError with the line and column when it is not JSON, holds
    an integer too long to read, or is nested deeper than a real file is."""
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInputError(f"{origin}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except UnicodeDecodeError:
        raise BadInputError(f"{origin}: not UTF-8 text") from None
    except RecursionError:
        raise BadInputError(f"{origin}: {_TOO_DEEP}") from None
    except ValueError as exc:  # Python refuses to read integers of more than 4,300 digits
        raise BadInputError(f"{origin}: {_number_problem(exc)}") from None
    # depth only: JSON has no aliases, so its size is its byte count (a large safetensors header
    # holds over a million values and is a real file)
    _check_document(data, origin, count_values=False)
    return data


def parse_yaml(text: str, origin: str) -> Any:
    """YAML (safe subset) from a user's file; BadInputError with the parser's first line otherwise.
    A key given twice in one mapping is refused (YAML would keep the last one silently), and so
    is a document whose aliases expand to more values than a real file has ("billion laughs")."""
    from trainfit import yaml_io

    try:
        data = yaml_io.load_yaml(text, unique_keys=True)
    except yaml_io.YAMLError as exc:
        raise BadInputError(f"{origin}: not valid YAML: {_first_line(exc)}") from None
    except RecursionError:
        raise BadInputError(f"{origin}: {_TOO_DEEP}") from None
    except ValueError as exc:  # an integer over Python's 4,300-digit limit
        raise BadInputError(f"{origin}: {_number_problem(exc)}") from None
    _check_document(data, origin)
    return data


# A user's document: configs, price lists, profiles, dataset rows. Far above any real one.
MAX_DOCUMENT_DEPTH = 100
MAX_DOCUMENT_VALUES = 1_000_000
_TOO_DEEP = f"nested more than {MAX_DOCUMENT_DEPTH} levels deep; a real file is not"


def nested_deeper_than(value: Any, levels: int) -> bool:
    """True when the lists / dicts of parsed JSON nest more than `levels` deep (a scalar is 0 levels,
    [] or {} one), found without recursion. For trees: a YAML document's aliases (shared parts) are
    walked once per reference, so count those first (_check_document)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > levels:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _number_problem(exc: ValueError) -> str:
    if "digits" in str(exc):
        return "holds an integer with more than 4,300 digits; no setting is that large"
    return f"cannot be read: {_first_line(exc)}"


def _check_document(data: Any, origin: str, *, count_values: bool = True) -> None:
    """BadInputError when `data` nests deeper than MAX_DOCUMENT_DEPTH or (`count_values`, for YAML),
    counting every value a shared (aliased) part stands for, holds more than MAX_DOCUMENT_VALUES values."""
    counted: dict[int, int] = {}  # id of a list / dict -> values under it (aliases share objects)

    def values(node: Any, depth: int) -> int:
        if depth > MAX_DOCUMENT_DEPTH:
            raise BadInputError(f"{origin}: {_TOO_DEEP}")
        if not isinstance(node, (list, dict)):
            return 1
        if id(node) in counted:
            return counted[id(node)]
        children = list(node.values()) if isinstance(node, dict) else node
        total = 1 + len(node) if isinstance(node, dict) else 1
        for child in children:
            total += values(child, depth + 1)
            if count_values and total > MAX_DOCUMENT_VALUES:
                raise BadInputError(f"{origin}: expands to more than {MAX_DOCUMENT_VALUES:,} values (YAML aliases "
                                    "repeating each other?); a real file is far smaller")
        counted[id(node)] = total
        return total

    values(data, 0)
