"""Which disk holds a plan's data and its tokenised cache: the profiled disks, fastest first, with
room to spare (core.plan.data_io decides between RAM, a disk and a stream with them)."""

from __future__ import annotations

from trainfit.core.machines.profile import HardwareProfile, StorageInfo

GIB = 1 << 30

# A cache or a download goes on a disk only when the disk keeps 20 % more than it needs free:
# checkpoints, logs and the OS's own writes share that disk during the run.
DISK_MARGIN = 1.2

_KIND_RANK = {"nvme": 0, "ssd": 1, "unknown": 2, "hdd": 3, "network": 4}


def owned_machine(hw: HardwareProfile) -> bool:
    """Suggest measuring only on a machine we profile, not a catalog machine we plan for."""
    return not hw.source.startswith("catalog:")


def _disks(hw: HardwareProfile) -> list[StorageInfo]:
    """Local disk candidates for a cache, fastest first (tmpfs is RAM, counted as RAM)."""
    seen, out = set(), []
    for s in hw.storage:
        if s.kind == "ram" or s.path in seen:
            continue
        seen.add(s.path)
        out.append(s)
    return sorted(out, key=lambda s: (_KIND_RANK.get(s.kind, 2), -(s.read_mbps or 0.0)))


def disk_of(hw: HardwareProfile, path: str | None) -> StorageInfo | None:
    """The profiled storage whose path holds `path` (longest prefix), else the work dir's."""
    best = None
    if path:
        for s in hw.storage:
            root = s.path.rstrip("/") + "/"
            if (path == s.path or path.startswith(root)) and (best is None or len(s.path) > len(best.path)):
                best = s
    return best or next((s for s in hw.storage if s.role == "work"), None)


def cache_path(s: StorageInfo) -> str:
    # The HF cache role keeps datasets' own layout ($HF_HOME/datasets); the work dir gets a folder.
    return s.path.rstrip("/") + ("/datasets" if s.role == "cache" else "/.trainfit-data-cache")


def _room(s: StorageInfo, need_bytes: int | None) -> bool | None:
    if need_bytes is None or s.free_bytes is None:
        return None
    return s.free_bytes >= need_bytes * DISK_MARGIN


def pick_disk(hw: HardwareProfile, need_bytes: int | None) -> tuple[StorageInfo | None, str]:
    """The fastest disk with room for need_bytes (x DISK_MARGIN)."""
    disks = _disks(hw)
    if not disks:
        return None, "storage not profiled" + ("" if owned_machine(hw) else " (a catalog machine)")
    for s in disks:
        room = _room(s, need_bytes)
        if room is None or room:
            why = (f"{s.kind} at {s.path}" + (f", {s.free_bytes / GIB:,.0f} GiB free" if s.free_bytes else "")
                   + ("" if room else ": room not checked (" + ("size unknown" if need_bytes is None
                                                                   else "free space not read") + ")"))
            return s, why
    return None, (f"no disk has {need_bytes * DISK_MARGIN / GIB:,.1f} GiB free "  # type: ignore[operator]
                  f"({', '.join(f'{s.kind} {s.path}: {(s.free_bytes or 0) / GIB:,.0f} GiB' for s in disks)})")
