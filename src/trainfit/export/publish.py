"""Write a tree of files under a target directory all at once or not at all, never through a link,
never over another run's files.

`plan --out DIR` (and `plan --pipeline --out DIR`, `analyze --generate-configs DIR`) write one
folder per mode, DIR/<mode>/<file>. write_tree:

1. takes an exclusive lock on DIR: a second run writing into DIR at the same time is refused
   (exit 2) before it writes anything;
2. finishes what a killed run left in DIR (its hidden `.trainfit-export-*` staging folder): the
   moves its journal lists are undone, so DIR is as it was before that run;
3. checks every target before anything is written: no symbolic link at or under DIR/<folder>
   (not even with --force: a planted DIR/balanced -> elsewhere/ would make trainfit write, and
   overwrite, elsewhere), no file where a folder goes, no folder where a file goes, no existing
   file without force (a file that is a symbolic link is replaced as a link, never followed);
4. writes every file of every folder into one staging folder (each file and folder fsynced once);
5. publishes in one step: DIR missing: one rename of the staged tree onto DIR. DIR present: a
   folder missing under DIR is renamed into place whole, a file into a folder that exists is
   renamed into place after the file it replaces (with force) is moved into the staging folder.
   Every move is written to a journal first, SIGINT and SIGTERM wait until the moves are done,
   and any failure undoes the moves already made; a SIGKILL is undone by the next run (step 2).

So after any failure, interrupt or kill, DIR holds what it held before or the complete new
tree; only a kill leaves a hidden staging folder, which the next run into DIR removes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from trainfit.errors import BadInputError, Interrupted, TrainfitError, UnavailableError, raise_interrupted

STAGING_PREFIX = ".trainfit-export-"
JOURNAL = "journal.json"
NEW, OLD = "new", "old"  # staged files, and the files they replace, inside the staging folder
EXECUTABLE_MODE = 0o755  # files that start with #! (launch.sh)
FILE_MODE = 0o644  # everything else
# Test hooks (tests/export/test_export_races.py): every writer waits at a file barrier before it
# takes the lock ("DIR:N": N writers meet in DIR), and pauses between publishing steps, so tests
# can start two runs at the same moment and kill one in the middle of its moves.
BARRIER_ENV = "TRAINFIT_TEST_EXPORT_BARRIER"
PAUSE_ENV = "TRAINFIT_TEST_EXPORT_PAUSE_SECONDS"


@dataclass(frozen=True)
class Move:
    """One rename of the publishing step, relative paths: target under DIR, staged and backup
    (where the file it replaces goes; None when nothing was there) under the staging folder."""

    target: str
    staged: str
    backup: str | None


def write_tree(out_dir: str | os.PathLike, folders: dict[str, dict[str, str]], *, force: bool,
               flag: str = "--out") -> dict[str, list[Path]]:
    """Write folders ({relative folder ('' = out_dir itself, 'a/b' nested): {file name: text}})
    under out_dir, all or nothing; returns folder -> the paths written, in order. Refusals are
    BadInputError naming `flag`, with nothing written."""
    out_dir = Path(out_dir)
    _check_names(folders, flag)
    with _signals_raise(), _locked(out_dir, flag):
        try:
            recover(out_dir, folders)
        except OSError as exc:
            from trainfit.files import write_error

            raise write_error(out_dir, exc) from None
        _check_targets(out_dir, folders, force, flag)
        if not out_dir.exists():
            _publish_new(out_dir, folders, flag)
        else:
            _publish_into(out_dir, folders, flag)
    return {folder: [out_dir / folder / name for name in files] for folder, files in folders.items()}


# -- checks ----------------------------------------------------------------------------------
def _check_names(folders: dict[str, dict[str, str]], flag: str) -> None:
    for folder, files in folders.items():
        parts = Path(folder).parts if folder else ()
        if any(p in (".", "..") or p.startswith(STAGING_PREFIX) for p in parts) or Path(folder).is_absolute() \
                or "\\" in folder:
            raise BadInputError(f"{flag}: cannot write into {folder!r}: not a plain folder name")
        for name in files:
            if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith(STAGING_PREFIX):
                raise BadInputError(f"cannot write {name!r}: not a plain file name")


def _link_problem(path: Path, flag: str) -> str:
    try:
        where = f" (to {os.readlink(path)})"
    except OSError:
        where = ""
    dangling = "" if path.exists() else ", dangling"
    return (f"{flag}: {path} is a symbolic link{where}{dangling}; trainfit writes only into real "
            f"directories under {flag}, never through a link")


def _folder_problem(out_dir: Path, folder: str, flag: str) -> str | None:
    """Why folder (relative to out_dir) cannot be written into: a link or a file on its way."""
    path = out_dir
    for part in Path(folder).parts if folder else ():
        path = path / part
        if path.is_symlink():
            return _link_problem(path, flag)
        if path.exists() and not path.is_dir():
            return f"{flag}: {path} is a file where a directory goes"
    return None


def check_folders(out_dir: str | os.PathLike, folders: list[str], flag: str = "--out") -> None:
    """The early form of the checks, for a command to run before any work: BadInputError when a
    link or a file stands where one of the folders goes (write_tree checks again, and the files)."""
    for folder in folders:
        problem = _folder_problem(Path(out_dir), folder, flag)
        if problem:
            raise BadInputError(f"{problem}; nothing was written", hint=f"remove it, or choose another {flag}")


def _check_targets(out_dir: Path, folders: dict[str, dict[str, str]], force: bool, flag: str) -> None:
    """Every reason not to write, found before anything is written (raises BadInputError)."""
    if out_dir.is_symlink() and not out_dir.exists():
        raise BadInputError(_link_problem(out_dir, flag) + "; nothing was written")
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInputError(f"{flag}: {out_dir} is a file, not a directory; nothing was written")
    problems: list[str] = []
    clashes: list[str] = []
    for folder, files in folders.items():
        problem = _folder_problem(out_dir, folder, flag)
        if problem:
            problems.append(problem)
            continue
        for name in files:
            target = out_dir / folder / name
            if target.is_symlink():
                clashes.append(f"{target} (a symbolic link)")  # replaced as a link under force, never followed
            elif target.is_dir():
                problems.append(f"{flag}: cannot write {target}: a directory is in the way")
            elif target.exists():
                clashes.append(str(target))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BadInputError(f"{problems[0]}{more}; nothing was written",
                            hint=f"remove it, or choose another {flag}")
    if clashes and not force:
        raise BadInputError(f"{flag}: {len(clashes)} file(s) exist, e.g. {clashes[0]}; nothing was written",
                            hint=f"pass --force to overwrite them, or choose another {flag}")


# -- writing ---------------------------------------------------------------------------------
def _stage(staging: Path, out_dir: Path, folders: dict[str, dict[str, str]], flag: str) -> None:
    """Every file, complete and fsynced once, under staging/new/<folder>/, then each staged folder
    fsynced once (deepest first). The staging folder is what makes the write atomic, so a file is
    written in place: no temporary file, rename and folder fsync per file."""
    from trainfit.files import write_error

    folders_made = {staging / NEW}
    for folder, files in folders.items():
        where = staging / NEW / folder
        where.mkdir(parents=True, exist_ok=True)
        folders_made.update(p for p in [where, *where.parents] if p.is_relative_to(staging / NEW))
        for name, text in files.items():
            try:
                _write_synced(where / name, text, EXECUTABLE_MODE if text.startswith("#!") else FILE_MODE)
            except OSError as exc:
                error = write_error(where / name, exc)
                error.message = f"{flag}: cannot write {out_dir / folder / name}: {_reason(error)}"
                raise error from None
    for made in sorted(folders_made, key=lambda p: len(p.parts), reverse=True):
        _fsync_dir(made)


def _write_synced(path: Path, text: str, mode: int) -> None:
    """A new file holding `text` with `mode`, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(path, mode)


def _reason(exc: TrainfitError) -> str:
    return exc.message.rsplit(": ", 1)[-1]


def _new_staging(parent: Path, prefix: str) -> Path:
    while True:
        path = parent / f"{prefix}{os.urandom(8).hex()}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def _publish_new(out_dir: Path, folders: dict[str, dict[str, str]], flag: str) -> None:
    """out_dir does not exist: the whole tree staged beside it, then one rename."""
    parent = out_dir.parent
    created = _make_parents(parent)
    staging = None
    published = False
    try:
        staging = _new_staging(parent, sibling_prefix(out_dir.name))
        _stage(staging, out_dir, folders, flag)
        _pause()
        with _signals_deferred():
            os.rename(staging / NEW, out_dir)
            published = True
            _fsync_dir(parent)
    except BaseException as exc:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if published:  # a signal that waited for the rename: the tree is complete
            raise _written_anyway(exc, out_dir) from None
        _remove_empty(created)
        raise _nothing_written(exc, out_dir, flag) from None
    shutil.rmtree(staging, ignore_errors=True)


def _publish_into(out_dir: Path, folders: dict[str, dict[str, str]], flag: str) -> None:
    """out_dir exists: stage inside it, journal the moves, move, undo on any failure."""
    staging = None
    moves: list[Move] = []
    published = False
    try:
        staging = _new_staging(out_dir, STAGING_PREFIX)
        _stage(staging, out_dir, folders, flag)
        moves = _moves(out_dir, folders)
        _write_journal(staging, "publishing", moves)
        _pause()
        with _signals_deferred():
            for move in moves:
                _check_no_link(out_dir, move.target, flag)
                if move.backup is not None:
                    (staging / move.backup).parent.mkdir(parents=True, exist_ok=True)
                    os.rename(out_dir / move.target, staging / move.backup)
                os.rename(staging / move.staged, out_dir / move.target)
                _pause()
            for folder in {str(Path(m.target).parent) for m in moves}:
                _fsync_dir(out_dir / folder)
            _write_journal(staging, "done", moves)
            published = True
    except BaseException as exc:
        if published:  # a signal that waited for the moves: the tree is complete
            shutil.rmtree(staging, ignore_errors=True)
            raise _written_anyway(exc, out_dir) from None
        if staging is not None:
            try:
                _roll_back(out_dir, staging, moves)
            except OSError as undo:  # the journal stays: the next run into out_dir finishes the roll-back
                raise UnavailableError(f"{flag}: writing {out_dir} failed ({exc}) and so did undoing it ({undo}); "
                                       f"run the same command again to restore {out_dir}") from None
            shutil.rmtree(staging, ignore_errors=True)
        raise _nothing_written(exc, out_dir, flag) from None
    shutil.rmtree(staging, ignore_errors=True)


def _moves(out_dir: Path, folders: dict[str, dict[str, str]]) -> list[Move]:
    """A folder missing under out_dir moves whole (its outermost missing folder); a file into a
    folder that exists moves alone, the file it replaces into old/."""
    moves: list[Move] = []
    whole: set[str] = set()
    for folder, files in folders.items():
        parts = Path(folder).parts if folder else ()
        missing = next((i for i in range(1, len(parts) + 1) if not os.path.lexists(out_dir.joinpath(*parts[:i]))),
                       None)
        if missing is not None:
            top = "/".join(parts[:missing])
            if top not in whole:
                whole.add(top)
                moves.append(Move(top, f"{NEW}/{top}", None))
            continue
        for name in files:
            rel = f"{folder}/{name}" if folder else name
            there = os.path.lexists(out_dir / rel)
            moves.append(Move(rel, f"{NEW}/{rel}", f"{OLD}/{rel}" if there else None))
    return moves


def _check_no_link(out_dir: Path, target: str, flag: str) -> None:
    """Right before a move: no folder on the way to the target became a link since the checks."""
    path = out_dir
    for part in Path(target).parts[:-1]:
        path = path / part
        if path.is_symlink() or not path.is_dir():
            raise BadInputError(_link_problem(path, flag) if path.is_symlink()
                                else f"{flag}: {path} is no longer a directory")


def _written_anyway(exc: BaseException, out_dir: Path) -> BaseException:
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted(exc.signum if isinstance(exc, Interrupted) else signal.SIGINT,
                           f"{out_dir} was written completely before it stopped")
    return exc


def _nothing_written(exc: BaseException, out_dir: Path, flag: str) -> BaseException:
    """The exception to raise after a roll-back: it says that nothing was written."""
    detail = f"nothing was written to {out_dir} (rolled back)"
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted(exc.signum if isinstance(exc, Interrupted) else signal.SIGINT, detail)
    if isinstance(exc, TrainfitError):
        if "nothing was written" not in exc.message:
            exc.message = f"{exc.message}; {detail}"
        return exc
    if isinstance(exc, OSError):
        from trainfit.files import write_error

        err = write_error(out_dir, exc)
        err.message = f"{flag}: {err.message}; {detail}"
        return err
    return exc


# -- the journal and recovery ----------------------------------------------------------------
def _write_journal(staging: Path, phase: str, moves: list[Move]) -> None:
    from trainfit.files import write_atomic

    write_atomic(staging / JOURNAL, json.dumps({"phase": phase, "moves": [asdict(m) for m in moves]}))


def _read_journal(staging: Path) -> tuple[str, list[Move]] | None:
    try:
        doc = json.loads((staging / JOURNAL).read_text(encoding="utf-8"))
        return str(doc["phase"]), [Move(**m) for m in doc["moves"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no journal (the run never reached its moves): nothing to undo


def _roll_back(out_dir: Path, staging: Path, moves: list[Move]) -> None:
    """Undo the moves, last first. Each step checks where the file is, so running it again
    (after a kill during a roll-back) is harmless."""
    for move in reversed(moves):
        staged, target = staging / move.staged, out_dir / move.target
        if not os.path.lexists(staged) and os.path.lexists(target):
            staged.parent.mkdir(parents=True, exist_ok=True)
            os.rename(target, staged)
        if move.backup is not None and os.path.lexists(staging / move.backup):
            os.rename(staging / move.backup, target)


def sibling_prefix(name: str) -> str:
    return f".{name}{STAGING_PREFIX}"


def recover(out_dir: str | os.PathLike, folders: dict[str, dict[str, str]] | None = None) -> list[Path]:
    """Finish what killed runs left (call with out_dir locked): a staging folder inside out_dir is
    rolled back by its journal (kept when its journal says done) and removed; staged trees beside
    out_dir, and the staging folders older trainfit versions left in each folder they wrote, are
    removed. Returns what was removed."""
    out_dir = Path(out_dir)
    beside = re.compile(re.escape(sibling_prefix(out_dir.name)) + r"[0-9a-f]{16}")
    removed = [p for p in _children(out_dir.parent) if beside.fullmatch(p.name) and _remove_staging(None, p)]
    if not out_dir.is_dir():
        return removed
    inside = [out_dir] + [out_dir / f for f in folders or {} if f and not _has_link(out_dir, f)]
    for folder in inside:
        removed += [p for p in _children(folder) if p.name.startswith(STAGING_PREFIX)
                    and _remove_staging(out_dir if folder == out_dir else None, p)]
    return removed


def _remove_staging(out_dir: Path | None, staging: Path) -> bool:
    """Undo a staging folder's journalled moves (when out_dir is given), then delete it."""
    if not staging.is_dir() or staging.is_symlink():
        return False
    journal = _read_journal(staging) if out_dir is not None else None
    if journal is not None and journal[0] == "publishing":
        _roll_back(out_dir, staging, journal[1])
    shutil.rmtree(staging, ignore_errors=True)
    return True


def _has_link(out_dir: Path, folder: str) -> bool:
    path = out_dir
    for part in Path(folder).parts:
        path = path / part
        if path.is_symlink():
            return True
    return False


def _children(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


# -- the lock --------------------------------------------------------------------------------
@contextmanager
def _locked(out_dir: Path, flag: str) -> Iterator[None]:
    """An exclusive lock on out_dir for the whole write; BadInputError when another run holds it.

    The lock file lives in trainfit's cache (named by out_dir's real path, so nothing is left in
    the user's folders and a missing out_dir can be locked too); where that cannot be written,
    the nearest existing folder above out_dir is locked instead."""
    _barrier()
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no lock
        yield
        return
    fd = _lock_fd(out_dir)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInputError(f"{flag}: another trainfit run is writing into {out_dir} right now; "
                                "nothing was written", hint="let it finish, then run again") from None
        yield
    finally:
        os.close(fd)


def _lock_fd(out_dir: Path) -> int:
    from trainfit.user_cache import user_cache_dir

    key = hashlib.sha256(os.path.realpath(out_dir).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    lock = user_cache_dir("locks", f"export-{key}.lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        folder = out_dir.absolute()
        while not folder.is_dir() and folder.parent != folder:
            folder = folder.parent
        return os.open(folder, os.O_RDONLY)


# -- signals ---------------------------------------------------------------------------------
@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted while the tree is written (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back during the moves (milliseconds), so an interrupt never lands
    between two of them; delivered when the block ends."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# -- small helpers ---------------------------------------------------------------------------
def _make_parents(folder: Path) -> list[Path]:
    """mkdir -p; returns the folders it created, innermost first."""
    missing: list[Path] = []
    p = folder
    while not os.path.lexists(p) and p.parent != p:
        missing.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def _fsync_dir(folder: Path) -> None:
    from trainfit.files import fsync_dir

    fsync_dir(folder)


def _pause() -> None:
    seconds = os.environ.get(PAUSE_ENV)
    if seconds:
        time.sleep(float(seconds))


def _barrier() -> None:
    spec = os.environ.get(BARRIER_ENV)
    if not spec:
        return
    folder, _, count = spec.rpartition(":")
    Path(folder, str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < int(count) and time.monotonic() < deadline:
        time.sleep(0.005)
