"""Load the run's data (local text / JSONL / Parquet / save_to_disk / shipped corpora) and shape
it for the method: packed token blocks for pretraining, text or chat rows for SFT (TRL tokenizes
them), prompt/chosen/rejected rows for DPO.

Columns are checked before any training starts, with the columns found and the key to set.

Where the data lives while it trains (data.* keys, docs/run-config.md):
- default: datasets' Arrow cache (memory-mapped files) in data.cache_dir or datasets' cache; the
  tokenising / packing maps (ours and TRL's) write their cache files next to the source's, so with
  cache_dir set every cache file lands there (a save_to_disk dataset is first copied there once,
  so nothing is written into the user's dataset directory);
- keep_in_memory: rows read straight into an in-memory Arrow table and every map kept in RAM, so
  no Arrow cache file is written anywhere;
- streaming: an IterableDataset read in file order (no shuffle buffer) and repeated pass after
  pass, so the Trainer never meets its end: the batches of a run are one fixed sequence, and the
  Trainer's resume (skip the first global_step x grad_accum batches) lands on the exact batch the
  interrupted run would have trained next. A stream is read by at most one DataLoader worker
  (export.training_args.dataloader_workers), because datasets deals a stream's shards out to the
  workers and the DataLoader interleaves their batches: more workers would change the order.
"""

from __future__ import annotations

from pathlib import Path
from trainfit.config.run_config import RunConfig, resolve_data_path
from trainfit.errors import BadInputError
from trainfit.files import FolderAdditions

_BY_SUFFIX = {".txt": "text", ".md": "text", ".text": "text", ".jsonl": "json", ".json": "json",
              ".parquet": "parquet", ".csv": "csv"}


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "state.json").is_file()
                              or (path / "dataset_dict.json").is_file())


def _files_by_builder(paths: list[str]) -> tuple[str, list[str]]:
    files: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files.extend(str(f) for f in sorted(path.rglob("*")) if f.suffix in _BY_SUFFIX)
        else:
            files.append(str(path))
    builders = {_BY_SUFFIX.get(Path(f).suffix.lower()) for f in files}
    if None in builders:
        bad = [f for f in files if Path(f).suffix.lower() not in _BY_SUFFIX]
        raise BadInputError(f"data.paths: cannot read {bad[0]} (valid: .txt, .md, .jsonl, .json, .parquet, "
                            f".csv files, or a directory written by datasets' save_to_disk)")
    if len(builders) != 1:
        raise BadInputError(f"data.paths: mixes file kinds ({', '.join(sorted(builders))}); "
                            "give files of one kind per run")
    return builders.pop(), files  # type: ignore[return-value]


def load_raw_dataset(cfg: RunConfig):
    """A datasets.Dataset (or IterableDataset when data.streaming) with the raw rows."""
    import datasets

    d = cfg.data
    paths = [resolve_data_path(p) for p in d.paths]
    saved = [p for p in paths if _is_saved_dataset(Path(p))]
    if saved:
        if len(saved) != len(paths):
            raise BadInputError("data.paths: a save_to_disk dataset cannot be mixed with other files")
        parts = []
        for p in saved:
            ds = datasets.load_from_disk(p, keep_in_memory=d.keep_in_memory)
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise BadInputError(f"data.paths: {p} has splits {', '.join(ds)}; a 'train' split is needed")
                ds = ds["train"]
            parts.append(ds)
        ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        if d.max_samples:
            ds = ds.select(range(min(d.max_samples, len(ds))))
        return ds.to_iterable_dataset() if d.streaming else _into_cache_dir(cfg, ds)
    builder, files = _files_by_builder(paths)
    try:
        if d.keep_in_memory:
            ds = _load_in_memory(builder, files, d.cache_dir)
        else:
            ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=d.cache_dir,
                                       streaming=d.streaming)
    except (ValueError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
        raise BadInputError(f"data.paths: cannot read {', '.join(files)}: {str(exc).splitlines()[0]}") from None
    if d.max_samples:
        ds = ds.take(d.max_samples) if d.streaming else ds.select(range(min(d.max_samples, len(ds))))
    return ds


def _load_in_memory(builder: str, files: list[str], cache_dir: str | None):
    """The files as an in-memory Dataset, without the Arrow cache file load_dataset would prepare
    (its keep_in_memory only skips the memory map, the file is still written): read as a stream,
    table by table, and joined in RAM."""
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    stream = datasets.load_dataset(builder, data_files=files, split="train", streaming=True, cache_dir=cache_dir)
    tables = list(stream.with_format("arrow").iter(batch_size=10_000))
    if not tables:
        raise BadInputError(f"data.paths: {', '.join(files)} hold no rows")
    return datasets.Dataset(InMemoryTable(pa.concat_tables(tables)))


def check_cache_dir(cfg: RunConfig) -> None:
    """data.cache_dir checked before any data is read (BadInputError): a folder that exists or can
    be created, in a place that can be written."""
    if cfg.data.cache_dir is not None:
        from trainfit.validate import output_dir

        output_dir(cfg.data.cache_dir, "data.cache_dir")


def cache_additions(cache_dir: str | None, run_dir: Path) -> FolderAdditions | None:
    """What a run adds to data.cache_dir when that lies outside its run directory (None otherwise),
    remembered from before any data is read, so that a run refused before its first checkpoint (a
    missing column, a corpus shorter than one block, a model that does not fit) takes its Arrow
    cache files out again and leaves nothing outside --out. A cache folder the run created goes
    whole; in one that existed only the entries that were not there before go, at any depth (a run
    sharing the folder at the same moment could lose a file it has just written, which datasets
    then writes again)."""
    root = Path(cache_dir).resolve() if cache_dir else None
    if root is None or root.is_relative_to(run_dir.resolve()):
        return None
    return FolderAdditions(root, deep=True)


def _into_cache_dir(cfg: RunConfig, ds):
    """With data.cache_dir set, the dataset's rows copied into it once when they live elsewhere
    (a save_to_disk directory): the maps that follow, TRL's included, write their cache files next
    to the source's, so this keeps them out of the user's dataset directory."""
    cache_dir = cfg.data.cache_dir
    if cache_dir is None or cfg.data.keep_in_memory or not ds.cache_files:
        return ds
    root = Path(cache_dir).resolve()
    sources = [Path(f["filename"]).resolve() for f in ds.cache_files]
    if all(p.is_relative_to(root) for p in sources):
        return ds
    from datasets.fingerprint import Hasher

    # Named by the content it copies (fingerprint, source files' size and time), so a rerun reuses it
    # and a rewritten dataset directory gets a new copy.
    stamp = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sources if p.exists()]
    root.mkdir(parents=True, exist_ok=True)
    name = f"trainfit-source-{Hasher.hash([ds._fingerprint, stamp])}.arrow"
    return ds.flatten_indices(cache_file_name=str(root / name))


def endless(cfg: RunConfig, ds):
    """A streamed dataset repeated pass after pass (the same order each pass), so the run's batches
    are one sequence the Trainer's resume can skip into exactly; a map-style dataset unchanged.

    The Trainer counts an IterableDataset's epoch as max_steps long and skips global_step x
    grad_accum batches of it on resume; a stream that ended earlier would restart in the
    uninterrupted run but not in the resumed one."""
    return ds.repeat(None) if cfg.data.streaming else ds


def build_train_dataset(cfg: RunConfig, tokenizer):
    """The dataset the Trainer gets: packed blocks (pretrain) or TRL's columns (SFT, DPO)."""
    raw = load_raw_dataset(cfg)
    check_columns(cfg, raw)
    ds = pack_for_pretraining(cfg, raw, tokenizer) if cfg.method == "pretrain" else rename_for_trl(cfg, raw)
    return endless(cfg, ds)


def for_this_machine(cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """The config with the data keys this run cannot honour as written adjusted, and one note each
    (logged at start; the runner records the change, train/in_force.py). Only speed keys change
    (none is in the config hash), so the run's batches, and its resume, stay the same."""
    import dataclasses

    from trainfit.export.training_args import dataloader_workers

    d, notes = cfg.data, []
    workers = dataloader_workers(cfg)
    if workers != d.num_workers:
        notes.append(f"data.num_workers {d.num_workers} -> {workers}: a stream is read in order by one DataLoader "
                     "worker (more would interleave its shards and change the data order an exact resume needs)")
        # (dataloader_workers gives the same count either way; set here so the config says it)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(d, num_workers=workers))
    start = _worker_start_method()
    if workers and d.streaming and cfg.method != "pretrain" and start != "fork":
        # TRL tokenises a stream lazily with functions local to its trainer, which pickle cannot send
        # to a worker started with spawn / forkserver (macOS, Windows; Linux from Python 3.14).
        notes.append(f"data.num_workers {workers} -> 0: DataLoader workers start with {start} here, and TRL's "
                     "tokenising steps of a streamed dataset cannot be sent to them; the stream is read in the "
                     "training process")
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(d, num_workers=0, prefetch_factor=None))
    return cfg, notes


def _worker_start_method() -> str:
    """How torch's DataLoader starts its workers here (the platform's default start method)."""
    import multiprocessing

    return multiprocessing.get_context().get_start_method()


def _columns(ds) -> list[str]:
    cols = ds.column_names
    if cols is None:  # streaming without known features: peek at one row
        first = next(iter(ds), None)
        if first is None:
            raise BadInputError("data.paths: the data holds no rows")
        cols = list(first.keys())
    return list(cols)


def check_columns(cfg: RunConfig, ds) -> None:
    """Raise BadInputError naming the missing column, the columns present and the key to set."""
    fmt = cfg.data_format
    need = {"text": [("text_column", cfg.data.text_column)],
            "chat": [("messages_column", cfg.data.messages_column)],
            "preference": [("prompt_column", cfg.data.prompt_column), ("chosen_column", cfg.data.chosen_column),
                           ("rejected_column", cfg.data.rejected_column)]}[fmt]
    cols = _columns(ds)
    missing = [(k, c) for k, c in need if c not in cols]
    if missing:
        what = ", ".join(f"'{c}' (data.{k})" for k, c in missing)
        raise BadInputError(f"data: {fmt} data needs column(s) {what}; the data has: {', '.join(cols) or 'none'}",
                            hint="set the data.*_column keys to the right names")


def text_iterator(cfg: RunConfig, ds, max_bytes: int):
    """Yield raw strings for tokenizer training, up to max_bytes."""
    fmt, seen = cfg.data_format, 0
    for row in ds:
        if fmt == "text":
            parts = [row[cfg.data.text_column]]
        elif fmt == "chat":
            parts = [m.get("content", "") for m in row[cfg.data.messages_column]]
        else:
            parts = [row[cfg.data.prompt_column], row[cfg.data.chosen_column], row[cfg.data.rejected_column]]
        for text in parts:
            if text:
                seen += len(text)
                yield text
        if seen >= max_bytes:
            return


def pack_for_pretraining(cfg: RunConfig, ds, tokenizer):
    """Tokenize, join documents with EOS, and cut into seq_len blocks (labels = input_ids).

    The same grouping as transformers' run_clm example; the tail that does not fill a block
    is dropped.
    """
    seq_len = cfg.training.seq_len
    cols = _columns(ds)
    streaming = cfg.data.streaming
    # map-style: in RAM with keep_in_memory, else cache files next to the source's (in cache_dir when set)
    kw = {} if streaming else {"keep_in_memory": cfg.data.keep_in_memory}
    tokenized = ds.map(_tokenize, batched=True, remove_columns=cols, **kw, **_desc(cfg, "tokenizing"),
                       fn_kwargs={"tokenizer": tokenizer, "column": cfg.data.text_column})
    packed = tokenized.map(_cut_blocks, batched=True, batch_size=1000, **kw, fn_kwargs={"seq_len": seq_len},
                           **_desc(cfg, f"packing into {seq_len}-token blocks"))
    empty = next(iter(packed), None) is None if streaming else len(packed) == 0  # a stream: its first block
    if empty:
        raise BadInputError(f"data: the corpus is shorter than one block of training.seq_len={seq_len} tokens")
    return packed


# Module-level (not closures), so that a streamed dataset can be pickled into DataLoader workers
# started with spawn (macOS, Windows); the tokenizer travels in fn_kwargs.
def _tokenize(batch, tokenizer, column: str):
    ids = tokenizer(batch[column], add_special_tokens=False)["input_ids"]
    return {"input_ids": [x + [tokenizer.eos_token_id] for x in ids]}


def _cut_blocks(batch, seq_len: int):
    flat = [t for ids in batch["input_ids"] for t in ids]
    n = (len(flat) // seq_len) * seq_len
    blocks = [flat[i:i + seq_len] for i in range(0, n, seq_len)]
    return {"input_ids": blocks, "labels": [list(b) for b in blocks]}


def _desc(cfg: RunConfig, text: str) -> dict[str, str]:
    return {} if cfg.data.streaming else {"desc": text}  # IterableDataset.map has no progress bar


def rename_for_trl(cfg: RunConfig, ds):
    """TRL reads 'text' / 'messages' / 'prompt'+'chosen'+'rejected': map the configured names."""
    fmt, d = cfg.data_format, cfg.data
    wanted = {"text": {d.text_column: "text"}, "chat": {d.messages_column: "messages"},
              "preference": {d.prompt_column: "prompt", d.chosen_column: "chosen",
                             d.rejected_column: "rejected"}}[fmt]
    mapping = {k: v for k, v in wanted.items() if k != v}
    keep = set(wanted)
    drop = [c for c in _columns(ds) if c not in keep]
    if drop:
        ds = ds.remove_columns(drop)
    return ds.rename_columns(mapping) if mapping else ds
