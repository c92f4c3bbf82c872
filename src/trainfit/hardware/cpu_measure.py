"""This machine's CPU rates, measured by default instead of guessed from a datasheet.

A profile of the live machine carries measured CPU figures (memory bandwidth, fp32 and bf16
matmul GFLOP/s) without `--benchmark`: they are measured once (a few seconds, most of it importing torch) and kept in the
user cache, keyed by the machine, the CPU model, the usable cores and the torch and numpy
versions (a new BLAS or torch build can change the rates). `profile --benchmark` measures again
and replaces the entry.

A measurement is only this machine's rates when nothing else ran on its cores. Every
measurement is watched (hardware.cpu_load: other processes' CPU time and the hypervisor's steal on
our CPUs, the 1-minute load average before and after, the spread of the repeated fp32 timings);
a disturbed one is repeated (MAX_ATTEMPTS, within ATTEMPTS_BUDGET_SECONDS) and, when every try was
disturbed, the least disturbed is used for the command that measured it, flagged
(`load_check.reliable` false, `unavailable["under_load"]`, shown by `profile` and `plan`), and
kept apart from the machine's rates: reused for PROVISIONAL_SECONDS while the machine stays busy
(commands run together agree without measuring each time), replaced by the first quiet
measurement, and never overwriting a quiet one. One taken with one other 2-thread job running
gave 87.7 GFLOP/s fp32 where the quiet machine gives 205, and the old rule (1-minute load above
1.25 x cores) let it through.

Cache file (JSON, one per identity): {"identity": ..., "benchmark": <BenchmarkInfo, quiet
measurement>, "under_load": <BenchmarkInfo, the latest flagged one>}; either key may be absent.
Version 2 of the identity: entries of version 1 were kept without a load check and are measured
again.

Why measure: the datasheet guess (clock x vector width x cores x 0.7) was 37-71 % off on a
2-core AVX2 EPYC, and bf16 without AVX512-BF16 / AMX runs about 50x slower than fp32, not 2x
faster (hardware.benchmark.cpu_autocast_bf16_gflops measures it).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import time
from collections.abc import Callable

from trainfit.core.machines.profile import BenchmarkInfo, CpuInfo
from trainfit.hardware import cpu_load
from trainfit.hardware.cpu_load import FP32_REPEATS, judge
from trainfit.hardware.sources import Sources, read_text

CACHE_FOLDER = "cpu-rates"
CACHE_VERSION = 2
CPU_ONLY = "not measured by the default CPU measurement (run --benchmark)"
MAX_ATTEMPTS = 3
RETRY_PAUSE_SECONDS = 2.0
# No new try starts after this (the profile's benchmark probe is given 45 s in all).
ATTEMPTS_BUDGET_SECONDS = 15.0
# A flagged measurement is reused this long, and only while the machine is still busy.
PROVISIONAL_SECONDS = 600.0
QUIET_SAMPLE_SECONDS = 0.25
NOT_KEPT = "used for this command only, not kept as this machine's rates (measured again when it is quiet)"


def native_bf16(cpu: CpuInfo) -> bool:
    return bool(cpu.flags.get("bf16") or cpu.flags.get("avx512_bf16") or cpu.flags.get("amx_bf16"))


def identity(src: Sources, cpu: CpuInfo) -> str:
    """What the rates depend on: this machine, its CPU, the cores this process may use, the libraries."""
    machine = read_text(src.fs, "/etc/machine-id") or read_text(src.fs, "/var/lib/dbus/machine-id")
    return "|".join([f"v{CACHE_VERSION}", machine or src.platform.hostname, cpu.model or "", str(cpu.logical_cores),
                     str(cpu.usable_cores), _version("torch"), _version("numpy")])


def _version(dist: str) -> str:
    from trainfit.versions import installed_version

    return installed_version(dist) or "none"


def _cache_file(key: str):
    from trainfit.user_cache import user_cache_dir

    return user_cache_dir(CACHE_FOLDER, hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="seconds")


def measure_cpu(cpu: CpuInfo) -> BenchmarkInfo:
    """Memory bandwidth, fp32 matmul and the bf16 training-matmul rate (see benchmark.cpu_bf16_rate),
    with the spread of the fp32 repeats in load_check (the load itself is judged by the caller)."""
    from trainfit.hardware.benchmark import (cpu_bf16_rate, cpu_dropout_rate, cpu_fp32_rates, cpu_step_rates,
                                             memory_bandwidth_gbps, spread)

    t0 = time.perf_counter()
    reasons = {k: CPU_ONLY for k in ("gpu_bandwidth_gbps", "disk_read_mbps", "disk_write_mbps")}
    mem = round(memory_bandwidth_gbps(), 1)
    fp32_runs = cpu_fp32_rates(reps=FP32_REPEATS)
    bf16, why = cpu_bf16_rate(cpu)
    if why:
        reasons["cpu_bf16_gflops"] = why
    dropout_ns, why = cpu_dropout_rate()
    if why:
        reasons["cpu_dropout_ns_per_element"] = why
    step_rates, why_not = cpu_step_rates()
    reasons.update(why_not)
    return BenchmarkInfo(mem, round(max(fp32_runs), 1), bf16, {}, None, None, None, round(time.perf_counter() - t0, 2),
                         reasons, measured_at=_iso(time.time()), scope="cpu", cpu_dropout_ns_per_element=dropout_ns,
                         load_check=judge(None, round(spread(fp32_runs), 3), 1), **step_rates)


def _spread(bench: BenchmarkInfo) -> float | None:
    return bench.load_check.fp32_spread if bench.load_check is not None else None


def watched(bench_fn: Callable[[], BenchmarkInfo], attempts: int = 1) -> BenchmarkInfo:
    """Run one measurement and attach the load seen during it (load_check)."""
    start = cpu_load.snapshot()
    bench = bench_fn()
    check = judge(cpu_load.window(start), _spread(bench), attempts)
    unavailable = {k: v for k, v in bench.unavailable.items() if k != "under_load"}
    if not check.reliable:
        unavailable["under_load"] = f"measured under load: {check.reason}; {NOT_KEPT}"
    return dataclasses.replace(bench, load_check=check, unavailable=unavailable)


def measure_checked(cpu: CpuInfo, measure: Callable[[CpuInfo], BenchmarkInfo] | None = None) -> BenchmarkInfo:
    """Measure until one try is undisturbed (at most MAX_ATTEMPTS within ATTEMPTS_BUDGET_SECONDS);
    when none was, the least disturbed (highest fp32 rate), flagged."""
    fn = measure or measure_cpu
    t0 = time.monotonic()
    tries: list[BenchmarkInfo] = []
    while True:
        bench = watched(lambda: fn(cpu), len(tries) + 1)
        tries.append(bench)
        if (bench.load_check.reliable or len(tries) >= MAX_ATTEMPTS  # type: ignore[union-attr]
                or time.monotonic() - t0 > ATTEMPTS_BUDGET_SECONDS):
            break
        time.sleep(RETRY_PAUSE_SECONDS)
    best = tries[-1] if tries[-1].load_check.reliable else max(  # type: ignore[union-attr]
        tries, key=lambda b: b.cpu_fp32_gflops or 0.0)
    return dataclasses.replace(best, load_check=dataclasses.replace(best.load_check, attempts=len(tries)))


def reliable(bench: BenchmarkInfo) -> bool:
    """A measurement that may stand for this machine: checked and undisturbed."""
    return bench.load_check is not None and bench.load_check.reliable


MEASURED_FIELDS = ("cpu_dropout_ns_per_element", "cpu_fp32_training_gflops", "cpu_fp32_training_narrow_gflops",
                   "cpu_first_touch_ns_per_page")


def _complete(bench: BenchmarkInfo | None) -> bool:
    # One from a trainfit that did not measure all of these yet is measured again.
    return bench is not None and all(getattr(bench, f) is not None or f in bench.unavailable for f in MEASURED_FIELDS)


def _age_seconds(bench: BenchmarkInfo) -> float:
    try:
        return time.time() - datetime.datetime.fromisoformat(bench.measured_at or "").timestamp()
    except ValueError:
        return float("inf")


def cpu_rates(src: Sources, cpu: CpuInfo, *, refresh: bool = False,
              on_measure: Callable[[str], None] | None = None,
              measure: Callable[[CpuInfo], BenchmarkInfo] | None = None) -> BenchmarkInfo:
    """The kept quiet measurement for this machine, or a new one (kept only when undisturbed)."""
    key = identity(src, cpu)
    quiet, flagged = _read_entries(key)
    if not refresh:
        if _complete(quiet):
            return quiet  # type: ignore[return-value]
        # A flagged measurement is reused only while young and while the machine is still busy (so
        # that commands run together agree); the first quiet moment measures again.
        if (_complete(flagged) and _age_seconds(flagged) < PROVISIONAL_SECONDS  # type: ignore[arg-type]
                and cpu_load.sample(QUIET_SAMPLE_SECONDS).busy_reason is not None):
            return flagged  # type: ignore[return-value]
    if on_measure:
        on_measure("measuring this CPU's memory bandwidth and matmul rates once (a few seconds; kept in "
                   "trainfit's cache, `profile --benchmark` measures again)")
    bench = measure_checked(cpu, measure)
    keep(key, bench)
    return bench


def _read(key: str) -> BenchmarkInfo | None:
    """The kept quiet measurement for `key` (this machine's rates), or None."""
    return _read_entries(key)[0]


def _read_entries(key: str) -> tuple[BenchmarkInfo | None, BenchmarkInfo | None]:
    """(the kept quiet measurement, the latest flagged one) for `key`; None where there is none."""
    try:
        entry = json.loads(_cache_file(key).read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - no entry, or a damaged one: measure again
        return None, None
    if not isinstance(entry, dict) or entry.get("identity") != key:
        return None, None
    return _entry(entry, "benchmark", quiet=True), _entry(entry, "under_load", quiet=False)


def _entry(entry: dict, name: str, *, quiet: bool) -> BenchmarkInfo | None:
    from trainfit.core.serde import from_jsonable

    try:
        bench = dataclasses.replace(from_jsonable(BenchmarkInfo, entry[name]), cached=True)
    except Exception:  # noqa: BLE001 - absent or damaged
        return None
    return bench if reliable(bench) == quiet else None


def keep(key: str, bench: BenchmarkInfo) -> None:
    """Store a measurement for `key`: a quiet one as this machine's rates (dropping any flagged
    one), a flagged one beside the kept quiet one, never over it. A cache that cannot be written
    is only slower."""
    from trainfit.core.serde import to_jsonable
    from trainfit.files import write_atomic

    cache = _cache_file(key)
    quiet = _read(key)
    entry: dict = {"identity": key}
    if reliable(bench):
        entry["benchmark"] = to_jsonable(dataclasses.replace(bench, cached=False))
    else:
        if quiet is not None:
            entry["benchmark"] = to_jsonable(dataclasses.replace(quiet, cached=False))
        entry["under_load"] = to_jsonable(dataclasses.replace(bench, cached=False))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps(entry))
    except Exception:  # noqa: BLE001
        pass
