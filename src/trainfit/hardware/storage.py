"""Storage for the work dir (cwd) and the model cache ($HF_HOME or ~/.cache/huggingface).

Free/total space, the backing block device and its kind, and a timed sequential
write + fsync + read of a temporary file. The kernel's rotational flag is a hint only: SCSI
disks default to rotational=1 behind RAID/HBA controllers and most virtual disks (virtio
"vd*") report whatever the host chose (Red Hat KB "How does the kernel determine if a SCSI
disk is HDD or SSD"), so for those the measured speed decides and the reason says so.

A filesystem's measured speed is kept for a day in trainfit's cache (keyed by its mount point,
device and type), so `profile` run again does not write 64 MiB each time; the profile gives the
time of the measurement (`measured_at`). `profile --benchmark` always measures again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import posixpath
import tempfile
import time

from trainfit.core.machines.profile import StorageInfo
from trainfit.hardware.sources import Sources, read_int, read_text

DEFAULT_TEST_BYTES = 64 << 20  # 64 MiB: about 0.1-0.5 s on an SSD, keeps `profile` under 1.5 s
_NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ceph", "glusterfs",
               "lustre", "gpfs", "beegfs", "afs", "sshfs"}
_CHUNK_BYTES = 4 << 20
# A disk's sequential speed changes with its hardware, not from hour to hour.
DISK_MEASUREMENT_MAX_AGE_SECONDS = 24 * 3600


def cache_dir(src: Sources) -> str:
    home = src.env.get("HOME") or os.path.expanduser("~")
    return src.env.get("HF_HOME") or posixpath.join(home, ".cache", "huggingface")


def _existing(src: Sources, path: str) -> str:
    """The path itself or its nearest existing ancestor (a cache dir may not exist yet)."""
    while path not in ("", "/") and not src.fs.exists(path):
        path = posixpath.dirname(path)
    return path or "/"


def mount_of(src: Sources, path: str) -> tuple[str, str, str, str] | None:
    """(mount point, fs type, source, major:minor) of the longest mount containing path."""
    best = None
    for line in (read_text(src.fs, "/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 2:
            continue
        point = parts[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, rparts[0], rparts[1], parts[2])
    return best


def disk_of(src: Sources, majmin: str) -> str | None:
    """Whole-disk name for a block device number; partitions map to their disk."""
    real = src.fs.realpath(f"/sys/dev/block/{majmin}")
    name = posixpath.basename(real)
    if not name or name == majmin:
        return None
    if src.fs.exists(f"{real}/partition"):
        return posixpath.basename(posixpath.dirname(real))
    return name


def _resolve_slaves(src: Sources, disk: str, depth: int = 0) -> list[str]:
    """dm-*/md* devices resolved to the physical disks under them."""
    try:
        slaves = src.fs.listdir(f"/sys/block/{disk}/slaves")
    except OSError:
        slaves = []
    if not slaves or depth > 4:
        return [disk]
    disks: list[str] = []
    for slave in slaves:
        real = src.fs.realpath(f"/sys/class/block/{slave}")
        parent = posixpath.basename(posixpath.dirname(real)) if src.fs.exists(f"{real}/partition") else slave
        disks.extend(_resolve_slaves(src, parent, depth + 1))
    return sorted(set(disks))


def classify_disk(src: Sources, disk: str) -> tuple[str, str]:
    """(kind, reason) of a whole disk from its name, transport and rotational flag."""
    rotational = read_int(src.fs, f"/sys/block/{disk}/queue/rotational")
    if disk.startswith("nvme"):
        ctrl = disk[: disk.index("n", 4)]  # "nvme0n1" -> controller "nvme0"
        transport = read_text(src.fs, f"/sys/class/nvme/{ctrl}/transport") or "pcie"
        if transport in ("tcp", "rdma", "fc"):
            return "network", f"NVMe over fabrics ({transport}) on {disk}"
        return "nvme", f"{disk}: NVMe namespace, transport {transport}"
    if disk.startswith("zram") or disk.startswith("ram"):
        return "ram", f"{disk}: compressed RAM block device"
    if disk.startswith(("vd", "xvd")):
        return "unknown", (f"{disk}: virtual disk; its rotational flag ({rotational}) is set by "
                           "the host and unreliable")
    if disk.startswith("loop"):
        return "unknown", f"{disk}: loop device backed by a file"
    if disk.startswith("mmcblk"):
        return "ssd", f"{disk}: eMMC/SD flash"
    real = src.fs.realpath(f"/sys/block/{disk}")
    usb = "/usb" in real
    if rotational == 0:
        return "ssd", f"{disk}: rotational=0{' (USB)' if usb else ''}"
    if rotational == 1:
        why = "USB sticks and SSDs behind RAID/HBA controllers also report 1"
        return "hdd", f"{disk}: rotational=1 ({why})"
    return "unknown", f"{disk}: no rotational flag in sysfs"


def _kind_from_speed(kind: str, reason: str, read_mbps: float | None) -> tuple[str, str]:
    """Decide an unreliable kind from the measured sequential read speed."""
    if kind != "unknown" or read_mbps is None:
        return kind, reason
    # SATA HDDs read 100-250 MB/s sequentially; flash starts well above 300 MB/s
    guess = "ssd" if read_mbps >= 300 else "hdd"
    return guess, f"{reason}; measured {read_mbps:.0f} MB/s sequential read suggests {guess}"


def measure_disk(path: str, size_bytes: int) -> tuple[float, float]:
    """Sequential write (with fsync) and read of a temp file in `path`: (read, write) MB/s.

    The read bypasses the page cache where the OS allows it: posix_fadvise(DONTNEED) after the
    fsync on Linux, F_NOCACHE on macOS; elsewhere the read figure may include cached pages.
    """
    block = os.urandom(_CHUNK_BYTES)  # incompressible, so compressing filesystems do real work
    fd, tmp = tempfile.mkstemp(prefix=".trainfit-disk-", dir=path)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < size_bytes:
            written += os.write(fd, block)
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        fd = os.open(tmp, os.O_RDONLY)
        if not hasattr(os, "posix_fadvise"):
            try:
                import fcntl

                fcntl.fcntl(fd, 48, 1)  # F_NOCACHE on macOS
            except (ImportError, OSError):
                pass
        t0 = time.perf_counter()
        while os.read(fd, _CHUNK_BYTES):
            pass
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(tmp)
    return size_bytes / read_s / 1e6, size_bytes / write_s / 1e6


def probe_storage(src: Sources, test_bytes: int = DEFAULT_TEST_BYTES, *, reuse: bool = True) -> list[StorageInfo]:
    """Work dir and cache dir; one measurement per distinct mount (they often share one).
    `reuse`: take a measurement of the same filesystem from the last day (live machine only)."""
    measured: dict[str, tuple[float | None, float | None, str | None, str | None]] = {}
    out = []
    for role, path in (("work", src.cwd), ("cache", cache_dir(src))):
        reasons: dict[str, str] = {}
        here = _existing(src, path)
        try:
            usage = src.psutil.disk_usage(here)
            total, free = int(usage.total), int(usage.free)
        except OSError as exc:
            total = free = None
            reasons["total_bytes"] = reasons["free_bytes"] = f"disk_usage failed: {exc}"
        mount = mount_of(src, path)  # by path prefix: the dir itself may not exist yet
        device, kind, why = None, "unknown", "mount not found in /proc/self/mountinfo"
        if mount:
            point, fstype, source, majmin = mount
            if fstype in _NETWORK_FS or fstype.startswith("fuse"):
                device, kind, why = source, "network", f"{fstype} filesystem at {point}"
            elif fstype in ("tmpfs", "ramfs"):
                device, kind, why = fstype, "ram", f"{fstype} at {point}: lives in RAM"
            elif fstype == "overlay":
                device, why = "overlay", "overlay filesystem (container layer); backing disk not resolved"
            else:
                disk = disk_of(src, majmin)
                if disk is None:
                    why = f"{fstype} on {source}: no block device for {majmin}"
                else:
                    disks = _resolve_slaves(src, disk)
                    kinds = [classify_disk(src, d) for d in disks]
                    device = disk if disks == [disk] else f"{disk} ({'+'.join(disks)})"
                    kind, why = kinds[0] if len({k for k, _ in kinds}) == 1 else (
                        "unknown", "; ".join(r for _, r in kinds))
        if mount is None and src.platform.system != "Linux":
            why = f"block device not read on {src.platform.system}"
        key = mount[0] if mount else here  # one measurement per filesystem
        if key not in measured:
            identity = f"{key}|{device}|{mount[1] if mount else ''}|{test_bytes}"
            measured[key] = _measure_or_reuse(src, here, test_bytes, identity if reuse else None)
        read_mbps, write_mbps, fail, measured_at = measured[key]
        if fail:
            reasons["read_mbps"] = reasons["write_mbps"] = reasons["measured_at"] = fail
        if device is None:
            reasons["device"] = why
        kind, why = _kind_from_speed(kind, why, read_mbps)
        out.append(StorageInfo(role, path, device, kind, why, total, free, read_mbps, write_mbps,
                               reasons, measured_at=measured_at))
    return out


def _measure_or_reuse(src: Sources, path: str, size: int, identity: str | None):
    """(read, write, failure, measured_at): from the cache when `identity` was measured within
    DISK_MEASUREMENT_MAX_AGE_SECONDS on this machine, else measured now (and cached)."""
    cache = _cache_file(identity) if identity is not None and src.name == "live" and size > 0 else None
    if cache is not None:
        try:
            entry = json.loads(cache.read_text(encoding="utf-8"))
            age = time.time() - float(entry["measured_at_epoch"])
            if 0 <= age <= DISK_MEASUREMENT_MAX_AGE_SECONDS:
                return float(entry["read_mbps"]), float(entry["write_mbps"]), None, _iso(entry["measured_at_epoch"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no entry, or a damaged one: measure
    now = time.time()
    read_mbps, write_mbps, fail = _measure(src, path, size)
    if fail is not None:
        return read_mbps, write_mbps, fail, None
    if cache is not None:
        try:
            from trainfit.files import write_atomic

            cache.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(cache, json.dumps({"identity": identity, "read_mbps": read_mbps, "write_mbps": write_mbps,
                                            "measured_at_epoch": now}))
        except Exception:  # noqa: BLE001 - a cache that cannot be written is only slower
            pass
    return read_mbps, write_mbps, None, _iso(now)


def _cache_file(identity: str):
    from trainfit.user_cache import user_cache_dir

    return user_cache_dir("disk", hashlib.sha256(identity.encode()).hexdigest()[:24] + ".json")


def _iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(float(epoch), datetime.timezone.utc).isoformat(timespec="seconds")


def _measure(src: Sources, path: str, size: int) -> tuple[float | None, float | None, str | None]:
    if size <= 0:
        return None, None, "not measured (quick profile)"
    try:
        read_mbps, write_mbps = src.disk_bench(path, size)
        return round(read_mbps, 1), round(write_mbps, 1), None
    except PermissionError:
        return None, None, f"no permission to write a test file in {path}"
    except OSError as exc:
        return None, None, f"test write in {path} failed: {exc.strerror or exc}"


def storage_unavailable(src: Sources, reason: str) -> list[StorageInfo]:
    fields = ("device", "total_bytes", "free_bytes", "read_mbps", "write_mbps", "measured_at")
    return [StorageInfo(role, path, None, "unknown", reason, None, None, None, None,
                        {f: reason for f in fields})
            for role, path in (("work", src.cwd), ("cache", cache_dir(src)))]
