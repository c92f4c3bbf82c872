"""build_profile: run every probe under its deadline and assemble a HardwareProfile.

Nothing here runs at import time. Probes run concurrently (hardware.runner); a probe that
fails or times out yields its record with every field unknown and the reason.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from trainfit.core.machines.profile import SCHEMA_VERSION, GpuInfo, HardwareProfile
from trainfit.errors import BadInputError
from trainfit.hardware import amd, apple, cpu, cpu_measure, intel, memory, network, nvml, power, storage, system
from trainfit.hardware.benchmark import benchmark_unavailable, run_benchmark
from trainfit.hardware.gpu_common import enrich_from_catalog
from trainfit.hardware.runner import run_probes
from trainfit.hardware.live import live_sources
from trainfit.hardware.sources import Sources

# Seconds each probe may take. system_profiler on a Mac can take 2-4 s; NVML init on a
# multi-GPU node about 1 s; anything beyond these is a hung driver or tool.
DEFAULT_TIMEOUTS = {
    "os": 1.0, "cpu": 2.0, "memory": 2.0, "gpus.nvidia": 6.0, "gpus.amd": 3.0, "gpus.intel": 3.0,
    "gpus.apple": 6.0, "storage": 6.0, "power": 2.0, "network": 6.0, "benchmark": 45.0,
}
PSU_WATTS_RANGE = (50.0, 20000.0)  # a small-form-factor PSU .. a multi-GPU server's supplies
QUICK_REASON = "not probed (quick profile)"

_GPU_PROBES: dict[str, Callable[[Sources], tuple[list[GpuInfo], dict[str, str]]]] = {
    "gpus.nvidia": nvml.probe_nvidia_gpus,
    "gpus.amd": amd.probe_amd_gpus,
    "gpus.intel": intel.probe_intel_gpus,
    "gpus.apple": apple.probe_apple_gpus,
}


def _keep_cpu_part(src: Sources, cpu_info, bench) -> None:
    """A full --benchmark refreshes the cached CPU rates that later profiles use by default (one
    measured under load is kept flagged, apart from the machine's rates: cpu_measure.keep)."""
    keep = ("cpu_bf16_gflops", "under_load", *cpu_measure.MEASURED_FIELDS)
    reasons = {k: v for k, v in bench.unavailable.items() if k in keep}
    reasons.update({k: cpu_measure.CPU_ONLY for k in ("gpu_bandwidth_gbps", "disk_read_mbps", "disk_write_mbps")})
    cpu_part = dataclasses.replace(bench, gpu_tflops={}, gpu_bandwidth_gbps=None, disk_read_mbps=None,
                                   disk_write_mbps=None, unavailable=reasons, scope="cpu")
    cpu_measure.keep(cpu_measure.identity(src, cpu_info), cpu_part)


def check_psu_watts(psu_watts: float | None) -> None:
    if psu_watts is None:
        return
    lo, hi = PSU_WATTS_RANGE
    if not (lo <= psu_watts <= hi):
        raise BadInputError(f"--psu-watts {psu_watts:g} is out of range: give the PSU rating in watts, "
                            f"between {lo:g} and {hi:g}")


def build_profile(*, benchmark: bool = False, psu_watts: float | None = None, quick: bool = False,
                  sources: Sources | None = None, timeouts: dict[str, float] | None = None,
                  bandwidth_url: str | None = None, measure_cpu: bool | None = None,
                  on_measure: Callable[[str], None] | None = None) -> HardwareProfile:
    """Profile the machine (or the injected `sources`, e.g. a fixture machine).

    quick=True reads only OS, CPU, memory and GPUs (for estimators that need capacities); the
    storage test, RAPL window and network are skipped and say so.
    measure_cpu: without --benchmark, carry this machine's measured CPU rates (hardware.cpu_measure:
    measured once, then cached); default: on for the live machine, off for fixtures.
    on_measure: told (one line) before a measurement that takes about a second.
    """
    check_psu_watts(psu_watts)
    src = sources or live_sources()
    limits = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
    probes: dict[str, Callable[[], Any]] = {
        "os": lambda: system.probe_os(src),
        "cpu": lambda: cpu.probe_cpu(src),
        "memory": lambda: memory.probe_memory(src),
        **{name: (lambda fn=fn: fn(src)) for name, fn in _GPU_PROBES.items()},
    }
    if not quick:
        probes["storage"] = lambda: storage.probe_storage(src, reuse=not benchmark)
        probes["power"] = lambda: power.read_power(src)
        probes["network"] = lambda: network.probe_network(src, bandwidth_url)
    results = run_probes(probes, {k: limits[k] for k in probes})

    def value(name: str, fallback: Callable[[str], Any]) -> Any:
        res = results.get(name)
        if res is None:
            return fallback(QUICK_REASON)
        return res.value if res.error is None else fallback(res.error)

    os_info = value("os", lambda why: system.OsInfo(src.platform.system, src.platform.release,
                                                   src.platform.hostname, src.platform.python_version,
                                                   False, False, {"in_container": why, "in_wsl": why}))
    cpu_info = value("cpu", lambda why: cpu.cpu_unavailable(src, why))
    mem_info = value("memory", lambda why: memory.memory_unavailable(src, why))
    top_reasons: dict[str, str] = {}
    gpus: list[GpuInfo] = []
    gpu_reasons: dict[str, str] = {}
    for name in _GPU_PROBES:
        found, reasons = value(name, lambda why, n=name: ([], {n.split(".")[1]: why}))
        gpus.extend(enrich_from_catalog(g) for g in found)
        gpu_reasons.update(reasons)
    top_reasons.update(gpu_reasons)
    if any(g.unified_memory for g in gpus) and not mem_info.unified_with_gpu:
        mem_info = dataclasses.replace(mem_info, unified_with_gpu=True)
    storage_info = value("storage", lambda why: storage.storage_unavailable(src, why))
    readings = results.get("power")
    if readings is not None and readings.error is None:
        power_info = power.assess_power(readings.value, gpus, cpu_info, psu_watts)
    else:
        why = readings.error if readings is not None else QUICK_REASON
        power_info = power.power_unavailable(why, gpus, cpu_info, psu_watts)
    net_info = value("network", lambda why: network.NetworkInfo(None, None, {"download_mbps": why}))
    seconds = {name: round(r.seconds, 3) for name, r in results.items()}

    bench = None
    if benchmark:
        t0 = time.perf_counter()
        res = run_probes({"benchmark": lambda: run_benchmark(src, cpu_info, gpus)},
                         {"benchmark": limits["benchmark"]})["benchmark"]
        bench = res.value if res.error is None else benchmark_unavailable(res.error)
        seconds["benchmark"] = round(time.perf_counter() - t0, 3)
        if res.error is None and src.name == "live" and bench.cpu_fp32_gflops:
            _keep_cpu_part(src, cpu_info, bench)
    elif measure_cpu if measure_cpu is not None else src.name == "live":
        t0 = time.perf_counter()
        res = run_probes({"benchmark": lambda: cpu_measure.cpu_rates(src, cpu_info, on_measure=on_measure)},
                         {"benchmark": limits["benchmark"]})["benchmark"]
        if res.error is None:
            bench = res.value
        else:
            top_reasons["benchmark"] = f"CPU rates not measured: {res.error}"
        seconds["benchmark"] = round(time.perf_counter() - t0, 3)
    else:
        top_reasons["benchmark"] = "not requested (pass --benchmark)"
    return HardwareProfile(
        schema_version=SCHEMA_VERSION, source="live" if src.name == "live" else f"fixture:{src.name}",
        os=os_info, cpu=cpu_info, memory=mem_info, gpus=gpus,
        backends=system.backends(src, cpu_info, gpus, gpu_reasons), storage=storage_info,
        network=net_info, power=power_info, benchmark=bench, probe_seconds=seconds,
        unavailable=top_reasons,
    )
