"""This machine's CPU rates, measured by default instead of guessed from a datasheet.

A profile of the live machine carries measured CPU figures (memory bandwidth, fp32 and bf16
matmul GFLOP/s) without `--benchmark`: they are measured once (a few seconds, most of it importing torch) and kept in the
user cache, keyed by the machine, the CPU model, the usable cores and the torch and numpy
versions (a new BLAS or torch build can change the rates). `profile --benchmark` measures again
and replaces the entry. A measurement taken while the machine is busy (1-minute load above
LOAD_LIMIT_PER_CORE x cores) is kept marked "under_load": reused while the machine stays busy (so
commands run together give the same numbers), replaced by the first run on a quiet machine.

Why measure: the datasheet guess (clock x vector width x cores x 0.7) was 37-71 % off on a
2-core AVX2 EPYC, and bf16 without AVX512-BF16 / AMX runs about 50x slower than fp32, not 2x
faster (hardware.benchmark.cpu_autocast_bf16_gflops measures it).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import time
from collections.abc import Callable

from trainfit.core.profile import BenchmarkInfo, CpuInfo
from trainfit.hardware.sources import Sources, read_text

CACHE_FOLDER = "cpu-rates"
CACHE_VERSION = 1
LOAD_LIMIT_PER_CORE = 1.25  # the rule verify's calibration uses for "taken under load"
CPU_ONLY = "not measured by the default CPU measurement (run --benchmark)"


def native_bf16(cpu: CpuInfo) -> bool:
    return bool(cpu.flags.get("bf16") or cpu.flags.get("avx512_bf16") or cpu.flags.get("amx_bf16"))


def identity(src: Sources, cpu: CpuInfo) -> str:
    """What the rates depend on: this machine, its CPU, the cores this process may use, the libraries."""
    machine = read_text(src.fs, "/etc/machine-id") or read_text(src.fs, "/var/lib/dbus/machine-id")
    return "|".join([f"v{CACHE_VERSION}", machine or src.platform.hostname, cpu.model or "", str(cpu.logical_cores),
                     str(cpu.usable_cores), _version("torch"), _version("numpy")])


def _version(dist: str) -> str:
    from trainfit.export.versions import installed_version

    return installed_version(dist) or "none"


def _cache_file(key: str):
    from trainfit.user_cache import user_cache_dir

    return user_cache_dir(CACHE_FOLDER, hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="seconds")


def measure_cpu(cpu: CpuInfo) -> BenchmarkInfo:
    """Memory bandwidth, fp32 matmul and the bf16 training-matmul rate (see benchmark.cpu_bf16_rate)."""
    from trainfit.hardware.benchmark import cpu_bf16_rate, cpu_dropout_rate, cpu_fp32_gflops, memory_bandwidth_gbps

    t0 = time.perf_counter()
    reasons = {k: CPU_ONLY for k in ("gpu_bandwidth_gbps", "disk_read_mbps", "disk_write_mbps")}
    mem = round(memory_bandwidth_gbps(), 1)
    fp32 = round(cpu_fp32_gflops(), 1)
    bf16, why = cpu_bf16_rate(cpu)
    if why:
        reasons["cpu_bf16_gflops"] = why
    dropout_ns, why = cpu_dropout_rate()
    if why:
        reasons["cpu_dropout_ns_per_element"] = why
    return BenchmarkInfo(mem, fp32, bf16, {}, None, None, None, round(time.perf_counter() - t0, 2), reasons,
                         measured_at=_iso(time.time()), scope="cpu", cpu_dropout_ns_per_element=dropout_ns)


def busy_reason(cpu: CpuInfo) -> str | None:
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = cpu.usable_cores or cpu.logical_cores or 1
    if load > LOAD_LIMIT_PER_CORE * cores:
        return f"measured under load (1-min load {load:.2f} on {cores} cores): used for this run, not kept"
    return None


def cpu_rates(src: Sources, cpu: CpuInfo, *, refresh: bool = False,
              on_measure: Callable[[str], None] | None = None,
              measure: Callable[[CpuInfo], BenchmarkInfo] | None = None) -> BenchmarkInfo:
    """The cached measurement for this machine, or a new one (kept unless the machine was busy)."""
    key = identity(src, cpu)
    if not refresh:
        kept = _read(key)
        # A measurement taken under load is reused only while the machine is still busy (so that
        # commands run together agree); the first quiet run replaces it.
        # One from a trainfit that did not measure dropout yet is measured again.
        if (kept is not None and (kept.cpu_dropout_ns_per_element is not None
                                  or "cpu_dropout_ns_per_element" in kept.unavailable)
                and ("under_load" not in kept.unavailable or busy_reason(cpu) is not None)):
            return kept
    if on_measure:
        on_measure("measuring this CPU's memory bandwidth and matmul rates once (a few seconds; kept in "
                   "trainfit's cache, `profile --benchmark` measures again)")
    bench = (measure or measure_cpu)(cpu)
    busy = busy_reason(cpu)
    if busy:
        bench = dataclasses.replace(bench, unavailable={**bench.unavailable, "under_load": busy})
    keep(key, bench)
    return bench


def _read(key: str) -> BenchmarkInfo | None:
    try:
        entry = json.loads(_cache_file(key).read_text(encoding="utf-8"))
        if entry.get("identity") != key:
            return None
        from trainfit.core.serde import from_jsonable

        return dataclasses.replace(from_jsonable(BenchmarkInfo, entry["benchmark"]), cached=True)
    except Exception:  # noqa: BLE001 - no entry, or a damaged one: measure again
        return None


def keep(key: str, bench: BenchmarkInfo) -> None:
    """Store a measurement for `key` (a cache that cannot be written is only slower)."""
    from trainfit.core.serde import to_jsonable
    from trainfit.files import write_atomic

    cache = _cache_file(key)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache, json.dumps({"identity": key, "benchmark": to_jsonable(dataclasses.replace(bench, cached=False))}))
    except Exception:  # noqa: BLE001
        pass
