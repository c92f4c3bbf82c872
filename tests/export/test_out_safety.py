"""`plan --out` / `analyze --generate-configs` never write outside the target, never overwrite
without --force, and leave the previous state or the complete new one: planted symbolic links,
things in the way, a full disk, two runs at once, SIGINT / SIGTERM / SIGKILL during the write
(trainfit.export.publish)."""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainfit.cli.main import main
from trainfit.export import publish

SRC = Path(__file__).resolve().parents[2] / "src"
PLAN = ["plan", "shape:125m", "--hardware", "cpu"]
MODES = ("conservative", "balanced", "extreme")


def snapshot(root: Path) -> dict[str, bytes | str] | None:
    """Every entry under root: file bytes, 'dir', or 'link -> target' (None: root missing)."""
    if not os.path.lexists(root):
        return None
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = f"link -> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def leftovers(*folders: Path) -> list[str]:
    return [str(p) for f in folders if f.is_dir() for p in f.rglob("*") if publish.STAGING_PREFIX in p.name]


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(SRC) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


def launch(argv: list[str], **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainfit", *argv], env=env(**extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


# -- links planted in the target ---------------------------------------------------------------
@pytest.fixture
def planted(tmp_path):
    """out/balanced -> ../elsewhere, where a file of the user's lies."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "run.yaml").write_text("the user's own file\n")
    (out / "balanced").symlink_to("../elsewhere")
    return out, elsewhere


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("command", ["plan", "analyze"])
def test_a_linked_mode_folder_is_refused_even_with_force(planted, capsys, command, force):
    out, elsewhere = planted
    before, outside = snapshot(out), snapshot(elsewhere)
    argv = PLAN + ["--out", str(out)] if command == "plan" else ["analyze", "--hardware", "cpu",
                                                                  "--generate-configs", str(out)]
    code, err = run_main(argv + (["--force"] if force else []), capsys)
    flag = "--out" if command == "plan" else "--generate-configs"
    assert code == 2 and f"{flag}: {out / 'balanced'} is a symbolic link" in err and "nothing was written" in err
    assert snapshot(elsewhere) == outside and snapshot(out) == before


@pytest.mark.parametrize("command", ["plan", "analyze"])
def test_a_linked_mode_folder_is_refused_before_any_work(planted, capsys, monkeypatch, command):
    from trainfit.core.plan import planner
    from trainfit.hardware import profiler

    def no_work(*a, **kw):
        raise AssertionError("planned or profiled before refusing the output folder")

    monkeypatch.setattr(planner, "plan", no_work)
    monkeypatch.setattr(profiler, "build_profile", no_work)
    out, _ = planted
    argv = PLAN + ["--out", str(out)] if command == "plan" else ["analyze", "--generate-configs", str(out)]
    code, err = run_main(argv, capsys)
    assert code == 2 and "is a symbolic link" in err


def test_a_link_deeper_in_a_pipeline_folder_is_refused(tmp_path, capsys):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (out / "balanced").mkdir(parents=True)
    elsewhere.mkdir()
    (out / "balanced" / "sft").symlink_to(elsewhere)
    code, err = run_main(["plan", "Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--hardware", "m2-16gb",
                          "--pairs", "500", "--out", str(out), "--force"], capsys)
    assert code == 2 and "sft is a symbolic link" in err, err
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(out / "balanced")) == ["sft"]


@pytest.mark.parametrize("dangling", [False, True])
def test_a_linked_file_is_replaced_as_a_link_never_followed(tmp_path, capsys, dangling):
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    (out / "balanced").mkdir(parents=True)
    if not dangling:
        victim.write_text("keep me\n")
    (out / "balanced" / "run.yaml").symlink_to(victim)
    code, err = run_main(PLAN + ["--out", str(out)], capsys)
    assert code == 2 and "run.yaml (a symbolic link)" in err and "nothing was written" in err
    assert sorted(os.listdir(out)) == ["balanced"]
    code, err = run_main(PLAN + ["--out", str(out), "--force"], capsys)
    assert code == 0, err
    written = out / "balanced" / "run.yaml"
    assert not written.is_symlink() and "trainfit run config" in written.read_text()
    assert (victim.read_text() == "keep me\n") if not dangling else not victim.exists()


# -- things in the way: nothing is written, whatever the mode ------------------------------------
@pytest.mark.parametrize("case", ["file-for-folder", "folder-for-file", "dangling-folder-link"])
def test_something_in_a_later_mode_writes_no_earlier_mode(tmp_path, capsys, case):
    out = tmp_path / "out"
    out.mkdir()
    if case == "file-for-folder":
        (out / "extreme").write_text("a file\n")
    elif case == "folder-for-file":
        (out / "extreme" / "launch.sh").mkdir(parents=True)
    else:
        (out / "extreme").symlink_to(tmp_path / "missing")
    before = snapshot(out)
    for force in ([], ["--force"]):
        code, err = run_main(PLAN + ["--out", str(out), *force], capsys)
        assert code == 2 and "nothing was written" in err and "extreme" in err, err
        assert snapshot(out) == before  # conservative and balanced were not written either
    assert not (tmp_path / "missing").exists()


def test_a_full_disk_rolls_every_mode_back(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert run_main(PLAN + ["--out", str(out), "--seq-len", "256"], capsys)[0] == 0
    before = snapshot(out)
    from trainfit.export import publish

    real = publish._write_synced
    written = []

    def full_on_the_ninth(path, text, mode):
        written.append(path)
        if len(written) == 9:  # the third mode's first file
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text, mode)

    monkeypatch.setattr(publish, "_write_synced", full_on_the_ninth)
    code, err = run_main(PLAN + ["--out", str(out), "--seq-len", "512", "--force"], capsys)
    assert code == 4 and "No space left on device" in err and "nothing was written" in err, err
    assert snapshot(out) == before and not leftovers(tmp_path)
    # a fresh target: no folder appears at all
    written.clear()
    code, err = run_main(PLAN + ["--out", str(tmp_path / "fresh" / "out")], capsys)
    assert code == 4 and "nothing was written" in err and not (tmp_path / "fresh").exists()


def test_a_failing_move_is_undone_and_the_message_says_so(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert run_main(PLAN + ["--out", str(out), "--seq-len", "256"], capsys)[0] == 0
    before = snapshot(out)
    real = os.rename
    moves = []

    def fail_in_the_last_mode(src, dst):
        if Path(dst).parent.parent == out:
            moves.append(dst)
            if Path(dst).parent.name == "extreme" and "old" not in Path(src).parts:
                raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(publish.os, "rename", fail_in_the_last_mode)
    code, err = run_main(PLAN + ["--out", str(out), "--seq-len", "512", "--force"], capsys)
    assert code == 4 and "Input/output error" in err and "rolled back" in err, err
    assert len(moves) > 8  # conservative and balanced had been replaced ...
    assert snapshot(out) == before and not leftovers(tmp_path)  # ... and are back as they were


# -- two runs, one target ----------------------------------------------------------------------
def test_a_second_run_is_refused_while_the_first_holds_the_target(tmp_path):
    out = tmp_path / "out"
    with publish._locked(out, "--out"):
        proc = subprocess.run([sys.executable, "-m", "trainfit", *PLAN, "--out", str(out), "--force"], env=env(),
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "another trainfit run is writing into" in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("existing", [False, True])
def test_two_runs_at_once_never_mix_or_overwrite(tmp_path, force, existing):
    """Both runs meet at a barrier right before the lock; the one that loses changes nothing."""
    out, barrier = tmp_path / "out", tmp_path / "barrier"
    barrier.mkdir()
    if existing:
        out.mkdir()
        (out / "notes.txt").write_text("the user's\n")
    hooks = {publish.BARRIER_ENV: f"{barrier}:2", publish.PAUSE_ENV: "0.2"}
    procs = [launch(PLAN + ["--out", str(out), "--seq-len", str(seq)] + (["--force"] if force else []), **hooks)
             for seq in (256, 512)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "another trainfit run is writing into" in loser and "nothing was written" in loser
    winner_seq = (256, 512)[[code for code, _ in results].index(0)]
    for mode in MODES:
        assert f"seq_len: {winner_seq}" in (out / mode / "run.yaml").read_text()
    assert not leftovers(tmp_path / "out")
    if existing:
        assert (out / "notes.txt").read_text() == "the user's\n"
    later = subprocess.run([sys.executable, "-m", "trainfit", *PLAN, "--out", str(out)], env=env(),
                           capture_output=True, text=True, timeout=120)  # one after the other: --force needed
    assert later.returncode == 2 and "file(s) exist" in later.stderr and "--force" in later.stderr
    assert f"seq_len: {winner_seq}" in (out / "balanced" / "run.yaml").read_text()


# -- interrupted and killed at random moments --------------------------------------------------
def _staging_started(out: Path) -> bool:
    if not out.parent.is_dir():
        return False
    return bool([p for p in out.parent.iterdir() if p.name.startswith(publish.sibling_prefix(out.name))]
                or (out.is_dir() and [p for p in out.iterdir() if p.name.startswith(publish.STAGING_PREFIX)]))


def _kill_trials(tmp_path: Path, trials: int, seed: int, capsys) -> list[tuple[str, str]]:
    """Each trial: the previous state (no target, or an earlier plan), a `plan --out --force`
    killed at a seeded moment (SIGKILL anywhere; SIGINT or SIGTERM while it writes). Afterwards
    the target holds the previous state or the complete new one: at once after SIGINT / SIGTERM
    (exit 130 / 143, a message, no staging folder left), after the next run's recovery after
    SIGKILL. Returns each trial's (signal, state the target ended in: "previous" or "new")."""
    rng = random.Random(seed)
    endings = []
    pause = 0.04
    base = tmp_path / "base"
    run = lambda out, seq: main(PLAN + ["--out", str(out), "--seq-len", str(seq), "--force"])  # noqa: E731
    # the previous and the new state of each starting point, written without interruption
    states = {}
    for start in ("fresh", "earlier-plan"):
        out = tmp_path / start / "out"
        if start == "earlier-plan":
            assert run(out, 256) == 0
        previous = snapshot(out)
        if previous is not None:
            shutil.copytree(out, base / start)
        assert run(out, 512) == 0
        states[start] = (previous, snapshot(out))
    capsys.readouterr()
    for trial in range(trials):
        start = rng.choice(sorted(states))
        previous, new = states[start]
        out = tmp_path / start / "out"  # the files name their --out: the same path as the states
        shutil.rmtree(out, ignore_errors=True)
        if previous is not None:
            shutil.copytree(base / start, out)
        # each signal in the first three trials, then a seeded mix
        sig = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)[trial] if trial < 3 else \
            rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
        proc = launch(PLAN + ["--out", str(out), "--seq-len", "512", "--force"], **{publish.PAUSE_ENV: str(pause)})
        anywhere = sig == signal.SIGKILL and rng.random() < 0.3
        if anywhere:  # from start-up on
            time.sleep(rng.uniform(0, 1.0))
        else:  # while it writes: the staging folder exists, moves are under way
            deadline = time.monotonic() + 60
            while not _staging_started(out) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, pause * 16))
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
        what = f"trial {trial}: {start}, {signal.Signals(sig).name}, exit {code}: {err[-300:]}"
        if sig == signal.SIGKILL:
            publish.recover(out)  # what the next run into out does first
        elif code in (0, -sig):  # it had written everything before the signal came (or was exiting)
            assert snapshot(out) == new, what
        else:
            assert code == 128 + sig and "trainfit: interrupted" in err and "Traceback" not in err, what
        assert not leftovers(out.parent), what
        assert snapshot(out) in (previous, new), what
        if "nothing was written" in err:
            assert snapshot(out) == previous, what
        endings.append((signal.Signals(sig).name, "new" if snapshot(out) == new else "previous"))
    # the next run cleans what a killed one left, and writes
    killed = tmp_path / "killed" / "out"
    proc = launch(PLAN + ["--out", str(killed)], **{publish.PAUSE_ENV: "5"})
    while not _staging_started(killed):
        time.sleep(0.002)
    proc.kill()
    proc.wait()
    assert leftovers(killed.parent)
    assert run(killed, 512) == 0 and not leftovers(killed.parent) and snapshot(killed) is not None
    return endings


def test_killed_at_random_moments_three_times(tmp_path, capsys):
    endings = _kill_trials(tmp_path, 3, seed=35, capsys=capsys)
    assert [sig for sig, _ in endings] == ["SIGKILL", "SIGTERM", "SIGINT"]
    assert all(state in ("previous", "new") for _, state in endings)


@pytest.mark.slow
def test_killed_at_random_moments_twenty_times(tmp_path, capsys):
    endings = _kill_trials(tmp_path, 20, seed=3520, capsys=capsys)
    assert len(endings) == 20 and {sig for sig, _ in endings} == {"SIGKILL", "SIGTERM", "SIGINT"}
    assert all(state in ("previous", "new") for _, state in endings)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_before_the_moves_rolls_back_with_a_message(tmp_path, capsys, sig):
    out = tmp_path / "out"
    assert run_main(PLAN + ["--out", str(out), "--seq-len", "256"], capsys)[0] == 0
    before = snapshot(out)
    proc = launch(PLAN + ["--out", str(out), "--seq-len", "512", "--force"], **{publish.PAUSE_ENV: "3"})
    deadline = time.monotonic() + 60
    while not list(out.glob(f"{publish.STAGING_PREFIX}*/{publish.JOURNAL}")) and time.monotonic() < deadline:
        time.sleep(0.005)  # the journal is written, the pause before the first move has begun
    proc.send_signal(sig)
    code, err = proc.wait(timeout=60), proc.stderr.read()
    name = signal.Signals(sig).name
    assert code == 128 + sig, err
    assert err.strip() == f"trainfit: interrupted by {name}; nothing was written to {out} (rolled back)"
    assert snapshot(out) == before and not leftovers(tmp_path)


def test_the_next_run_removes_what_older_versions_left(tmp_path, capsys):
    """Older versions staged each mode's files in a hidden folder inside it; a kill left it."""
    out = tmp_path / "out"
    (out / "balanced" / ".trainfit-export-k2j4_x9a").mkdir(parents=True)
    (out / "balanced" / ".trainfit-export-k2j4_x9a" / "run.yaml").write_text("half\n")
    code, err = run_main(PLAN + ["--out", str(out)], capsys)
    assert code == 0, err
    assert not leftovers(tmp_path) and sorted(os.listdir(out)) == list(sorted(MODES))


def test_sigterm_outside_the_write_is_a_message_and_exit_143(tmp_path, capsys, monkeypatch):
    """Any command but train / verify (which checkpoint on signals themselves)."""
    from trainfit.cli import cmd_plan

    def terminated_while_planning(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        return 0

    monkeypatch.setattr(cmd_plan, "run", terminated_while_planning)
    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    code, err = run_main(PLAN, capsys)
    assert code == 143 and err.strip() == "trainfit: interrupted by SIGTERM" and time.monotonic() - started < 4
    assert signal.getsignal(signal.SIGTERM) == before  # main put the previous handler back


# -- a really full disk (a tiny tmpfs in a user namespace, where the kernel allows one) -----------
_FULL_DISK = r"""
import hashlib, json, os, subprocess, sys
disk = sys.argv[1]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", disk], check=True)
out = os.path.join(disk, "out")
plan = [sys.executable, "-m", "trainfit", "plan", "shape:125m", "--hardware", "cpu", "--out", out]

def tree():
    return sorted((os.path.relpath(os.path.join(d, f), disk), hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest())
                  for d, _, fs in os.walk(disk) for f in fs) + sorted(os.path.relpath(d, disk) for d, _, _ in os.walk(disk))

result = {}
first = subprocess.run(plan + ["--seq-len", "256"], capture_output=True, text=True)
result["first"] = first.returncode
before = tree()
used_kib = int(subprocess.run(["df", "-k", "--output=used", disk], capture_output=True, text=True).stdout.split()[-1])
subprocess.run(["mount", "-o", f"remount,size={used_kib + 12}k", disk], check=True)  # room for about 3 files
second = subprocess.run(plan + ["--seq-len", "512", "--force"], capture_output=True, text=True)
result.update(code=second.returncode, err=second.stderr, unchanged=tree() == before)
fresh = subprocess.run(plan[:-1] + [os.path.join(disk, "fresh")], capture_output=True, text=True)
result.update(fresh_code=fresh.returncode, fresh_err=fresh.stderr, fresh_unchanged=tree() == before)
print(json.dumps(result))
"""


def test_a_really_full_disk_rolls_every_mode_back(tmp_path):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no user namespace to mount a tiny tmpfs in (the monkeypatched full disk above still runs)")
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["unshare", "-rm", sys.executable, "-c", _FULL_DISK, str(disk)], env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = __import__("json").loads(proc.stdout)
    assert r["first"] == 0
    assert r["code"] == 4 and "No space left on device" in r["err"] and "nothing was written" in r["err"], r
    assert r["unchanged"], r
    assert r["fresh_code"] == 4 and "nothing was written" in r["fresh_err"] and r["fresh_unchanged"], r
