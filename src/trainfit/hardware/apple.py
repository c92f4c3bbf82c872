"""Apple silicon: chip family (M1-M4, Pro/Max/Ultra), unified memory, GPU core count.

Reads `sysctl` (hw.memsize, machdep.cpu.brand_string, hw.perflevel*) and
`system_profiler SPDisplaysDataType -json` (GPU cores; can take a second or more, so it runs
with a timeout). Power, temperature and clocks need sudo (`powermetrics`) and are reported
unavailable with that reason.
"""

from __future__ import annotations

import json
import re

from trainfit.core.machines.hardware_spec import metal_working_set_bytes
from trainfit.core.machines.profile import GpuInfo
from trainfit.hardware.gpu_common import make_gpu
from trainfit.hardware.sources import Sources

SYSCTL_KEYS = [
    "machdep.cpu.brand_string", "hw.memsize", "hw.physicalcpu", "hw.logicalcpu", "hw.nperflevels",
    "hw.perflevel0.physicalcpu", "hw.perflevel1.physicalcpu", "hw.perflevel0.l2cachesize",
    "hw.perflevel1.l2cachesize", "hw.perflevel0.cpusperl2", "hw.perflevel1.cpusperl2",
    "hw.l2cachesize", "hw.l3cachesize", "hw.optional.arm.FEAT_BF16", "hw.optional.neon",
    "hw.optional.AdvSIMD", "hw.optional.arm.FEAT_I8MM", "hw.cpufrequency_max", "hw.cpufrequency",
]

_CHIP = re.compile(r"Apple (M\d+)(?:\s+(Pro|Max|Ultra))?", re.I)
_NEEDS_SUDO = "not readable without sudo on macOS (powermetrics)"
_NOT_APPLICABLE = "does not apply: the GPU is on the SoC (no PCIe link)"


def sysctl(src: Sources, keys: list[str] | None = None) -> dict[str, str]:
    """`sysctl KEY...` as a dict; unknown keys are simply absent (sysctl skips them)."""
    rc, out = src.commands.run(["sysctl", *(keys or SYSCTL_KEYS)], timeout_s=2.0)
    values = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    return values


def chip_family(brand: str) -> tuple[str, str | None] | None:
    """('m2', 'pro') from 'Apple M2 Pro'; None when it is not Apple silicon."""
    match = _CHIP.search(brand or "")
    if not match:
        return None
    return match.group(1).lower(), (match.group(2) or "").lower() or None


def gpu_core_count(src: Sources, timeout_s: float = 4.0) -> tuple[int | None, str | None]:
    """GPU cores from system_profiler, or (None, reason)."""
    try:
        rc, out = src.commands.run(["system_profiler", "SPDisplaysDataType", "-json"], timeout_s)
    except TimeoutError as exc:
        return None, str(exc)
    if rc != 0:
        return None, f"system_profiler failed (exit {rc})"
    try:
        for item in json.loads(out).get("SPDisplaysDataType", []):
            cores = item.get("sppci_cores")
            if cores:
                return int(cores), None
    except (ValueError, AttributeError) as exc:
        return None, f"system_profiler output not understood: {exc}"
    return None, "system_profiler reports no GPU core count"


def probe_apple_gpus(src: Sources) -> tuple[list[GpuInfo], dict[str, str]]:
    """The Apple GPU (one per machine) or ([], {"apple": reason})."""
    if src.platform.system != "Darwin":
        return [], {"apple": "not macOS"}
    values = sysctl(src)
    brand = values.get("machdep.cpu.brand_string", "")
    family = chip_family(brand)
    if family is None or src.platform.machine != "arm64":
        return [], {"apple": f"not Apple silicon ({brand or 'unknown CPU'})"}
    chip, tier = family
    cores, cores_reason = gpu_core_count(src)
    memsize = int(values["hw.memsize"]) if values.get("hw.memsize", "").isdigit() else None
    # What the GPU may still take: the RAM macOS reports available, within Metal's working-set
    # limit (the rule estimate and plan use as capacity: core.machines.hardware_spec.metal_working_set_bytes).
    free_reason = None
    try:
        available: int | None = int(src.psutil.virtual_memory().available)
    except Exception as exc:  # unknown, not 0: the rest of the GPU is still reported
        available, free_reason = None, f"psutil.virtual_memory failed: {type(exc).__name__}: {exc}"
    limit = metal_working_set_bytes(memsize)
    free = min(v for v in (available, limit) if v is not None) if available is not None else None
    name = f"Apple {chip.upper()}{' ' + tier.capitalize() if tier else ''}"
    if cores:
        name += f" ({cores}-core GPU)"
    reasons = {key: _NEEDS_SUDO for key in ("power_limit_watts", "power_draw_watts",
                                           "temperature_c", "temperature_slowdown_c",
                                           "clock_sm_mhz", "clock_sm_max_mhz", "clock_mem_mhz")}
    reasons.update({key: _NOT_APPLICABLE for key in ("pcie_gen", "pcie_width", "pcie_gen_max",
                                                    "pcie_width_max", "pci_bus_id")})
    reasons.update({"uuid": "macOS does not expose a GPU UUID", "mig_mode": "NVIDIA only",
                    "driver_version": "Metal is part of macOS (see os.release)",
                    "vram_total_bytes": "hw.memsize not reported"})
    if free_reason:
        reasons["vram_free_bytes"] = free_reason
    gpu = make_gpu(
        index=0, vendor="apple", name=name, unified_memory=True, reasons=reasons,
        default_reason="not exposed on macOS",
        vram_total_bytes=memsize,
        vram_free_bytes=free,
        architecture=f"apple-{chip}",
        # MPS: fp16 everywhere, bf16 from M2 on (Metal 3.1 / macOS 14)
        precisions=["fp32", "fp16"] + ([] if chip == "m1" else ["bf16"]),
    )
    return [gpu], ({"apple_gpu_cores": cores_reason} if cores_reason else {})
