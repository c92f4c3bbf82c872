"""CPU: model, vendor, cores (physical / logical / usable), clocks, NUMA, caches, ISA flags.

Linux reads /proc/cpuinfo and /sys (never py-cpuinfo: its CPUID path sleeps 1 s to measure
the clock, workhorsy/py-cpuinfo #205). Usable cores = the affinity set (Cpus_allowed_list in
/proc/self/status, the same set os.sched_getaffinity returns) further limited by a cgroup CPU
quota. macOS reads sysctl.
"""

from __future__ import annotations

import re

from trainfit.core.machines.profile import CpuInfo, NumaNode
from trainfit.hardware import apple
from trainfit.hardware.cgroup import cpu_quota_cores
from trainfit.hardware.sources import Sources, read_int, read_text

FLAG_NAMES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "neon", "bf16", "fma")


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in (text or "").strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
            cur = {}
            continue
        key, _, value = line.partition(":")
        cur[key.strip()] = value.strip()
    if cur:
        blocks.append(cur)
    return blocks


def _flags(raw: set[str], arch: str) -> dict[str, bool]:
    arm = arch in ("aarch64", "arm64") or arch.startswith("arm")
    return {
        "avx2": "avx2" in raw,
        "avx512f": "avx512f" in raw,
        "avx512_bf16": "avx512_bf16" in raw,
        "amx_bf16": "amx_bf16" in raw,
        "amx_tile": "amx_tile" in raw,
        "neon": arm and bool({"asimd", "neon"} & raw),
        # bf16 arithmetic in hardware: AVX512-BF16 / AMX on x86, FEAT_BF16 on Arm
        "bf16": bool({"avx512_bf16", "amx_bf16"} & raw) or (arm and "bf16" in raw),
        # Armv8 Advanced SIMD always has fused multiply-add
        "fma": "fma" in raw or (arm and "asimd" in raw),
    }


def _cache_total(src: Sources, level: int, logical: int) -> tuple[int | None, str | None]:
    """Total bytes of the cache level over the machine: size x number of instances."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = [e for e in src.fs.listdir(base) if e.startswith("index")]
    except OSError as exc:
        return None, f"no cache information in sysfs ({type(exc).__name__})"
    for entry in entries:
        if read_int(src.fs, f"{base}/{entry}/level") != level:
            continue
        if read_text(src.fs, f"{base}/{entry}/type") == "Instruction":
            continue
        size = read_text(src.fs, f"{base}/{entry}/size") or ""
        match = re.fullmatch(r"(\d+)([KMG]?)", size)
        if not match:
            return None, f"unreadable cache size {size!r}"
        size_bytes = int(match.group(1)) * {"": 1, "K": 1024, "M": 1 << 20, "G": 1 << 30}[match.group(2)]
        sharing = len(parse_cpulist(read_text(src.fs, f"{base}/{entry}/shared_cpu_list") or "0")) or 1
        return size_bytes * max(1, logical // sharing), None
    return None, f"no L{level} cache reported in sysfs"


def _numa(src: Sources, all_cpus: list[int], mem_total: int | None) -> list[NumaNode]:
    base = "/sys/devices/system/node"
    try:
        names = [n for n in src.fs.listdir(base) if re.fullmatch(r"node\d+", n)]
    except OSError:
        names = []
    nodes = []
    for name in sorted(names, key=lambda n: int(n[4:])):
        cpus = parse_cpulist(read_text(src.fs, f"{base}/{name}/cpulist") or "")
        meminfo = read_text(src.fs, f"{base}/{name}/meminfo") or ""
        match = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
        nodes.append(NumaNode(int(name[4:]), cpus, int(match.group(1)) * 1024 if match else None))
    # no NUMA sysfs (container without /sys/devices/system/node): the machine is one node
    return nodes or [NumaNode(0, all_cpus, mem_total)]


def probe_cpu(src: Sources) -> CpuInfo:
    if src.platform.system == "Darwin":
        return _probe_darwin(src)
    if src.platform.system != "Linux":
        return _probe_other(src)
    reasons: dict[str, str] = {}
    arch = src.platform.machine
    blocks = _cpuinfo_blocks(read_text(src.fs, "/proc/cpuinfo") or "")
    procs = [b for b in blocks if "processor" in b]
    first = procs[0] if procs else {}
    raw_flags = set((first.get("flags") or first.get("Features") or "").split())
    logical = len(procs) or int(src.psutil.cpu_count(logical=True) or 1)
    model = first.get("model name") or first.get("Model") or first.get("cpu model")
    if not model:
        reasons["model"] = "no model name in /proc/cpuinfo"
    vendor = first.get("vendor_id") or _arm_vendor(first.get("CPU implementer"))
    if not vendor:
        reasons["vendor"] = "no vendor in /proc/cpuinfo"

    cores = {(read_text(src.fs, f"/sys/devices/system/cpu/cpu{b['processor']}/topology/physical_package_id"),
              read_text(src.fs, f"/sys/devices/system/cpu/cpu{b['processor']}/topology/core_id"))
             for b in procs}
    if procs and all(c != (None, None) for c in cores):
        physical = len(cores)
    elif all("core id" in b for b in procs) and procs:
        physical = len({(b.get("physical id"), b["core id"]) for b in procs})
    else:
        physical = None
        reasons["physical_cores"] = "no CPU topology in sysfs or /proc/cpuinfo"

    status = read_text(src.fs, "/proc/self/status") or ""
    match = re.search(r"Cpus_allowed_list:\s*(\S+)", status)
    allowed = len(parse_cpulist(match.group(1))) if match else logical
    quota = cpu_quota_cores(src.fs)
    usable = float(min(allowed, quota)) if quota is not None else float(allowed)

    base_khz, base_why = _read_khz(src, "base_frequency")
    max_khz, max_why = _read_khz(src, "cpuinfo_max_freq")
    base_mhz = base_khz / 1000 if base_khz else None
    if base_mhz is None:
        nominal = re.search(r"@\s*([\d.]+)\s*GHz", model or "")
        base_mhz = float(nominal.group(1)) * 1000 if nominal else None
    if base_mhz is None:
        reasons["base_clock_mhz"] = base_why if max_khz is None else "cpufreq gives no base_frequency"
    if max_khz is None:
        reasons["boost_clock_mhz"] = max_why

    meminfo = read_text(src.fs, "/proc/meminfo") or ""
    mem = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
    l2, l2_why = _cache_total(src, 2, logical)
    l3, l3_why = _cache_total(src, 3, logical)
    if l2_why:
        reasons["l2_cache_bytes"] = l2_why
    if l3_why:
        reasons["l3_cache_bytes"] = l3_why
    return CpuInfo(
        architecture=arch, model=model, vendor=vendor, physical_cores=physical,
        logical_cores=logical, usable_cores=usable, cgroup_cpu_quota=quota,
        base_clock_mhz=base_mhz, boost_clock_mhz=max_khz / 1000 if max_khz else None,
        numa_nodes=_numa(src, list(range(logical)), int(mem.group(1)) * 1024 if mem else None),
        l2_cache_bytes=l2, l3_cache_bytes=l3, flags=_flags(raw_flags, arch), unavailable=reasons,
    )


def _read_khz(src: Sources, name: str) -> tuple[int | None, str]:
    path = f"/sys/devices/system/cpu/cpu0/cpufreq/{name}"
    try:
        return int(src.fs.read(path).strip()), ""
    except PermissionError:
        return None, f"no permission: {path}"
    except (OSError, ValueError):
        return None, "no cpufreq in sysfs (virtual machine or container without it)"


def _arm_vendor(implementer: str | None) -> str | None:
    # Arm "CPU implementer" codes (Linux arch/arm64/include/asm/cputype.h)
    table = {"0x41": "ARM", "0x42": "Broadcom", "0x43": "Cavium", "0x46": "Fujitsu",
             "0x48": "HiSilicon", "0x4e": "NVIDIA", "0x51": "Qualcomm", "0x61": "Apple",
             "0xc0": "Ampere"}
    return table.get((implementer or "").lower()) if implementer else None


def _probe_darwin(src: Sources) -> CpuInfo:
    v = apple.sysctl(src)
    num = lambda key: int(v[key]) if v.get(key, "").isdigit() else None  # noqa: E731
    logical = num("hw.logicalcpu") or int(src.psutil.cpu_count(logical=True) or 1)
    raw = {"asimd"} if (num("hw.optional.AdvSIMD") or num("hw.optional.neon")) else set()
    if num("hw.optional.arm.FEAT_BF16"):
        raw.add("bf16")
    l2 = 0
    for level in ("0", "1"):
        size, cores, per = (num(f"hw.perflevel{level}.l2cachesize"),
                            num(f"hw.perflevel{level}.physicalcpu"),
                            num(f"hw.perflevel{level}.cpusperl2"))
        if size and cores and per:
            l2 += size * max(1, cores // per)
    reasons = {"base_clock_mhz": "Apple does not report CPU clocks (psutil #2642)",
               "boost_clock_mhz": "Apple does not report CPU clocks (psutil #2642)"}
    if not l2:
        l2 = num("hw.l2cachesize") or 0
    if not l2:
        reasons["l2_cache_bytes"] = "sysctl reports no L2 size"
    l3 = num("hw.l3cachesize")
    if l3 is None:
        reasons["l3_cache_bytes"] = "no L3 reported (Apple's system-level cache is not exposed)"
    physical = num("hw.physicalcpu")
    if physical is None:
        reasons["physical_cores"] = "sysctl hw.physicalcpu missing"
    model = v.get("machdep.cpu.brand_string")
    if not model:
        reasons["model"] = "sysctl machdep.cpu.brand_string missing"
    mhz = num("hw.cpufrequency_max")
    if mhz:  # Intel Macs report it in Hz
        reasons.pop("boost_clock_mhz")
    return CpuInfo(
        architecture=src.platform.machine, model=model,
        vendor="Apple" if "Apple" in (model or "") else ("GenuineIntel" if model else None),
        physical_cores=physical, logical_cores=logical, usable_cores=float(logical),
        cgroup_cpu_quota=None, base_clock_mhz=None, boost_clock_mhz=mhz / 1e6 if mhz else None,
        numa_nodes=[NumaNode(0, list(range(logical)), num("hw.memsize"))],
        l2_cache_bytes=l2 or None, l3_cache_bytes=l3, flags=_flags(raw, src.platform.machine),
        unavailable=reasons if model else {**reasons, "vendor": "unknown CPU"},
    )


def _probe_other(src: Sources) -> CpuInfo:
    """Windows / BSD: counts from psutil; the rest is not read on this OS."""
    why = f"not read on {src.platform.system}"
    logical = int(src.psutil.cpu_count(logical=True) or 1)
    physical = src.psutil.cpu_count(logical=False)
    reasons = {k: why for k in ("model", "vendor", "base_clock_mhz", "boost_clock_mhz",
                                "l2_cache_bytes", "l3_cache_bytes")}
    if physical is None:
        reasons["physical_cores"] = why
    return CpuInfo(src.platform.machine, None, None, physical, logical, float(logical), None,
                   None, None, [NumaNode(0, list(range(logical)), None)], None, None,
                   _flags(set(), src.platform.machine), reasons)


def cpu_unavailable(src: Sources, reason: str) -> CpuInfo:
    """A CpuInfo when the probe failed or timed out: counts from the OS, the rest unknown."""
    logical = int(src.psutil.cpu_count(logical=True) or 1)
    fields = ("model", "vendor", "physical_cores", "base_clock_mhz", "boost_clock_mhz",
              "l2_cache_bytes", "l3_cache_bytes")
    return CpuInfo(src.platform.machine, None, None, None, logical, float(logical), None, None,
                   None, [NumaNode(0, list(range(logical)), None)], None, None,
                   _flags(set(), src.platform.machine), {k: reason for k in fields})
