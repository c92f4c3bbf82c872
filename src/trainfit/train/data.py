"""Load the run's data (local text / JSONL / Parquet / save_to_disk / shipped corpora) and shape
it for the method: packed token blocks for pretraining, text or chat rows for SFT (TRL tokenizes
them), prompt/chosen/rejected rows for DPO.

Columns are checked before any training starts, with the columns found and the key to set.
"""

from __future__ import annotations

from pathlib import Path
from trainfit.errors import BadInputError
from trainfit.train.run_config import BUILTIN_DATA, RunConfig

_BY_SUFFIX = {".txt": "text", ".md": "text", ".text": "text", ".jsonl": "json", ".json": "json",
              ".parquet": "parquet", ".csv": "csv"}


def corpora_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "corpora"


def resolve_data_path(p: str) -> str:
    if p.startswith("builtin:"):
        return str(corpora_dir() / BUILTIN_DATA[p[8:]][0])
    return p


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

    paths = [resolve_data_path(p) for p in cfg.data.paths]
    saved = [p for p in paths if _is_saved_dataset(Path(p))]
    if saved:
        if len(saved) != len(paths):
            raise BadInputError("data.paths: a save_to_disk dataset cannot be mixed with other files")
        parts = []
        for p in saved:
            ds = datasets.load_from_disk(p)
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise BadInputError(f"data.paths: {p} has splits {', '.join(ds)}; a 'train' split is needed")
                ds = ds["train"]
            parts.append(ds)
        ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        if cfg.data.max_samples:
            ds = ds.select(range(min(cfg.data.max_samples, len(ds))))
        return ds.to_iterable_dataset() if cfg.data.streaming else ds
    builder, files = _files_by_builder(paths)
    try:
        ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cfg.data.cache_dir,
                                   streaming=cfg.data.streaming)
    except (ValueError, OSError, datasets.exceptions.DatasetGenerationError) as exc:
        raise BadInputError(f"data.paths: cannot read {', '.join(files)}: {str(exc).splitlines()[0]}") from None
    if cfg.data.max_samples:
        ds = ds.take(cfg.data.max_samples) if cfg.data.streaming else ds.select(
            range(min(cfg.data.max_samples, len(ds))))
    return ds


def _columns(ds) -> list[str]:
    cols = ds.column_names
    if cols is None:  # streaming without known features: peek at one row
        cols = list(next(iter(ds)).keys())
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
    seq_len, col, eos = cfg.training.seq_len, cfg.data.text_column, tokenizer.eos_token_id

    def tokenize(batch):
        ids = tokenizer(batch[col], add_special_tokens=False)["input_ids"]
        return {"input_ids": [x + [eos] for x in ids]}

    def group(batch):
        flat = [t for ids in batch["input_ids"] for t in ids]
        n = (len(flat) // seq_len) * seq_len
        blocks = [flat[i:i + seq_len] for i in range(0, n, seq_len)]
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]}

    cols = _columns(ds)
    kw = {} if cfg.data.streaming else {"desc": "tokenizing"}
    tokenized = ds.map(tokenize, batched=True, remove_columns=cols, **kw)
    kw = {} if cfg.data.streaming else {"desc": f"packing into {seq_len}-token blocks"}
    packed = tokenized.map(group, batched=True, batch_size=1000, **kw)
    if not cfg.data.streaming and len(packed) == 0:
        raise BadInputError(f"data: the corpus is shorter than one block of training.seq_len={seq_len} tokens")
    return packed


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
