"""How big a dataset is, for `trainfit plan`: local files or a save_to_disk directory (bytes on
disk, rows, and a cheap sample of row lengths), or a Hub dataset through `datasets`' size
metadata. The answer is a core DatasetInfo; what cannot be read is an `unavailable` reason and
the plan still runs from --dataset-tokens / --examples.

This module does I/O (core/plan/data_io.py decides from what it returns). `datasets` and
`pyarrow` are imported only when a directory, a Parquet file or a Hub id needs them: the core
install has neither.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from trainfit.core.plan.data_io import CHARS_PER_TOKEN, DatasetInfo
from trainfit.errors import BadInputError
from trainfit.validate import nested_deeper_than

# A sample is cheap: the first rows of the first files, at most this many rows or bytes.
SAMPLE_ROWS = 2000
SAMPLE_BYTES = 8 << 20
_TEXT_SUFFIXES = {".txt", ".md", ".text"}
_JSON_SUFFIXES = {".jsonl", ".json"}
_READABLE = _TEXT_SUFFIXES | _JSON_SUFFIXES | {".parquet", ".csv"}


def row_tokens(value: object) -> int:
    """Tokens of one row: its text (every string value, nested lists and dicts included) at
    CHARS_PER_TOKEN characters per token. Keys and JSON syntax are not text."""
    return max(1, math.ceil(_chars(value) / CHARS_PER_TOKEN))


def _chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    return 0


def _files(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in _READABLE)
                   if p.is_dir() else [p])
    return out


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / n).is_file() for n in ("dataset_info.json", "state.json",
                                                                   "dataset_dict.json"))


def _sample_lines(path: Path, budget_rows: int, budget_bytes: int) -> tuple[list[int], int, bool]:
    """(token lengths of the sampled rows, bytes read, whole file read) for text / JSONL files."""
    lengths, read = [], 0
    json_rows = path.suffix.lower() in _JSON_SUFFIXES
    with path.open("rb") as fh:
        for raw in fh:
            read += len(raw)
            line = raw.decode("utf-8", errors="replace").strip()
            if line:
                if json_rows:
                    lengths.append(row_tokens(_json_row(line, f"{path} line {len(lengths) + 1}")))
                else:
                    lengths.append(row_tokens(line))
            if len(lengths) >= budget_rows or read >= budget_bytes:
                return lengths, read, fh.read(1) == b""
    return lengths, read, True


def _json_row(text: str, where: str) -> object:
    """One JSON row (a JSONL line); BadInputError when the text is not JSON or is not a row."""
    try:
        return _loads(text, where)
    except json.JSONDecodeError:
        raise BadInputError(f"--data: {where} is not JSON (a .jsonl file has one JSON object per line)") from None


def _loads(text: str, where: str) -> object:
    """json.loads, with BadInputError for what no dataset holds: nesting deeper than
    MAX_ROW_DEPTH and integers Python will not read (over 4,300 digits)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise BadInputError(f"--data: {where} is nested too deeply to be a dataset") from None
    except ValueError:
        raise BadInputError(f"--data: {where} holds an integer with more than 4,300 digits") from None
    if nested_deeper_than(value, MAX_ROW_DEPTH):
        raise BadInputError(f"--data: {where} is nested more than {MAX_ROW_DEPTH} levels deep; a dataset is not")
    return value


MAX_ROW_DEPTH = 100  # chat rows nest 3-4 levels (list of messages, each a dict of strings)


def _json_array(path: Path) -> list[int] | None:
    """A .json file holding one array of rows (datasets reads those too), when small enough."""
    if path.stat().st_size > SAMPLE_BYTES:
        return None
    try:
        data = _loads(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except json.JSONDecodeError:
        return None
    return [row_tokens(r) for r in data] if isinstance(data, list) else None


def _parquet(path: Path, budget_rows: int) -> tuple[int, list[int]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    rows = pf.metadata.num_rows
    sample: list[int] = []
    if pf.metadata.num_row_groups:
        table = pf.read_row_group(0)
        sample = [row_tokens(r) for r in table.slice(0, budget_rows).to_pylist()]
    return rows, sample


def local_dataset_info(paths: list[str]) -> DatasetInfo:
    """Bytes, rows and sampled row lengths of local data (files, directories, save_to_disk)."""
    try:
        return _local_info(paths)
    except (OSError, ValueError) as exc:  # unreadable file, corrupt Parquet / Arrow (pyarrow: ValueError)
        if isinstance(exc, BadInputError):
            raise
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise BadInputError(f"--data: cannot read {', '.join(paths)}: {first}",
                            hint="give .txt / .jsonl / .json / .parquet / .csv files or a save_to_disk directory") from None


def _local_info(paths: list[str]) -> DatasetInfo:
    from trainfit.config.run_config import BUILTIN_DATA, resolve_data_path

    unknown = [p for p in paths if p.startswith("builtin:") and p[8:] not in BUILTIN_DATA]
    if unknown:
        raise BadInputError(f"--data: {unknown[0]} is not a shipped dataset (valid: "
                            f"{', '.join('builtin:' + k for k in BUILTIN_DATA)})")
    resolved = [Path(resolve_data_path(p)).expanduser() for p in paths]
    name = ", ".join(paths)
    missing = [str(p) for p in resolved if not p.exists()]
    if missing:
        raise BadInputError(f"--data: {missing[0]} does not exist")
    # A FIFO or a device would block the sample read forever (or never end: /dev/zero).
    special = [str(p) for p in resolved if not p.is_dir() and not p.is_file()]
    if special:
        raise BadInputError(f"--data: {special[0]} is not a regular file or a directory (a pipe or a device "
                            "cannot be sized)", hint="give the data files themselves")
    saved = [p for p in resolved if _is_saved_dataset(p)]
    if saved:
        return _saved_info(saved, name, str(resolved[0]))
    files = _files(resolved)
    stored = sum(f.stat().st_size for f in files)
    lengths: list[int] = []
    rows = 0.0
    unavailable: dict[str, str] = {}
    how = []
    line_rows = line_bytes = rest_bytes = 0.0  # text / JSONL files: rows per byte, and files past the sample
    for f in files:
        suffix = f.suffix.lower()
        left = SAMPLE_ROWS - len(lengths)
        if suffix == ".parquet":
            n, sample = _parquet(f, max(left, 0))
            rows += n
            lengths += sample
            continue
        if suffix == ".json" and (array := _json_array(f)) is not None:
            rows += len(array)
            lengths += array[:max(left, 0)]
            continue
        if suffix not in _TEXT_SUFFIXES | _JSON_SUFFIXES:
            unavailable["rows"] = f"{f.name}: rows not sampled for {suffix} files (tokens from bytes)"
            continue
        size = f.stat().st_size
        if left <= 0:  # the sample is taken: this file counts by its bytes at the sample's bytes per row
            rest_bytes += size
            continue
        sample, read, whole = _sample_lines(f, left, SAMPLE_BYTES)
        lengths += sample
        file_rows = len(sample) if whole else len(sample) * size / max(read, 1)
        rows += file_rows
        line_rows, line_bytes = line_rows + file_rows, line_bytes + size
        how.append(f"{f.name}: {'counted' if whole else f'{len(sample):,} rows sampled of {size / 1e6:,.1f} MB'}")
    if rest_bytes and line_bytes:
        rows += rest_bytes * line_rows / line_bytes
        how.append(f"{rest_bytes / 1e6:,.1f} MB more in later files at the sample's bytes per row")
    if "rows" in unavailable:  # some files were not counted: rows unknown, tokens from all the bytes
        rows = 0.0
    tokens = None
    if lengths and rows:
        tokens = int(rows * sum(lengths) / len(lengths))
        how_tokens = f"{int(rows):,} rows x {sum(lengths) / len(lengths):,.0f} tokens/row sampled"
    else:
        tokens = int(stored / CHARS_PER_TOKEN) if stored else None
        how_tokens = f"{stored:,} bytes / {CHARS_PER_TOKEN:g} bytes per token"
    return DatasetInfo("local", name, stored_bytes=stored, rows=int(rows) or None, tokens=tokens,
                       tokens_how="; ".join([*how, how_tokens]), row_tokens_sample=tuple(lengths),
                       path=str(resolved[0].resolve()), unavailable=unavailable, columns=_first_columns(files))


def _first_columns(files: list[Path]) -> tuple[str, ...]:
    """The keys of the first JSON row (JSONL line or array element), () when there is none."""
    for f in files:
        if f.suffix.lower() not in _JSON_SUFFIXES:
            continue
        try:
            with f.open("rb") as fh:
                head = fh.read(1 << 20).decode("utf-8", errors="replace").lstrip()
            if head.startswith("["):  # one array of rows: read when small (as _json_array does)
                data = json.loads(f.read_text(encoding="utf-8")) if f.stat().st_size <= SAMPLE_BYTES else None
                row = data[0] if isinstance(data, list) and data else None
            else:
                row = json.loads(head.splitlines()[0]) if head else None
        except (OSError, ValueError, IndexError, RecursionError):
            return ()
        return tuple(row) if isinstance(row, dict) else ()
    return ()


def _saved_info(saved: list[Path], name: str, first: str) -> DatasetInfo:
    try:
        import datasets
    except ImportError:
        stored = sum(f.stat().st_size for p in saved for f in p.rglob("*") if f.is_file())
        return DatasetInfo("local", name, stored_bytes=stored, tokens=int(stored / CHARS_PER_TOKEN),
                           tokens_how="bytes / 4 (datasets not installed: rows not read)", path=first,
                           unavailable={"rows": "datasets not installed (pip install 'trainfit[train]')"})
    rows, lengths, stored = 0, [], 0
    for p in saved:
        stored += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        ds = datasets.load_from_disk(str(p))  # memory-mapped: reading the row count costs nothing
        if isinstance(ds, datasets.DatasetDict):
            ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        rows += ds.num_rows
        take = min(SAMPLE_ROWS - len(lengths), ds.num_rows)
        if take > 0:
            lengths += [row_tokens(r) for r in ds.select(range(take)).to_list()]
    tokens = int(rows * sum(lengths) / len(lengths)) if lengths else None
    return DatasetInfo("local", name, stored_bytes=stored, rows=rows or None, tokens=tokens,
                       tokens_how=f"save_to_disk: {rows:,} rows, {len(lengths):,} sampled", path=first,
                       row_tokens_sample=tuple(lengths))


def hub_dataset_info(dataset: str, split: str = "train") -> DatasetInfo:
    """Sizes from the Hub's metadata (`datasets.load_dataset_builder(id).info`), no download.

    `dataset` is `ID` or `ID:CONFIG`. Offline, unreachable or without size metadata: a DatasetInfo
    whose `unavailable` says why, so the plan runs from --dataset-tokens / --examples."""
    hub_id, _, config = dataset.partition(":")
    if not hub_id.strip() or hub_id.count("/") > 1 or any(c.isspace() for c in hub_id):
        raise BadInputError(f"--dataset: {dataset!r} is not a Hub dataset id (valid: 'owner/name' or "
                            "'owner/name:config'); local data goes in --data PATH")
    try:
        import datasets
    except ImportError:
        return DatasetInfo("hub", dataset, unavailable={
            "size": "datasets not installed (pip install 'trainfit[train]'): Hub size not read"})
    try:
        info = datasets.load_dataset_builder(hub_id, config or None).info
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, gated, network: all "size unknown"
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return DatasetInfo("hub", dataset, unavailable={"size": f"Hub metadata not read ({first})"})
    splits = info.splits or {}
    part = splits.get(split) if hasattr(splits, "get") else None
    rows = part.num_examples if part is not None else None
    split_bytes = part.num_bytes if part is not None else None
    share = (split_bytes / info.dataset_size) if split_bytes and info.dataset_size else 1.0
    download = int(info.download_size * share) if info.download_size else None
    stored = split_bytes or info.dataset_size or None
    unavailable = {}
    if stored is None and download is None:
        unavailable["size"] = f"{hub_id}: the Hub's metadata has no dataset_size / download_size"
    tokens = int(stored / CHARS_PER_TOKEN) if stored else None
    how = (f"Hub metadata: {split} split {stored:,} bytes (Arrow) / {CHARS_PER_TOKEN:g} bytes per token"
           if stored else "")
    return DatasetInfo("hub", dataset, stored_bytes=stored, download_bytes=download, rows=rows, tokens=tokens,
                       tokens_how=how, unavailable=unavailable)


def with_counts(info: DatasetInfo | None, *, tokens: int | None, examples: int | None) -> DatasetInfo | None:
    """The user's --dataset-tokens / --examples win over measured counts (sizes and lengths stay)."""
    if tokens is None and examples is None:
        return info
    if info is None:
        return DatasetInfo("tokens", "--dataset-tokens" if tokens else "--examples", rows=examples, tokens=tokens,
                           tokens_how="given on the command line")
    return dataclasses.replace(info, tokens=tokens if tokens is not None else info.tokens,
                               rows=examples if examples is not None else info.rows,
                               tokens_how=(info.tokens_how + "; " if info.tokens_how else "") +
                               "counts given on the command line")
