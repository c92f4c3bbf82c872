"""The data side of a plan: where the data comes from and how fast, where its tokenised cache
goes, how many dataloader workers feed the trainer, whether the input pipeline is the
bottleneck, how many tokens (and epochs) the run gets, and whether SFT packs its examples.

Pure: it reads the HardwareProfile (storage kind, free space and measured read speed, network
bandwidth, cores, RAM), a DatasetInfo that trainfit.dataset_size measured, and one mode's
setup / speed / memory estimate. Every decision carries its reason, like the planner's.

Assumptions, each a named constant below: bytes per token of raw text and of each tokenised
form, the disk margin (core.plan.data_storage), the stream-vs-download threshold, the packing
threshold, the worker caps.
Disk reads are costed at the profile's measured *sequential* read speed: a shuffled read of a
memory-mapped file on a spinning disk also seeks, so on an HDD the stall given is a lower bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from trainfit.core.memory_types import MemoryEstimate
from trainfit.core.plan.data_storage import cache_path, disk_of, owned_machine, pick_disk
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import SFT_METHODS, TrainingSetup
from trainfit.core.speed.types import SpeedEstimate, Workload

GIB = 1 << 30

# Raw text: ~4 characters (about 4 bytes of English UTF-8) per BPE token, the rule of thumb of
# OpenAI's "What are tokens and how to count them?" (help.openai.com, read 2026-11-23) and of
# Cohere's BPE notes; code and non-English text have fewer characters per token.
CHARS_PER_TOKEN = 4.0
# Tokenised forms as `datasets` stores them (datasets 5.2.0, arrow_writer.py: `input_ids` is
# written as int32 and `attention_mask` as int8, every other integer column as int64; checked
# with Dataset.map on 2026-11-23):
#   pretrain: packed blocks of input_ids (4 B) + labels (8 B)            = 12 B/token
#   SFT (TRL): input_ids (4 B) + attention_mask (1 B)                      =  5 B/token
#   DPO (TRL): prompt/chosen/rejected_input_ids, not optimised -> int64    =  8 B/token
TOKENISED_BYTES_PER_TOKEN = {"pretrain": 12.0, "dpo": 8.0}
SFT_TOKENISED_BYTES_PER_TOKEN = 5.0
# Streaming must save at least this share of the run's wall time to be chosen over downloading
# first: a downloaded dataset resumes exactly and does not depend on the network mid-run.
STREAM_MIN_SAVING = 0.10
# SFT packs examples into seq_len blocks when padding would take at least this share of the
# padded tokens: below it the packing's cost (examples sharing a block, a less exact example
# count per epoch) buys little.
PACKING_MIN_WASTE = 0.20
# ... or when the rows fill at most half of seq_len (then two or more rows share each packed row,
# so the epoch takes at most half the steps of one row per sequence).
PACKING_MAX_FILL = 0.5
# Dataloader workers per training process: tokenised ids need little CPU per batch, so 4 keep a
# GPU fed from a local cache. A stream gets one: datasets deals a stream's shards out to the
# workers, so its order would depend on their number, and `trainfit train` reads a stream with one
# worker to resume it exactly (export/training_args.dataloader_workers).
MAX_WORKERS_CACHED = 4
MAX_WORKERS_STREAMED = 1
# PyTorch's DataLoader prefetches 2 batches per worker by default; a slow or variable source
# (spinning disk, network filesystem, streaming) gets 4 to absorb its latency spikes.
DEFAULT_PREFETCH = 2
SLOW_SOURCE_PREFETCH = 4
# The plan's step time takes in the data time when the stall is at least this share of the
# compute step (smaller stalls are inside the speed model's own error).
STALL_SHARE_SHOWN = 0.05

MEASURE_DISK = "measure it with `trainfit profile --benchmark`"
MEASURE_NETWORK = "measure it with `trainfit profile --bandwidth-url URL` (a large file near the data)"


@dataclass(frozen=True)
class DatasetInfo:
    """What is known of the dataset's size (trainfit.dataset_size measures it)."""

    source: Literal["local", "hub", "tokens"]
    name: str  # the path(s), the Hub id, or "--dataset-tokens"
    stored_bytes: int | None = None  # local: the files; Hub: the prepared Arrow dataset (dataset_size)
    download_bytes: int | None = None  # Hub: what load_dataset downloads (download_size)
    rows: int | None = None  # examples (DPO: pairs); counted or extrapolated from a sample
    tokens: int | None = None  # one epoch
    tokens_how: str = ""  # how rows / tokens were obtained
    row_tokens_sample: tuple[int, ...] = ()  # sampled token lengths per row (local text / JSONL)
    path: str | None = None  # local: the first path (which disk it is on)
    columns: tuple[str, ...] = ()  # local JSON rows: the first row's keys (the run config's data.format)
    unavailable: dict[str, str] = field(default_factory=dict)  # figure -> why it is unknown


@dataclass(frozen=True)
class TokenBudget:
    dataset_tokens: int | None  # one epoch of the dataset, as trained (padded to the batch)
    tokens_requested: int | None  # the request's epochs (or the pretraining ratio)
    tokens_in_time: int | None  # what the mode's hours_max buys at the plan's tokens/s
    tokens_in_budget: int | None  # what --budget dollars buy at the hourly price
    tokens: int | None  # planned: the smallest of the three
    epochs: float | None
    steps: int | None
    capped_by: str | None  # "time", "budget" or None


@dataclass(frozen=True)
class DataPlan:
    dataset: str
    source: str  # "local", "hub", "tokens", "none"
    streaming: bool
    download_first: bool | None  # Hub data only
    keep_in_memory: bool  # tokenised cache held in RAM
    cache_dir: str | None  # None: datasets' default ($HF_HOME/datasets)
    cache_on: str  # "ram", "nvme", "ssd", "hdd", "network", "unknown", "none (streamed)"
    num_workers: int
    prefetch_factor: int | None
    packing: bool | None  # None: the method's default (pretraining always packs; DPO does not)
    padding_waste: float | None  # share of padded tokens that are padding without packing
    tokenised_bytes: int | None
    download_seconds: float | None
    input_tokens_per_second: float | None  # what the source delivers; None: RAM or unknown
    trainer_tokens_per_second: float
    data_seconds_per_step: float | None
    stall_seconds_per_step: float | None
    data_bound: bool | None  # None: not known (a read speed was not measured)
    budget: TokenBudget | None
    reasons: dict[str, str]  # decision -> why: source, cache, workers, bottleneck, budget, packing
    warnings: list[str]
    assumptions: list[str]
    columns: tuple[str, ...] = ()  # local JSON rows: the first row's keys (DatasetInfo.columns)


@dataclass(frozen=True)
class ModeContext:
    """What one mode of the planner hands over."""

    mode: str
    setup: TrainingSetup
    speed: SpeedEstimate
    memory: MemoryEstimate
    memory_share: float
    hours_max: float
    epochs: float
    run_tokens: int | None  # tokens the planned run processes (all epochs), None without a workload
    pretrain_tokens: int | None = None
    usd_per_hour: float | None = None
    budget_usd: float | None = None


# ---------------------------------------------------------------------------------------------
# the dataset as the trainer sees it
def tokenised_bytes_per_token(method: str) -> float:
    return TOKENISED_BYTES_PER_TOKEN.get(method, SFT_TOKENISED_BYTES_PER_TOKEN)


def padding_waste(lengths: tuple[int, ...], seq_len: int, micro_batch: int) -> float | None:
    """Share of the padded tokens that are padding, without packing.

    Collators pad each micro-batch to its longest row (DataCollatorForLanguageModeling / TRL's
    default), cut at seq_len; the sample is taken in file order, micro_batch rows at a time."""
    if not lengths:
        return None
    cut = [max(1, min(n, seq_len)) for n in lengths]
    mb = max(1, micro_batch)
    padded = sum(max(cut[i:i + mb]) * len(cut[i:i + mb]) for i in range(0, len(cut), mb))
    return 1.0 - sum(cut) / padded if padded else None


def packing_decision(info: DatasetInfo | None, setup: TrainingSetup) -> tuple[bool | None, float | None, str]:
    """(packing, padding waste, why)."""
    if setup.method == "pretrain":
        return None, None, "pretraining always packs documents into seq_len blocks"
    if setup.method not in SFT_METHODS:
        return None, None, f"{setup.method}: no packing (TRL's DPO trainer pads each pair)"
    if info is None or not info.row_tokens_sample:
        return None, None, "row lengths not sampled (local text / JSONL data only): the method's default"
    waste = padding_waste(info.row_tokens_sample, setup.seq_len, setup.micro_batch)
    assert waste is not None
    lengths = info.row_tokens_sample
    mean = sum(min(n, setup.seq_len) for n in lengths) / len(lengths)
    fill = mean / setup.seq_len
    head = (f"{len(lengths):,} sampled rows average {mean:,.0f} tokens ({fill:.0%} of seq {setup.seq_len}); at "
            f"micro-batch {setup.micro_batch} padding to the longest row is {waste:.0%} of the padded tokens")
    if waste >= PACKING_MIN_WASTE:
        return True, waste, f"on: {head} (>= {PACKING_MIN_WASTE:.0%}); packing trains those slots on real tokens"
    if fill <= PACKING_MAX_FILL:
        return True, waste, (f"on: {head}, but rows fill <= {PACKING_MAX_FILL:.0%} of seq_len: packing puts "
                             f"~{1 / max(fill, 1e-9):.0f} rows in each, so the same tokens take fewer, fuller steps")
    return False, waste, f"off: {head} (< {PACKING_MIN_WASTE:.0%}) and rows fill most of seq_len"


def dataset_workload(info: DatasetInfo | None, setup: TrainingSetup, epochs: float) -> Workload | None:
    """The run's workload from a measured dataset (when the request gave no --examples / --dataset-tokens)."""
    if info is None:
        return None
    packing, _, _ = packing_decision(info, setup)
    if packing and info.rows and info.row_tokens_sample:
        sample = info.row_tokens_sample
        mean = sum(min(n, setup.seq_len) for n in sample) / len(sample)
        return Workload(dataset_tokens=max(1, int(info.rows * mean)), epochs=epochs)
    if setup.method != "pretrain" and info.rows:
        return Workload(examples=info.rows, epochs=epochs)
    if info.tokens:
        return Workload(dataset_tokens=info.tokens, epochs=epochs)
    return None


# ---------------------------------------------------------------------------------------------
# the machine: RAM and workers (the disks: core.plan.data_storage)
def _host_ram_need(ctx: ModeContext, hw: HardwareProfile) -> int:
    """RAM the training process itself holds next to a RAM cache (core.plan.host_ram)."""
    from trainfit.core.plan.host_ram import host_ram_need_bytes

    return host_ram_need_bytes(ctx.memory, ctx.setup, hw)


def _workers(ctx: ModeContext, hw: HardwareProfile, streamed: bool, slow: bool) -> tuple[int, int | None, str]:
    s = ctx.setup
    cores = hw.cpu.usable_cores
    if s.device == "cpu":
        threads = hw.cpu.physical_cores or int(cores)
        return 0, None, (f"0 workers: CPU training runs torch on {threads} cores, so the batches are read in "
                         "the training process (a worker would take a core from the matmuls)")
    # cores, like RAM and disks, are one node's: count the training processes on one node.
    processes = max(1, s.num_gpus // max(1, getattr(hw, "node_count", 1)))
    left = int(cores) - processes  # one core per training process (its Python loop and kernel launches)
    cap = MAX_WORKERS_STREAMED if streamed else MAX_WORKERS_CACHED
    per = max(0, min(cap, left // processes))
    if per == 0:
        return 0, None, (f"0 workers: {cores:g} usable cores, {processes} taken by the training process(es)")
    prefetch = SLOW_SOURCE_PREFETCH if slow or streamed else DEFAULT_PREFETCH
    why_cap = ("a stream is read in order by one worker, so a resumed run replays it exactly" if streamed
               else "tokenised ids need little CPU")
    return per, prefetch, (f"{per} workers per process x prefetch {prefetch}: {cores:g} usable cores - "
                           f"{processes} for the training process(es) = {left} left, capped at {cap} ({why_cap})"
                           + ("; prefetch 4 absorbs the slow source's latency" if prefetch == SLOW_SOURCE_PREFETCH else ""))


# ---------------------------------------------------------------------------------------------
def plan_data(hw: HardwareProfile, info: DatasetInfo | None, ctx: ModeContext) -> DataPlan:
    """One mode's data plan, decided in order: the source (stream or download), the cache (RAM, a
    disk, or none), the workers, the bottleneck, packing and the token budget. `reasons` keeps that
    order, and the warnings are the bottleneck's then the budget's."""
    s, sp = ctx.setup, ctx.speed
    reasons: dict[str, str] = {}
    warnings: list[str] = []
    b_tok = tokenised_bytes_per_token(s.method)
    layout = {"pretrain": "input_ids int32 + labels int64", "dpo": "int64 ids"}.get(
        s.method, "input_ids int32 + attention_mask int8")
    assumptions = [f"raw text ~{CHARS_PER_TOKEN:g} bytes/token",
                   f"tokenised {b_tok:g} bytes/token ({layout}, as datasets stores them)",
                   "disk reads at the measured sequential speed"]
    tokens = info.tokens if info else None
    if tokens is None and ctx.run_tokens and ctx.epochs:
        tokens = int(ctx.run_tokens / ctx.epochs)  # the workload the request gave
    if tokens is None and ctx.pretrain_tokens:
        tokens = ctx.pretrain_tokens
    tok_bytes = int(tokens * b_tok) if tokens else None
    name = info.name if info else "not described"
    source = info.source if info else "none"
    if info is not None and info.unavailable:
        reasons["size"] = "; ".join(f"{k}: {v}" for k, v in info.unavailable.items())

    in_ram, ram_why = _ram_cache(hw, info, ctx, tok_bytes)
    streaming, download_first, download_s, reasons["source"] = _source(hw, info, ctx, source, name, tok_bytes, in_ram)
    cache = _cache(hw, info, source, tok_bytes, b_tok, streaming, in_ram, ram_why, reasons)
    slow = cache.cache_on in ("hdd", "network") or cache.streaming
    workers, prefetch, reasons["workers"] = _workers(ctx, hw, cache.streaming, slow)
    flow = _input_flow(hw, sp, source, cache, workers, reasons, warnings)

    # -- packing and the token budget -------------------------------------------------------------
    packing, waste, reasons["packing"] = packing_decision(info, s)
    # The budget counts tokens at the speed the plan shows: with the data stall when it is shown.
    shown = with_data_time(sp, flow.stall, flow.data_bound) or sp
    budget = _token_budget(ctx, shown, tokens)
    if budget is not None:
        reasons["budget"] = _budget_reason(ctx, budget)
        if not packing and s.method != "pretrain":  # unpacked rows: the budget counts padded slots
            reasons["budget"] += (f" (counted as {s.seq_len}-token sequences, padding included: the rows' own "
                                  "tokens are fewer)")
        if budget.capped_by:
            warnings.append(reasons["budget"])
    return DataPlan(name, source, cache.streaming, download_first, cache.keep_in_memory, cache.cache_dir,
                    cache.cache_on, workers, prefetch, packing, waste, tok_bytes, download_s, flow.input_tps,
                    sp.tokens_per_second, flow.data_s, flow.stall, flow.data_bound, budget, reasons, warnings,
                    assumptions, columns=info.columns if info else ())


def _ram_cache(hw: HardwareProfile, info: DatasetInfo | None, ctx: ModeContext, tok_bytes: int | None
               ) -> tuple[bool, str]:
    """RAM: whether the tokenised cache fits next to the training process, within the mode's share,
    and why."""
    usable = hw.memory.usable_bytes
    ram_room = None
    if usable is not None:
        ram_room = int(ctx.memory_share * usable) - _host_ram_need(ctx, hw)
    # Held in RAM, the loaded rows stay next to their tokenised form (datasets keeps both tables).
    raw_bytes = (info.stored_bytes or 0) if info else 0
    in_ram = tok_bytes is not None and ram_room is not None and tok_bytes + raw_bytes <= ram_room
    if tok_bytes is None:
        ram_why = "dataset size unknown (give --data, --dataset or --dataset-tokens)"
    elif ram_room is None:
        ram_why = "RAM not measured: " + hw.memory.unavailable.get("usable_bytes", "unknown")
    else:
        ram_why = (f"tokenised {tok_bytes / GIB:,.2f} GiB" + (f" + loaded {raw_bytes / GIB:,.2f} GiB" if raw_bytes else "")
                   + f" vs {max(ram_room, 0) / GIB:,.2f} GiB of RAM left in "
                   f"{ctx.mode}'s {ctx.memory_share:.0%} after the training process' own "
                   f"{_host_ram_need(ctx, hw) / GIB:,.2f} GiB")
    return in_ram, ram_why


def _source(hw: HardwareProfile, info: DatasetInfo | None, ctx: ModeContext, source: str, name: str,
            tok_bytes: int | None, in_ram: bool) -> tuple[bool, bool | None, float | None, str]:
    """(streaming, download_first, download seconds, why): stream or download (Hub), read in place (local)."""
    if source == "hub":
        return _stream_or_download(hw, info, ctx, tok_bytes, in_ram)  # type: ignore[arg-type]
    if source == "local":
        return False, None, None, f"local data: read in place from {info.path or name}"  # type: ignore[union-attr]
    return False, None, None, ("no dataset given: sizes from --dataset-tokens / --examples" if source == "tokens" or
                               ctx.run_tokens else "no dataset given (--data PATH or --dataset HUB_ID)")


class _Cache(NamedTuple):
    """Where the tokenised cache goes and how fast it is read back."""

    streaming: bool  # a local dataset with no room for a cache is streamed too
    cache_dir: str | None
    cache_on: str
    read_mbps: float | None
    bytes_per_token: float  # as read: tokenised, or raw text when streamed
    keep_in_memory: bool


def _cache(hw: HardwareProfile, info: DatasetInfo | None, source: str, tok_bytes: int | None, b_tok: float,
           streaming: bool, in_ram: bool, ram_why: str, reasons: dict[str, str]) -> _Cache:
    """Where the tokenised cache goes (reasons["cache"] says why): none when streamed, RAM, else the
    fastest disk with room; a local dataset that fits neither is streamed from its files."""
    if streaming:
        reasons["cache"] = "none: a streamed dataset is tokenised on the fly, nothing is cached"
        return _Cache(True, None, "none (streamed)", hw.network.download_mbps, _download_bytes_per_token(info), False)
    if in_ram:
        reasons["cache"] = f"RAM: {ram_why}"
        return _Cache(False, None, "ram", None, b_tok, True)
    disk, disk_why = pick_disk(hw, tok_bytes)
    if disk is None and source == "local" and tok_bytes is not None and hw.storage:
        # No room for an Arrow copy: stream the local files instead of converting them.
        data_disk = disk_of(hw, info.path if info else None)
        reasons["cache"] = f"none: {disk_why}, and RAM is short ({ram_why}); the local files are streamed"
        return _Cache(True, None, "none (streamed)", data_disk.read_mbps if data_disk else None, CHARS_PER_TOKEN, False)
    if disk is None:
        reasons["cache"] = f"datasets' default cache dir: {disk_why}; RAM: {ram_why}"
        return _Cache(False, None, "unknown", None, b_tok, False)
    head = f"memory-mapped Arrow on {disk_why}" if disk.kind in ("nvme", "ssd") else f"{disk_why}"
    reasons["cache"] = f"{head} (not RAM: {ram_why})"
    if disk.read_mbps is None:
        reasons["cache"] += f"; read speed not measured ({disk.unavailable.get('read_mbps', 'unknown')})" + \
            (f": {MEASURE_DISK}" if owned_machine(hw) else "")
    return _Cache(False, cache_path(disk), disk.kind, disk.read_mbps, b_tok, False)


class _InputFlow(NamedTuple):
    """How fast the input pipeline feeds the trainer (None: not known)."""

    input_tps: float | None  # tokens/s the source delivers
    data_s: float | None  # seconds of reading per step
    stall: float | None  # seconds per step the trainer waits for data
    data_bound: bool | None


def _input_flow(hw: HardwareProfile, sp: SpeedEstimate, source: str, cache: _Cache, workers: int,
                reasons: dict[str, str], warnings: list[str]) -> _InputFlow:
    """Is the input pipeline the bottleneck? (reasons["bottleneck"], and a warning when it is or when
    the cache sits on slow storage)."""
    streaming, cache_on = cache.streaming, cache.cache_on
    read_mbps, bytes_per_token = cache.read_mbps, cache.bytes_per_token
    tokens_per_step = sp.tokens_per_second * sp.step_seconds
    input_tps = data_s = stall = None
    data_bound = None
    if cache_on == "ram":
        data_bound, stall, data_s = False, 0.0, 0.0
        reasons["bottleneck"] = "no: the tokenised cache is in RAM (GB/s, far above the trainer's need)"
    elif read_mbps is not None and read_mbps > 0:
        what = "network" if streaming and source == "hub" else f"{cache_on if not streaming else 'data'} disk"
        input_tps = read_mbps * 1e6 / bytes_per_token
        data_s = tokens_per_step * bytes_per_token / (read_mbps * 1e6)
        stall = max(0.0, data_s - sp.step_seconds) if workers else data_s
        data_bound = data_s > sp.step_seconds
        verdict = "yes" if data_bound else "no"
        reasons["bottleneck"] = (f"{verdict}: the {what} delivers {input_tps:,.0f} tokens/s ({_rate(read_mbps)} MB/s / "
                                 f"{bytes_per_token:.3g} B/token), the trainer consumes {sp.tokens_per_second:,.0f}; "
                                 f"{tokens_per_step * bytes_per_token / 1e6:,.2f} MB per step = {_dur(data_s)} of "
                                 f"reading vs {_dur(sp.step_seconds)} of compute"
                                 + ("" if workers else " (read in the training process: it adds to the step)"))
        if cache_on in ("hdd", "network") and not streaming:
            seeks = "; shuffled reads on a spinning disk also seek, so more" if cache_on == "hdd" else ""
            warnings.append(f"tokenised cache on {cache_on} storage: {_dur(data_s)} of reading per step "
                            f"(expected stall {_dur(stall)} per step with {workers} workers{seeks}); "
                            "put it on an SSD/NVMe or in RAM")
    else:
        if streaming and source == "hub":
            missing = "network bandwidth not measured" + (f": {MEASURE_NETWORK}" if owned_machine(hw) else "")
        elif cache_on == "unknown" and not hw.storage:
            missing = "storage not measured" + (" (a catalog machine)" if not owned_machine(hw)
                                                else f": {MEASURE_DISK}")
        else:
            missing = "disk read speed not measured" + (f": {MEASURE_DISK}" if owned_machine(hw) else "")
        reasons["bottleneck"] = f"not known: {missing}"
    if data_bound:
        warnings.append(f"the input pipeline is the bottleneck: {input_tps:,.0f} tokens/s delivered vs "
                        f"{sp.tokens_per_second:,.0f} consumed; the step time includes {_dur(stall)} of waiting")
    return _InputFlow(input_tps, data_s, stall, data_bound)


def _download_bytes_per_token(info: DatasetInfo | None) -> float:
    if info and info.download_bytes and info.tokens:
        return info.download_bytes / info.tokens
    return CHARS_PER_TOKEN


def _stream_or_download(hw: HardwareProfile, info: DatasetInfo, ctx: ModeContext, tok_bytes: int | None,
                        in_ram: bool) -> tuple[bool, bool, float | None, str]:
    """(streaming, download_first, download seconds, why) for a Hub dataset."""
    dl = info.download_bytes
    need = None if dl is None else dl + (info.stored_bytes or 0) + (0 if in_ram or tok_bytes is None else tok_bytes)
    disk, disk_why = pick_disk(hw, need)
    mbps = hw.network.download_mbps
    if need is None:
        return False, True, None, ("download first: the Hub's size metadata is unavailable, so nothing says "
                                   "it will not fit (check the disk before a large dataset)")
    if disk is None and hw.storage:
        return True, False, None, (f"stream: downloading needs {need / GIB:,.1f} GiB (download + Arrow + cache) and "
                                   f"{disk_why}")
    if mbps is None:
        why = "network bandwidth not measured" + (f" ({MEASURE_NETWORK})" if owned_machine(hw) else "")
        return False, True, None, (f"download first ({need / GIB:,.1f} GiB on {disk_why}): {why}; a downloaded "
                                   "dataset resumes exactly and does not depend on the network mid-run")
    download_s = dl / (mbps * 1e6)
    compute_s = (ctx.speed.total_seconds if ctx.speed.total_seconds is not None else None)
    if compute_s is None:
        return False, True, download_s, (f"download first: {dl / 1e9:,.2f} GB at {_rate(mbps)} MB/s = "
                                         f"{_dur(download_s)}; run length unknown (give --examples)")
    # The run may use only part of the data: the mode's hours or the --budget dollars cut it.
    planned_s = min(compute_s, ctx.hours_max * 3600)
    if ctx.budget_usd is not None and ctx.usd_per_hour:
        planned_s = min(planned_s, ctx.budget_usd / ctx.usd_per_hour * 3600)
    used = planned_s / compute_s if compute_s > 0 else 1.0  # share of the request's epochs that is trained
    passes = max(ctx.epochs, 1.0) * used  # how many times a stream pulls the data
    # Download first: all of it, then the run. Streaming: only what is trained, pulled again each
    # epoch, overlapped with compute (the slower of the two sets the pace).
    first = download_s + planned_s
    streamed = max(planned_s, passes * download_s)
    tail = (f"{dl / 1e9:,.2f} GB at {_rate(mbps)} MB/s = {_dur(download_s)}; download first {_dur(first)} in all "
            f"vs streamed {_dur(streamed)} (the run trains {passes:.2g} pass(es) over the data in {_dur(planned_s)})")
    if streamed <= first * (1 - STREAM_MIN_SAVING):
        return True, False, download_s, f"stream: {tail}; streaming overlaps the download with training"
    return False, True, download_s, (f"download first: {tail}; the download is small against the run "
                                     f"(streaming would save under {STREAM_MIN_SAVING:.0%})")


def _rate(mbps: float) -> str:
    return f"{mbps:,.0f}" if mbps >= 100 else f"{mbps:.3g}"


def _dur(seconds: float) -> str:
    from trainfit.core.durations import duration_text

    return duration_text(seconds)


def _token_budget(ctx: ModeContext, sp: SpeedEstimate, tokens_epoch: int | None) -> TokenBudget | None:
    s = ctx.setup
    if s.method == "inference":
        return None
    per_step = s.global_batch * s.seq_len * (2 if s.method == "dpo" else 1)
    requested = ctx.pretrain_tokens or ctx.run_tokens
    epoch_tokens = int(requested / ctx.epochs) if requested and not ctx.pretrain_tokens else tokens_epoch
    tps = sp.tokens_per_second
    in_time = int(tps * ctx.hours_max * 3600)
    in_budget = None
    if ctx.budget_usd is not None and ctx.usd_per_hour:
        in_budget = int(tps * ctx.budget_usd / ctx.usd_per_hour * 3600)
    if requested is None:
        return TokenBudget(epoch_tokens, None, in_time, in_budget, None, None, None, None)
    planned, capped = requested, None
    if ctx.pretrain_tokens is None:  # pretraining keeps its tokens-per-param budget (the ladder fits the time)
        if in_time < planned:
            planned, capped = in_time, "time"
        if in_budget is not None and in_budget < planned:
            planned, capped = in_budget, "budget"
    planned = max(per_step, planned)
    epochs = planned / epoch_tokens if epoch_tokens else None
    return TokenBudget(epoch_tokens, requested, in_time, in_budget, planned, epochs, math.ceil(planned / per_step),
                       capped)


def _budget_reason(ctx: ModeContext, b: TokenBudget) -> str:
    if b.tokens is None:
        return (f"{ctx.mode}'s {_hours(ctx.hours_max)} buy {_count(b.tokens_in_time)} tokens at this speed"
                + (f", the ${ctx.budget_usd:g} budget {_count(b.tokens_in_budget)}" if b.tokens_in_budget else "")
                + "; give --examples, --dataset-tokens, --data or --dataset for a token budget")
    ep = f" = {b.epochs:.3g} epochs" if b.epochs is not None else ""
    if ctx.pretrain_tokens:
        return f"pretraining: {_count(b.tokens)} tokens from the mode's tokens-per-parameter ratio{ep}"
    if b.capped_by == "time":
        return (f"token budget cut to {_count(b.tokens)} tokens{ep} ({b.steps:,} steps) by {ctx.mode}'s "
                f"{_hours(ctx.hours_max)}; the {ctx.epochs:g} epoch(s) asked need {_count(b.tokens_requested)}")
    if b.capped_by == "budget":
        return (f"token budget cut to {_count(b.tokens)} tokens{ep} ({b.steps:,} steps) by the "
                f"${ctx.budget_usd:g} budget at ${ctx.usd_per_hour:.2f}/h; the {ctx.epochs:g} epoch(s) asked "
                f"need {_count(b.tokens_requested)}")
    return (f"{_count(b.tokens)} tokens{ep} ({b.steps:,} steps): the whole request fits {ctx.mode}'s "
            f"{_hours(ctx.hours_max)}" + (f" and the ${ctx.budget_usd:g} budget" if b.tokens_in_budget else ""))


def _hours(hours: float) -> str:
    from trainfit.core.durations import hours_text

    return hours_text(hours)


def _count(n: float | None) -> str:
    if n is None:
        return "?"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


# ---------------------------------------------------------------------------------------------
# the data time in the plan's step time
def with_data_time(speed: SpeedEstimate, stall: float | None, data_bound: bool | None) -> SpeedEstimate | None:
    """The speed estimate with the input stall in its step (None when the stall is negligible)."""
    import dataclasses

    if not stall or stall < STALL_SHARE_SHOWN * speed.step_seconds:
        return None
    factor = (speed.step_seconds + stall) / speed.step_seconds
    parts = dict(speed.seconds_by_part)
    parts["data loading"] = stall
    return dataclasses.replace(
        speed, step_seconds=speed.step_seconds * factor, tokens_per_second=speed.tokens_per_second / factor,
        samples_per_second=speed.samples_per_second / factor, mfu=speed.mfu / factor,
        achieved_tflops_per_device=speed.achieved_tflops_per_device / factor, seconds_by_part=parts,
        bottleneck="data loading" if data_bound else speed.bottleneck,
        total_seconds=None if speed.total_seconds is None else speed.total_seconds * factor,
        notes=[*speed.notes, f"step time includes {_dur(stall)} of waiting for data per step"])


def plan_for_mode(req, mode: str, memory_share: float, hours_max: float, setup: TrainingSetup, speed: SpeedEstimate,
                  power, memory: MemoryEstimate, pretrain_tokens: int | None = None):
    """The planner's hook: (DataPlan or None, speed, power), with the data stall in the step time
    and the run's energy when it is shown. `req` is the planner's PlanRequest."""
    import dataclasses

    if setup.method == "inference":
        return None, speed, power
    run_tokens = None
    if speed.total_steps is not None:
        run_tokens = int(speed.total_steps * setup.global_batch * setup.seq_len * (2 if setup.method == "dpo" else 1))
    ctx = ModeContext(mode, setup, speed, memory, memory_share, hours_max, req.epochs, run_tokens, pretrain_tokens,
                      req.usd_per_hour, req.budget_usd)
    data = plan_data(req.hardware, req.dataset, ctx)
    slower = with_data_time(speed, data.stall_seconds_per_step, data.data_bound)
    if slower is None:
        return data, speed, power
    factor = slower.step_seconds / speed.step_seconds
    # Energy scales with the longer run (an upper bound: an accelerator waiting for data draws less).
    power = dataclasses.replace(
        power, run_seconds=None if power.run_seconds is None else power.run_seconds * factor,
        energy_kwh=None if power.energy_kwh is None else power.energy_kwh * factor,
        electricity_cost=None if power.electricity_cost is None else power.electricity_cost * factor)
    return data, slower, power
