"""Checkpoints: atomic, verified, resumed exactly; damaged ones skipped or refused, never touched."""

from __future__ import annotations

import shutil

import pytest

from trainfit.cli.main import main
from trainfit.config.run_config import load_run_config
from trainfit.train.recovery import checkpoints as ck
from trainfit.train.runner import run_training

from .conftest import loss_trajectory, make_config, tree_digest


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted 12-step run, and a run stopped at step 6 (checkpoints 4 and 6)."""
    tmp = tmp_path_factory.mktemp("resume")
    cfg = load_run_config(make_config(tmp, "pretrain"))
    full = run_training(cfg, tmp / "full", quiet=True)
    return tmp, cfg, full


def _stopped_copy(tmp_path, reference, stop=6):
    tmp, cfg, _ = reference
    run_dir = tmp_path / "run"
    run_training(cfg, run_dir, stop_after=stop, quiet=True)
    return cfg, run_dir


def test_resume_matches_uninterrupted_run_bit_for_bit(tmp_path, reference):
    _, cfg, full = reference
    cfg, run_dir = _stopped_copy(tmp_path, reference)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-4", "checkpoint-6"]
    resumed = run_training(cfg, run_dir, resume=True, quiet=True)
    assert resumed.resumed_from.endswith("checkpoint-6")
    assert loss_trajectory(run_dir) == dict(full.losses)  # exact float equality on CPU
    # keep_last=2: only the two newest complete checkpoints stay
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-12", "checkpoint-8"]
    assert all(ck.inspect_checkpoint(p).complete for p in (run_dir / "checkpoints").iterdir())


def test_corrupt_latest_is_skipped_and_kept(tmp_path, reference):
    _, cfg, full = reference
    cfg, run_dir = _stopped_copy(tmp_path, reference, stop=8)  # checkpoints 4 and 8
    bad = run_dir / "checkpoints" / "checkpoint-8" / "optimizer.pt"
    bad.write_bytes(bad.read_bytes()[:100])  # truncated, as by a full disk
    before = tree_digest(run_dir / "checkpoints" / "checkpoint-8")
    messages = []
    resumed = run_training(cfg, run_dir, resume=True, quiet=True, log=messages.append)
    assert resumed.resumed_from.endswith("checkpoint-4")
    assert any("skipping checkpoint-8" in m and "optimizer.pt" in m for m in messages)
    # the damaged one was moved aside (not deleted, not overwritten) when step 8 was saved again
    assert any("kept as checkpoint-8.corrupt-1" in m for m in messages)
    aside = run_dir / "checkpoints" / "checkpoint-8.corrupt-1"
    assert tree_digest(aside) == before
    assert loss_trajectory(run_dir) == dict(full.losses)


def test_interrupted_write_is_ignored_then_cleaned(tmp_path, reference):
    _, cfg, full = reference
    cfg, run_dir = _stopped_copy(tmp_path, reference)
    staging = run_dir / "checkpoints" / ".staging-checkpoint-8-deadbeef" / "checkpoint-8"
    staging.mkdir(parents=True)
    (staging / "model.safetensors").write_bytes(b"half")
    resumed = run_training(cfg, run_dir, resume=True, quiet=True)
    assert resumed.resumed_from.endswith("checkpoint-6")
    # never a checkpoint (only the rename publishes one), and as large as one: removed at start
    assert not staging.parent.exists()


def test_only_corrupt_checkpoints_exit_2_untouched(tmp_path, reference, capsys):
    tmp, cfg, _ = reference
    run_dir = tmp_path / "run"
    run_training(cfg, run_dir, stop_after=4, quiet=True)
    target = run_dir / "checkpoints" / "checkpoint-4" / "model.safetensors"
    target.write_bytes(b"\0" * target.stat().st_size)  # same size, different bytes
    before = tree_digest(run_dir)
    code = main(["train", str(tmp / "run.yaml"), "--out", str(run_dir), "--resume", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "no complete checkpoint" in err and "content changed" in err
    assert "Traceback" not in err
    assert tree_digest(run_dir) == before


def test_different_config_exit_2_untouched(tmp_path, reference, capsys):
    tmp, cfg, _ = reference
    run_dir = tmp_path / "run"
    run_training(cfg, run_dir, stop_after=4, quiet=True)
    before = tree_digest(run_dir)
    other = make_config(tmp_path, "pretrain", name="other.yaml", schedule={"lr": 0.1})
    code = main(["train", str(other), "--out", str(run_dir), "--resume", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "belongs to a different config" in err
    code = main(["train", str(other), "--out", str(run_dir), "--quiet"])  # no --resume
    assert code == 2 and "already holds a run" in capsys.readouterr().err
    assert tree_digest(run_dir) == before


def test_seal_and_publish_are_atomic(tmp_path):
    staging = tmp_path / ".staging-checkpoint-3-x" / "checkpoint-3"
    staging.mkdir(parents=True)
    (staging / "a.bin").write_bytes(b"abc")
    assert not ck.inspect_checkpoint(staging).complete  # no manifest yet
    ck.seal(staging)
    final = ck.publish(staging, tmp_path / "checkpoint-3")
    assert ck.inspect_checkpoint(final).complete and not staging.exists()
    (final / "a.bin").write_bytes(b"abd")
    info = ck.inspect_checkpoint(final)
    assert not info.complete and "content changed" in info.problem
    shutil.rmtree(final)
