"""Whether a multi-node run's run directory is on storage every node shares.

Every rank of a run reads the run directory: on --resume each one loads the checkpoint from it
(trainfit.train.run_dir.prepare_run_dir), while only global rank 0 writes it. On a node-local disk
the other nodes see no checkpoint, start from step 0 while node 0 resumes, and the run diverges or
hangs in its first collective; a preempted node's local disk may be gone altogether. So a run with
training.num_nodes > 1 refuses a run directory (`trainfit train --out DIR`) that is, in order:

1. a relative path: each node resolves it against its own working directory;
2. under a root that is node-local by convention (NODE_LOCAL_ROOTS: /tmp, /var/tmp, /dev/shm,
   /run, /local, /scratch/local, /scratch-local, /localscratch, /lscratch, /mnt/local*, /mnt/nvme*,
   /nvme*, /mnt/resource (Azure's temporary disk), /mnt/ephemeral*, /ephemeral*, /opt/dlami/nvme
   (the AWS Deep Learning AMI's instance store));
3. on a filesystem whose type is a single machine's (LOCAL_FS_TYPES: memory filesystems, a
   container's overlay layer, block-device filesystems such as ext4 / xfs / btrfs / zfs), read
   from /proc/mounts for the mount that holds the directory (its nearest existing ancestor).
   Network and cluster filesystems (nfs, lustre, gpfs, beegfs, ceph, glusterfs, cifs, fuse mounts
   of buckets, ...) and types not listed pass.

`checkpointing.allow_node_local: true` in the run config turns the check off, for storage the rule
cannot see is shared (a block device every node mounts through a cluster filesystem layer, the
"nodes" of a test on one machine) - the message says so.
"""

from __future__ import annotations

import os
from pathlib import Path

NODE_LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/local", "/scratch/local", "/scratch-local",
                    "/localscratch", "/lscratch", "/mnt/local*", "/mnt/nvme*", "/nvme*", "/mnt/resource",
                    "/mnt/ephemeral*", "/ephemeral*", "/opt/dlami/nvme")
LOCAL_FS_TYPES = frozenset({"tmpfs", "ramfs", "devtmpfs", "overlay", "overlayfs", "aufs", "ext2", "ext3", "ext4",
                            "xfs", "btrfs", "zfs", "f2fs", "vfat", "exfat", "ntfs", "ntfs3", "hfsplus", "apfs",
                            "squashfs"})
MOUNTS_FILE = "/proc/mounts"


def _under(path: str, root: str) -> bool:
    if root.endswith("*"):  # /mnt/nvme* : /mnt/nvme, /mnt/nvme0, /mnt/nvme0n1/...
        return path.startswith(root[:-1])
    return path == root or path.startswith(root.rstrip("/") + "/")


def root_reason(path: str) -> str | None:
    """Rules 1 and 2 (no filesystem access)."""
    if not os.path.isabs(path):
        return "a relative path: each node resolves it against its own working directory"
    normal = os.path.normpath(path)
    for root in NODE_LOCAL_ROOTS:
        if _under(normal, root):
            return f"{root.rstrip('*')}{'...' if root.endswith('*') else ''} is node-local storage by convention"
    return None


def mount_of(path: str, mounts_text: str) -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding `path` (longest matching mount point)."""
    best: tuple[str, str] | None = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/") or point == "/") and (
                best is None or len(point) > len(best[0])):
            best = (point, fields[2])
    return best


def _real(path: Path) -> Path:
    """`path` with the links of its nearest existing ancestor resolved (the rest is not created yet)."""
    head, rest = path, []
    while not head.exists() and head != head.parent:
        rest.insert(0, head.name)
        head = head.parent
    return head.resolve().joinpath(*rest)


def node_local_reason(path: str, mounts_text: str | None = None) -> str | None:
    """Why `path` is not shared between nodes (rules 1-3 of the module docstring), or None."""
    reason = root_reason(path)
    if reason is not None:
        return reason
    if mounts_text is None:
        try:
            mounts_text = Path(MOUNTS_FILE).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None  # not Linux: rules 1 and 2 only
    real = str(_real(Path(os.path.normpath(path))))
    mount = mount_of(real, mounts_text)
    if mount is not None and mount[1] in LOCAL_FS_TYPES:
        return f"it is on {mount[0]}, a {mount[1]} filesystem: one machine's own storage"
    return None
