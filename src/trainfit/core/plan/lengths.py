"""How long the examples are: the length distribution a plan sizes its data with.

`--examples N` is N rows of some length distribution, not N x the mode's sequence length: the
tokens an epoch trains are N x the mean row length cut at seq_len, the same in every mode and on
every machine except for what a shorter sequence truncates. The distribution comes from the data
when it is given (--data: sampled row lengths; --dataset: the Hub's bytes per row), else from a
typical length per task (data/typical_lengths.yaml, each mean cited). Pure.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from dataclasses import dataclass
from importlib import resources
from statistics import NormalDist

from trainfit import yaml_io
from trainfit.core.plan.data_io import CHARS_PER_TOKEN, DatasetInfo
from trainfit.core.setup import SFT_METHODS, TrainingSetup

# Points of the synthetic sample drawn from a log-normal (quantile midpoints, so deterministic);
# shuffled with a fixed seed so that micro-batches of it mix short and long rows as a shuffled
# dataset does (data_io.padding_waste takes the sample in order).
SAMPLE_POINTS = 512
SHUFFLE_SEED = 0
# TRL's DPO trainer trains two sequences per pair (prompt + chosen, prompt + rejected); a pair's
# row length counts the prompt and both responses, so each sequence is taken as half the row.
SEQUENCES_PER_ROW = {"dpo": 2}
_REQUIRED = {"task", "description", "rows_are", "dataset", "stored_bytes", "rows", "sigma", "source"}


class LengthCatalogError(ValueError):
    """The shipped typical_lengths.yaml is invalid (a packaging bug, not a user mistake)."""


@dataclass(frozen=True)
class TypicalLength:
    task: str  # "sft", "dpo", "pretrain"
    description: str
    rows_are: str
    dataset: str
    mean_tokens: float  # per row: stored bytes / rows / CHARS_PER_TOKEN
    sigma: float  # log-normal spread (assumed)
    source: str


@dataclass(frozen=True)
class DataLengths:
    """The data as one mode's sequence length trains it."""

    rows: int  # examples (DPO: pairs) per epoch
    mean_row_tokens: float  # before truncation (a DPO pair: prompt + both responses)
    seq_len: int
    truncated_share: float  # of the sequences, longer than seq_len (their ends are not trained)
    epoch_tokens: int  # data tokens one epoch trains (after truncation, both DPO sequences)
    how: str  # where the lengths come from


def parse_lengths(text: str, origin: str = "typical_lengths.yaml", *, cached: bool = False) -> dict[str, TypicalLength]:
    # The shipped catalog goes through the parsed-YAML cache, as the other catalogs do, so that a
    # quick command reads it back without importing PyYAML.
    data = yaml_io.load_yaml_cached(text, origin) if cached else yaml_io.load_yaml(text)
    entries = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise LengthCatalogError(f"{origin}: expected a non-empty 'tasks:' list")
    out: dict[str, TypicalLength] = {}
    for i, raw in enumerate(entries):
        if not isinstance(raw, dict) or set(raw) != _REQUIRED:
            raise LengthCatalogError(f"{origin}: tasks[{i}] needs exactly the keys {sorted(_REQUIRED)}")
        numbers = (raw["stored_bytes"], raw["rows"], raw["sigma"])
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in numbers):
            raise LengthCatalogError(f"{origin}: {raw['task']}: stored_bytes, rows and sigma must be positive")
        if "http" not in str(raw["source"]):
            raise LengthCatalogError(f"{origin}: {raw['task']}: source must name the URL the figures come from")
        out[str(raw["task"])] = TypicalLength(
            str(raw["task"]), str(raw["description"]), str(raw["rows_are"]), str(raw["dataset"]),
            raw["stored_bytes"] / raw["rows"] / CHARS_PER_TOKEN, float(raw["sigma"]), str(raw["source"]))
    return out


@functools.lru_cache(maxsize=1)
def typical_lengths() -> dict[str, TypicalLength]:
    text = resources.files("trainfit").joinpath("data/typical_lengths.yaml").read_text(encoding="utf-8")
    return parse_lengths(text, cached=True)


def task_for(method: str) -> str | None:
    """The task whose typical lengths a method's rows have (None: inference has no dataset)."""
    if method in ("auto", "sft", *SFT_METHODS):
        return "sft"
    return method if method in ("dpo", "pretrain") else None


@functools.lru_cache(maxsize=64)
def lognormal_sample(mean_tokens: float, sigma: float, points: int = SAMPLE_POINTS) -> tuple[int, ...]:
    """Row lengths of a log-normal with this mean: its quantiles at the midpoints of `points` equal
    slices, in a fixed shuffled order."""
    mu = math.log(mean_tokens) - sigma * sigma / 2  # E[X] = exp(mu + sigma^2 / 2)
    normal = NormalDist(mu, sigma)
    lengths = [max(1, round(math.exp(normal.inv_cdf((i + 0.5) / points)))) for i in range(points)]
    random.Random(SHUFFLE_SEED).shuffle(lengths)
    return tuple(lengths)


def with_lengths(info: DatasetInfo | None, method: str, examples: int | None) -> DatasetInfo | None:
    """The dataset with a row-length sample: the measured one, else one drawn around the Hub's bytes
    per row, else the task's typical length. None without rows to size."""
    task = task_for(method)
    if task is None:
        return info
    if info is None:
        if examples is None:
            return None
        info = DatasetInfo("tokens", "--examples", rows=examples, tokens_how="given on the command line")
    if info.row_tokens_sample or not info.rows:
        return info
    typical = typical_lengths()[task]
    if info.tokens:  # Hub metadata: bytes per row measured, the spread assumed
        sample = lognormal_sample(info.tokens / info.rows, typical.sigma)
        return dataclasses.replace(info, row_tokens_sample=sample)
    sample = lognormal_sample(typical.mean_tokens, typical.sigma)
    return dataclasses.replace(info, row_tokens_sample=sample, tokens=int(info.rows * sum(sample) / len(sample)),
                               tokens_how=_join(info.tokens_how, length_source(info, method)))


def examples_workload(setup: TrainingSetup, examples: int, epochs: float):
    """`--examples N` as every command sizes it (plan, estimate, cloud): N rows of the task's
    typical length distribution, packed or not as the plan's data rule decides for this setup."""
    from trainfit.core.plan.data_io import dataset_workload
    from trainfit.core.speed import Workload

    return (dataset_workload(with_lengths(None, setup.method, examples), setup, epochs)
            or Workload(examples=examples, epochs=epochs))


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def length_source(info: DatasetInfo, method: str) -> str:
    """Where the row lengths come from, in a few words (with the typical length's citation)."""
    task = task_for(method) or "sft"
    typical = typical_lengths()[task]
    if info.source == "local":
        return f"lengths of {len(info.row_tokens_sample):,} rows sampled from {info.name}"
    if info.source == "hub" and info.tokens and info.rows:
        return (f"{info.name}: {info.tokens / info.rows:,.0f} tokens per row from its size, log-normal spread "
                f"(sigma {typical.sigma:g}) assumed")
    return (f"typical {typical.description}: {typical.mean_tokens:,.0f} tokens per row, {typical.dataset}'s size "
            f"per row (data/typical_lengths.yaml), log-normal spread assumed; --data measures yours")


def sequence_lengths(info: DatasetInfo, method: str) -> list[float]:
    """Token lengths of the sequences the trainer builds from the sampled rows."""
    per_row = SEQUENCES_PER_ROW.get(method, 1)
    return [n / per_row for n in info.row_tokens_sample]


def truncated_share(lengths: list[float], seq_len: int) -> float:
    return sum(1 for n in lengths if n > seq_len) / len(lengths) if lengths else 0.0


def data_lengths(info: DatasetInfo | None, setup: TrainingSetup) -> DataLengths | None:
    """What one epoch of the data is at this setup's sequence length (None: no rows or lengths)."""
    if info is None or not info.rows or not info.row_tokens_sample or setup.method == "inference":
        return None
    seqs = sequence_lengths(info, setup.method)
    per_row = SEQUENCES_PER_ROW.get(setup.method, 1)
    if setup.method == "pretrain":  # documents are packed into blocks: nothing is cut off
        kept, cut = sum(seqs) / len(seqs), 0.0
    else:
        kept, cut = sum(min(n, setup.seq_len) for n in seqs) / len(seqs), truncated_share(seqs, setup.seq_len)
    mean_row = sum(info.row_tokens_sample) / len(info.row_tokens_sample)
    return DataLengths(info.rows, mean_row, setup.seq_len, cut, int(info.rows * per_row * kept),
                       length_source(info, setup.method))


def truncation_text(d: DataLengths, method: str) -> str:
    """`seq 1024 truncates 22 % of the examples` (or that none is cut)."""
    what = "pair sequences" if method == "dpo" else "documents" if method == "pretrain" else "examples"
    if method == "pretrain":
        return f"documents are packed into {d.seq_len}-token blocks (none is cut off)"
    if d.truncated_share <= 0:
        return f"seq {d.seq_len} truncates none of the {what}"
    share = "<1%" if d.truncated_share < 0.005 else f"{d.truncated_share:.0%}"
    return f"seq {d.seq_len} truncates {share} of the {what} (their ends are not trained)"


def truncation_at(info: DatasetInfo | None, method: str, seq_len: int) -> str:
    """What `seq_len` cuts off of the data (its sample, else the task's typical lengths)."""
    task = task_for(method)
    if task is None:
        return ""
    if info is None or not info.row_tokens_sample:
        typical = typical_lengths()[task]
        info = DatasetInfo("tokens", "typical", rows=1, row_tokens_sample=lognormal_sample(typical.mean_tokens,
                                                                                           typical.sigma))
    sized = data_lengths(info, TrainingSetup(method=method if method != "auto" else "full", seq_len=seq_len))
    if sized is None:
        return ""
    return truncation_text(sized, method) + ("" if info.name != "typical" else " at typical lengths")
