"""Locate this process's cgroup (v2 unified or v1 per-controller) and read its limits.

psutil reports the host's RAM and CPUs inside a container (giampaolo/psutil #2100), so the
limits that actually bind are read here: v2 `memory.max` / `cpu.max`, v1
`memory.limit_in_bytes` / `cpu.cfs_quota_us` + `cpu.cfs_period_us`. The leaf cgroup comes from
/proc/self/cgroup and its mount point from /proc/self/mountinfo (as W&B's monitor does); the
ancestors are checked too because a limit set on a parent binds the child.
"""

from __future__ import annotations

import posixpath

from trainfit.hardware.sources import Fs, read_text

# v1 kernels report "no limit" as a huge page-aligned number (LONG_MAX rounded down).
_V1_UNLIMITED_BYTES = 1 << 60


def _mounts(fs: Fs) -> list[tuple[str, str, str, str]]:
    """(mount root, mount point, fs type, super options) of cgroup mounts."""
    text = read_text(fs, "/proc/self/mountinfo") or ""
    found = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 3 or rparts[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((parts[3], parts[4], rparts[0], rparts[2]))
    return found


def cgroup_dirs(fs: Fs, controller: str) -> list[str]:
    """Directories of this process's cgroup for `controller` ("memory", "cpu"), leaf first,
    then each ancestor up to the mount point. Empty when no cgroup applies."""
    text = read_text(fs, "/proc/self/cgroup") or ""
    mounts = _mounts(fs)
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        names = controllers.split(",") if controllers else []
        if hier == "0" and not controllers:
            wanted = [m for m in mounts if m[2] == "cgroup2"]
        elif controller in names:
            wanted = [m for m in mounts if m[2] == "cgroup" and controller in m[3].split(",")]
        else:
            continue
        for root, point, _, _ in wanted:
            rel = path
            if root != "/" and (rel == root or rel.startswith(root + "/")):
                rel = rel[len(root):] or "/"
            leaf = posixpath.normpath(posixpath.join(point, rel.lstrip("/")))
            dirs = []
            here = leaf
            while True:
                dirs.append(here)
                if here == point or here == "/":
                    break
                here = posixpath.dirname(here)
            # a v2 line also exists on hybrid hosts with v1 controllers: only keep it if the
            # controller's files are there
            probe = "memory.max" if controller == "memory" else "cpu.max"
            if wanted[0][2] == "cgroup2" and not any(fs.exists(f"{d}/{probe}") for d in dirs):
                continue
            return dirs
    return []


def memory_limit_bytes(fs: Fs) -> int | None:
    """Tightest memory limit over the cgroup and its ancestors; None when unlimited."""
    best: int | None = None
    for d in cgroup_dirs(fs, "memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):
            text = read_text(fs, f"{d}/{name}")
            if text is None or text == "max":
                continue
            try:
                value = int(text)
            except ValueError:
                continue
            if value < _V1_UNLIMITED_BYTES and (best is None or value < best):
                best = value
    return best


def cpu_quota_cores(fs: Fs) -> float | None:
    """Cores allowed by the tightest CPU quota (cpu.max or cfs_quota/period); None: no quota."""
    best: float | None = None
    for d in cgroup_dirs(fs, "cpu"):
        quota = period = None
        text = read_text(fs, f"{d}/cpu.max")
        if text:
            q, _, p = text.partition(" ")
            if q != "max":
                quota, period = q, p or "100000"
        else:
            q = read_text(fs, f"{d}/cpu.cfs_quota_us")
            if q is not None and q != "-1":
                quota, period = q, read_text(fs, f"{d}/cpu.cfs_period_us") or "100000"
        if quota is None:
            continue
        try:
            cores = int(quota) / int(period)
        except (ValueError, ZeroDivisionError):
            continue
        if cores > 0 and (best is None or cores < best):
            best = cores
    return best
