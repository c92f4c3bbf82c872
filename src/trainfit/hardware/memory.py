"""RAM and swap: totals, the cgroup limit that binds in containers, an OS reserve, swap kind.

psutil reports the host inside a container (psutil #2100), so the cgroup v2 `memory.max` / v1
`memory.limit_in_bytes` found via /proc/self/cgroup caps what training may use.
"""

from __future__ import annotations

import posixpath

from trainfit.core.machines.profile import MemoryInfo, os_reserve_bytes
from trainfit.hardware.cgroup import cgroup_dirs, memory_limit_bytes
from trainfit.hardware.sources import Sources, read_int, read_text
from trainfit.hardware.storage import classify_disk, disk_of, mount_of

def is_desktop(src: Sources) -> bool:
    if src.platform.system in ("Darwin", "Windows"):
        return True
    return bool(src.env.get("DISPLAY") or src.env.get("WAYLAND_DISPLAY"))


def swap_kind(src: Sources) -> tuple[str, str | None]:
    """Kind of the first active swap device from /proc/swaps, with the reason when unknown."""
    if src.platform.system == "Darwin":
        return "ssd", None  # macOS swaps to files on the internal SSD (/private/var/vm)
    if src.platform.system != "Linux":
        return "unknown", f"swap device not read on {src.platform.system}"
    text = read_text(src.fs, "/proc/swaps")
    if text is None:
        return "unknown", "/proc/swaps unreadable"
    lines = [ln.split() for ln in text.splitlines()[1:] if ln.strip()]
    if not lines:
        return "none", None
    name, kind = lines[0][0], lines[0][1]
    if "zram" in name:
        return "zram", None
    if kind == "file":
        mount = mount_of(src, name)
        disk = disk_of(src, mount[3]) if mount else None
    else:
        dev = posixpath.basename(name)
        real = src.fs.realpath(f"/sys/class/block/{dev}")
        disk = posixpath.basename(posixpath.dirname(real)) if src.fs.exists(f"{real}/partition") else dev
    if not disk:
        return "unknown", f"block device of swap {name} not found"
    disk_kind, why = classify_disk(src, disk)
    if disk_kind in ("nvme", "ssd", "hdd", "network"):
        return disk_kind, None
    return "unknown", why


def _cgroup_usage_bytes(src: Sources) -> int | None:
    for d in cgroup_dirs(src.fs, "memory")[:1]:
        for name in ("memory.current", "memory.usage_in_bytes"):
            value = read_int(src.fs, f"{d}/{name}")
            if value is not None:
                return value
    return None


def probe_memory(src: Sources) -> MemoryInfo:
    vm = src.psutil.virtual_memory()
    sw = src.psutil.swap_memory()
    total, available = int(vm.total), int(vm.available)
    limit = memory_limit_bytes(src.fs) if src.platform.system == "Linux" else None
    if limit is not None and limit >= total:
        limit = None  # a limit above physical RAM does not bind
    budget = min(total, limit) if limit is not None else total
    if limit is not None:
        used = _cgroup_usage_bytes(src)
        if used is not None:
            available = min(available, max(0, limit - used))
    reserve = os_reserve_bytes(budget, desktop=is_desktop(src), in_cgroup=limit is not None)
    kind, why = ("none", None) if int(sw.total) == 0 else swap_kind(src)
    unified = src.platform.system == "Darwin" and src.platform.machine == "arm64"
    return MemoryInfo(
        total_bytes=total, available_bytes=available, cgroup_limit_bytes=limit,
        usable_bytes=max(0, budget - reserve), os_reserve_bytes=reserve,
        swap_total_bytes=int(sw.total), swap_free_bytes=int(sw.free), swap_kind=kind,  # type: ignore[arg-type]
        unified_with_gpu=unified, unavailable={"swap_kind": why} if why else {},
    )


def memory_unavailable(src: Sources, reason: str) -> MemoryInfo:
    """When the probe failed or timed out: every size None (null in the JSON) with the reason, so
    no estimator mistakes an unknown machine for one with 0 bytes of RAM."""
    fields = ("total_bytes", "available_bytes", "usable_bytes", "os_reserve_bytes",
              "swap_total_bytes", "swap_free_bytes", "swap_kind")
    return MemoryInfo(None, None, None, None, None, None, None, "unknown", False, {f: reason for f in fields})
