"""Atomic file and directory writes, used by every layer that writes (CLI, trainer, exporters).

A file is written to a temporary name in the same directory, fsynced and renamed over the
target, and the directory is fsynced after the rename, so a crash leaves either the old file or
the new one, never half of one, and a finished write survives a power loss. A directory is
written the same way: into a hidden temporary sibling, every file and folder fsynced, then
renamed into place (atomic_dir).

Files get the mode a plain open() would give them (0666 less the umask), or keep the mode of the
file they replace; directories get 0777 less the umask.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

from trainfit.errors import BadInputError, TrainfitError, UnavailableError


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: the set-and-restore dance (not thread-safe, but brief)
    os.umask(mask)
    return mask


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so that renames and creations inside it are durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # platforms that cannot open a directory (Windows) have no directory fsync
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; nothing more can be done there
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file under root, then every directory (deepest first, root last)."""
    root = Path(root)
    dirs = [root]
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        dirs.extend(Path(dirpath) / d for d in dirnames)
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def write_atomic(path: str | os.PathLike, text: str, *, force: bool = True) -> Path:
    """Write text to path via a temp file + fsync + rename (+ fsync of the directory), so no
    half-written file is left."""
    path = Path(path)
    if path.exists() and not force:
        raise BadInputError(f"{path} exists", hint="pass --force to overwrite it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise BadInputError(f"cannot write {path}: directory {parent} does not exist")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)  # replacing a file keeps its mode
    except OSError:
        mode = 0o666 & ~current_umask()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), mode)  # mkstemp made it 0600
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise
    fsync_dir(parent)
    return path


# A full disk or quota: the machine's to fix (exit 4, with what to do).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

# Causes that are the user's to fix (a path that cannot be written); the rest (a full disk, an
# I/O error) are the machine's.
_USER_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR, errno.ENOENT, errno.ENAMETOOLONG}


def write_error(path: str | os.PathLike, exc: OSError) -> TrainfitError:
    """The error to raise when writing `path` failed with `exc`: exit 2 for a path the user can
    change, exit 4 for a full disk or an I/O error."""
    reason = exc.strerror or str(exc)
    if exc.errno in _USER_ERRNOS:
        return BadInputError(f"cannot write {path}: {reason}")
    return UnavailableError(f"cannot write {path}: {reason}", hint="check free disk space and the filesystem")


TMP_DIR_MARK = ".tmp-"
TRASH_MARK = ".trash-"


def _temp_prefix(name: str) -> str:
    return f".{name}{TMP_DIR_MARK}"


def remove_tree_atomic(path: str | os.PathLike) -> None:
    """Delete a directory so that it is never seen half-deleted under its own name: rename it to
    a hidden trash name first (atomic), fsync the parent, then delete. A crash during the delete
    leaves only `.<name>.trash-*`, which clean_stale_dirs removes."""
    path = Path(path)
    trash = path.with_name(f".{path.name}{TRASH_MARK}{os.urandom(4).hex()}")
    os.replace(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def clean_stale_dirs(parent: str | os.PathLike,
                     names: Collection[str] | Callable[[str], bool] | None = None) -> list[Path]:
    """Remove what interrupted atomic_dir / remove_tree_atomic calls left in parent: the hidden
    temporary and trash siblings of the directories `names` (a collection of names or a
    predicate; None: of any name). Returns what was removed. Only for directories that a single
    writer owns: another process's atomic_dir in progress would be removed too."""
    parent = Path(parent)
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        n = p.name
        if not n.startswith(".") or not (TMP_DIR_MARK in n or TRASH_MARK in n):
            continue
        owner = n[1:].rsplit(TMP_DIR_MARK if TMP_DIR_MARK in n else TRASH_MARK, 1)[0]
        if names is not None and not (names(owner) if callable(names) else owner in names):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


@contextmanager
def atomic_dir(path: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory to fill; when the block ends without an error, every
    file in it is fsynced and it is renamed to `path` (then the parent is fsynced). On an error
    the temporary directory is removed and `path` is untouched.

    An existing `path` is replaced only with replace=True (the old one is renamed to a trash name
    first and deleted after the new one is in place); otherwise FileExistsError is raised and the
    new content is dropped (e.g. another process published the same thing first).
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise BadInputError(f"cannot write {path}: directory {parent} does not exist")
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path.name), dir=parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp made it 0700
        yield tmp
        fsync_tree(tmp)
        old = None
        if path.exists() or path.is_symlink():
            if not replace:
                raise FileExistsError(f"{path} exists")
            old = path.with_name(f".{path.name}{TRASH_MARK}{os.urandom(4).hex()}")
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:
                os.replace(old, path)  # put the old one back
            raise
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()


class FolderAdditions:
    """What an attempt adds to a folder, remembered before it starts, so that a failure can take it
    out again. A folder the attempt created goes whole, with the parents it created when they are
    empty; in one that existed only the entries that were not there before go: its own entries, or
    with `deep` the outermost new entry at any depth (a cache folder shared between runs gets new
    files inside folders that were there)."""

    def __init__(self, root: str | os.PathLike, *, deep: bool = False) -> None:
        self.root = Path(root)
        self.deep = deep
        self.created: list[Path] = []  # root and the parents a mkdir(parents=True) will create
        p = self.root
        while not p.exists() and p != p.parent:
            self.created.append(p)
            p = p.parent
        self.before = self._entries()

    def _entries(self) -> set[str]:
        if not self.root.is_dir():
            return set()
        if not self.deep:
            return set(os.listdir(self.root))
        found: set[str] = set()
        for folder, dirs, files in os.walk(self.root):
            rel = Path(folder).relative_to(self.root)
            found.update(str(rel / name) for name in dirs + files)
        return found

    def undo(self) -> list[str]:
        """Remove what was added; returns the removed entries relative to the folder (["."]: the
        folder itself). An entry that went meanwhile is skipped; other errors are raised."""
        if not self.root.is_dir():
            return []
        if self.created:
            shutil.rmtree(self.root)
            for parent in self.created[1:]:
                try:
                    parent.rmdir()
                except OSError:
                    break
            return ["."]
        new = self._entries() - self.before
        outermost = sorted(e for e in new if str(Path(e).parent) not in new)
        for entry in outermost:
            path = self.root / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, onerror=_raise_unless_missing)
            else:
                path.unlink(missing_ok=True)
        return outermost


def _raise_unless_missing(func, path, exc_info) -> None:
    """shutil.rmtree's error handler: a file that went meanwhile is not an error."""
    if not issubclass(exc_info[0], FileNotFoundError):
        raise exc_info[1]
