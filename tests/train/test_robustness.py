"""Hardening of `trainfit train`: atomic files and directories, checkpoint rotation that never
leaves a half-deleted checkpoint, damaged checkpoints refused cleanly (exit 2, nothing changed),
failed starts that leave no run directory behind, and the small things a user sees."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from trainfit import files
from trainfit.cli.main import main
from trainfit.config.run_config import load_run_config
from trainfit.train.recovery import checkpoints as ck
from trainfit.train.runner import run_training

from .conftest import REPO, loss_trajectory, make_config, tree_digest


@pytest.fixture
def umask():
    """Set a umask for the test, restore it after."""
    saved = os.umask(0o022)
    os.umask(saved)

    def set_(mask: int) -> None:
        os.umask(mask)

    yield set_
    os.umask(saved)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A 12-step tiny pretraining run stopped at step 8 (checkpoints 4 and 8), and the losses of
    the same run uninterrupted."""
    tmp = tmp_path_factory.mktemp("robust")
    config = make_config(tmp, "pretrain")
    cfg = load_run_config(config)
    full = run_training(cfg, tmp / "full", quiet=True)
    run_training(cfg, tmp / "stopped", stop_after=8, quiet=True)
    assert sorted(p.name for p in (tmp / "stopped" / "checkpoints").iterdir()) == ["checkpoint-4", "checkpoint-8"]
    return config, tmp / "stopped", dict(full.losses)


def _copy(stopped, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(stopped[1], run_dir)
    return run_dir


# ---------------------------------------------------------------------------------------------
# 1. atomic files and directories
def test_write_atomic_gives_the_usual_mode_and_fsyncs_the_directory(tmp_path, umask, monkeypatch):
    synced = []
    real = files.fsync_dir
    monkeypatch.setattr(files, "fsync_dir", lambda p: (synced.append(Path(p)), real(p)))
    umask(0o027)
    new = files.write_atomic(tmp_path / "a.txt", "one\n")
    assert stat.S_IMODE(new.stat().st_mode) == 0o640  # 0666 & ~umask, as open() gives; not mkstemp's 0600
    assert synced == [tmp_path]  # the rename itself is made durable
    umask(0o022)
    assert stat.S_IMODE(files.write_atomic(tmp_path / "b.txt", "x").stat().st_mode) == 0o644
    os.chmod(new, 0o600)
    files.write_atomic(new, "two\n")  # replacing a file keeps its mode
    assert stat.S_IMODE(new.stat().st_mode) == 0o600 and new.read_text() == "two\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]  # no temp file left


def test_atomic_dir_publishes_complete_or_nothing(tmp_path, umask):
    umask(0o022)
    target = tmp_path / "final"
    with files.atomic_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".final.") and not target.exists()
        (tmp / "sub").mkdir()
        (tmp / "sub" / "w.bin").write_bytes(b"w")
    assert (target / "sub" / "w.bin").read_bytes() == b"w"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # not mkdtemp's 0700
    with pytest.raises(RuntimeError):
        with files.atomic_dir(tmp_path / "broken") as tmp:
            (tmp / "half.bin").write_bytes(b"h")
            raise RuntimeError("crash while writing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no target, no temp dir
    with pytest.raises(FileExistsError):  # no replace: the existing one stays
        with files.atomic_dir(target) as tmp:
            (tmp / "other").write_text("o")
    assert (target / "sub" / "w.bin").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["final"]
    with files.atomic_dir(target, replace=True) as tmp:
        (tmp / "new").write_text("n")
    assert [p.name for p in target.iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # the old one is deleted, not left as trash


def test_clean_stale_dirs_removes_only_leftovers_of_named_dirs(tmp_path):
    for name in (".final.tmp-abc", ".tokenizer.trash-12ab", ".other.tmp-x", "final", ".hidden"):
        (tmp_path / name).mkdir()
    removed = files.clean_stale_dirs(tmp_path, ["final", "tokenizer"])
    assert sorted(p.name for p in removed) == [".final.tmp-abc", ".tokenizer.trash-12ab"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", ".other.tmp-x", "final"]


def test_tokenizer_is_saved_atomically(tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerFast

    from trainfit.train.tokenizer import has_tokenizer_files, load_tokenizer, train_bpe_tokenizer

    texts = [f"line {i} of a small corpus for a small tokenizer" for i in range(200)]
    out = tmp_path / "tokenizer"
    out.mkdir()
    (out / "tokenizer_config.json").write_text("{")  # half-written by an older version
    train_bpe_tokenizer(iter(texts), 300, out)
    assert has_tokenizer_files(out) and len(load_tokenizer(out)) > 256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]

    def crash(self, path, *a, **kw):
        (Path(path) / "tokenizer.json").write_text("{half")
        raise OSError("disk full")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", crash)
    with pytest.raises(OSError):
        train_bpe_tokenizer(iter(texts), 300, tmp_path / "tok2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer"]  # no tok2, no temp dir


def test_random_init_dir_is_atomic_and_a_half_written_one_is_rebuilt(tmp_path):
    from trainfit.train.run_dir import write_run_files
    from trainfit.train.trainer_setup import get_tokenizer, is_complete_model_dir, save_random_init

    cfg = load_run_config(make_config(tmp_path, "pretrain"))
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True, report_to=[])
    tokenizer, _ = get_tokenizer(cfg, tmp_path / "run", args, lambda m: None)
    init_dir = tmp_path / "run" / "random-init"
    init_dir.mkdir()
    (init_dir / "config.json").write_text("{}")  # what a crash left: config.json, no weights
    assert not is_complete_model_dir(init_dir)
    save_random_init(cfg, tokenizer, init_dir)
    assert is_complete_model_dir(init_dir) and (init_dir / "model.safetensors").is_file()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["random-init", "tokenizer"]
    digest = tree_digest(init_dir)
    save_random_init(cfg, tokenizer, init_dir)  # complete: reused as it is
    assert tree_digest(init_dir) == digest
    (tmp_path / "run" / ".random-init.tmp-dead").mkdir()  # a crash inside atomic_dir
    (tmp_path / "run" / ".final.trash-beef").mkdir()
    write_run_files(cfg, tmp_path / "run", None)
    assert not any(p.name.startswith(".") for p in (tmp_path / "run").iterdir())


def test_run_leaves_no_hidden_leftovers_and_normal_modes(stopped, tmp_path, umask):
    umask(0o022)
    config, _, full = stopped
    run_dir = _copy(stopped, tmp_path)
    result = run_training(load_run_config(config), run_dir, resume=True, quiet=True)
    assert result.global_step == 12 and loss_trajectory(run_dir) == full
    assert not [p for p in run_dir.rglob(".*")]  # final/ replaced atomically, no temp or trash
    assert (run_dir / "final" / "model.safetensors").is_file() and (run_dir / "final" / "tokenizer.json").is_file()
    for name in ("summary.json", "metrics.jsonl"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o644


# ---------------------------------------------------------------------------------------------
# 1. rotation: rename to trash first, then delete
def test_rotation_never_leaves_a_half_deleted_checkpoint(stopped, tmp_path, monkeypatch):
    run_dir = _copy(stopped, tmp_path)
    ckpt_dir = run_dir / "checkpoints"

    def crash_half_way(path, *a, **kw):  # deletes one file, then the process "dies"
        victim = sorted(Path(path).iterdir())[0]
        victim.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(files.shutil, "rmtree", crash_half_way)
    with pytest.raises(KeyboardInterrupt):
        ck.rotate(ckpt_dir, keep_last=1)
    monkeypatch.undo()
    names = sorted(p.name for p in ckpt_dir.iterdir())
    assert names[0].startswith(".checkpoint-4.trash-") and names[1:] == ["checkpoint-8"]
    infos, staging = ck.scan(ckpt_dir)
    assert [i.path.name for i in infos] == ["checkpoint-8"] and staging == []
    assert ck.latest_complete(ckpt_dir).path.name == "checkpoint-8"
    assert [p.name for p in ck.clean_leftovers(ckpt_dir)] == [names[0]]
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["checkpoint-8"]


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from trainfit import files
    from trainfit.config.run_config import load_run_config
    from trainfit.train.runner import run_training

    real_rmtree = files.shutil.rmtree

    def rmtree_then_die(path, *a, **kw):
        path = Path(path)
        if ".trash-" in path.name:  # rotation deleting a checkpoint: delete half of it, then kill -9
            for f in sorted(path.iterdir())[::2]:
                f.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rmtree(path, *a, **kw)

    files.shutil.rmtree = rmtree_then_die
    run_training(load_run_config(sys.argv[1]), sys.argv[2], quiet=True)
""")


@pytest.mark.slow
def test_kill_9_during_rotation_then_exact_resume(stopped, tmp_path):
    _, _, full = stopped
    config = make_config(tmp_path, "pretrain", checkpointing={"every_steps": 4, "keep_last": 1})
    run_dir = tmp_path / "run"
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(config), str(run_dir)], capture_output=True, text=True,
                          timeout=300, cwd=str(REPO))
    assert proc.returncode == -9, proc.stderr[-2000:]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names[0].startswith(".checkpoint-4.trash-") and names[1:] == ["checkpoint-8"]  # killed mid-delete
    messages = []
    resumed = run_training(load_run_config(config), run_dir, resume=True, quiet=True, log=messages.append)
    assert resumed.resumed_from.endswith("checkpoint-8")
    assert not any("trash" in m for m in messages)  # never reported as a checkpoint
    assert loss_trajectory(run_dir) == full
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-12"]


# ---------------------------------------------------------------------------------------------
# 2. damaged checkpoints
def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":  # as by a full disk
        path.write_bytes(data[: max(1, len(data) // 3)])
    else:  # garbage of the same size
        path.write_bytes(os.urandom(len(data)))


KINDS = ["trainer_state.json", "optimizer.pt", "model.safetensors", "rng_state.pth", "scheduler.pt"]


@pytest.mark.parametrize("how", ["truncated", "garbage"])
@pytest.mark.parametrize("name", KINDS)
def test_damaged_file_behind_the_manifest_exit_2_untouched(stopped, tmp_path, capfd, name, how):
    """The file was damaged and the manifest written again over it (so sizes and hashes agree):
    refused before anything starts, naming the checkpoint, the file and the earlier checkpoint."""
    config = stopped[0]
    run_dir = _copy(stopped, tmp_path)
    ckpt = run_dir / "checkpoints" / "checkpoint-8"
    _damage(ckpt / name, how)
    ck.seal(ckpt)
    assert ck.inspect_checkpoint(ckpt).complete
    before = tree_digest(run_dir)
    code = main(["train", str(config), "--out", str(run_dir), "--resume", "--quiet"])
    err = capfd.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert "checkpoint-8 cannot be loaded" in err and name in err
    assert "checkpoint-4" in err and "another --out" in err  # what to do instead
    assert tree_digest(run_dir) == before
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(p.name for p in stopped[1].iterdir())


@pytest.mark.parametrize("name", KINDS)
def test_damaged_file_caught_by_manifest_only_checkpoint_exit_2(stopped, tmp_path, capfd, name):
    config = stopped[0]
    run_dir = _copy(stopped, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / "checkpoint-8")
    _damage(run_dir / "checkpoints" / "checkpoint-4" / name, "truncated")
    before = tree_digest(run_dir)
    code = main(["train", str(config), "--out", str(run_dir), "--resume", "--quiet"])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "checkpoint-4" in err and name in err and "another --out" in err
    assert tree_digest(run_dir) == before


@pytest.mark.parametrize("name,what", [("rng_state.pth", "rng_state.pth"), ("optimizer.pt", "optimizer.pt"),
                                       ("model.safetensors", "model weights")])
def test_load_failure_inside_the_trainer_is_exit_2_untouched(stopped, tmp_path, capfd, monkeypatch, name, what):
    """The backstop: a checkpoint that passes the checks but fails in the Trainer's loader."""
    config = stopped[0]
    run_dir = _copy(stopped, tmp_path)
    ckpt = run_dir / "checkpoints" / "checkpoint-8"
    _damage(ckpt / name, "truncated")
    ck.seal(ckpt)
    monkeypatch.setattr(ck, "check_loadable", lambda path: None)
    before = tree_digest(run_dir)
    code = main(["train", str(config), "--out", str(run_dir), "--resume", "--quiet"])
    err = capfd.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and "cannot load" in err and what in err and "checkpoint-8" in err
    assert "checkpoint-4" in err
    assert tree_digest(run_dir) == before  # metrics.jsonl not trimmed: nothing changed
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(p.name for p in stopped[1].iterdir())


@pytest.mark.parametrize("manifest", [
    {"version": 1, "files": [{}]},
    {"version": 1, "files": "model.safetensors"},
    {"version": 1, "files": [{"file": "../x", "bytes": 1, "sha256": "0" * 64}]},
    {"version": 1, "files": [{"file": "a.bin", "bytes": "3", "sha256": "0" * 64}]},
    {"version": 1, "files": []},
    ["not", "an", "object"],
])
def test_malformed_manifest_is_incomplete_not_a_crash(tmp_path, manifest):
    ckpt = tmp_path / "checkpoint-3"
    ckpt.mkdir()
    (ckpt / "a.bin").write_bytes(b"abc")
    (ckpt / ck.MANIFEST).write_text(json.dumps(manifest))
    info = ck.inspect_checkpoint(ckpt)
    assert not info.complete and "manifest" in info.problem


# ---------------------------------------------------------------------------------------------
# 3. a failed start leaves no run directory behind
def test_failed_start_removes_the_run_dir_so_a_retry_works(tmp_path, capfd):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps({"question": "q", "good": "a", "bad": "b"}) for _ in range(8)) + "\n")
    bad = make_config(tmp_path, "dpo", name="bad.yaml", data={"paths": [str(data)]})
    run_dir = tmp_path / "runs" / "deep" / "run"
    code = main(["train", str(bad), "--out", str(run_dir), "--quiet"])
    err = capfd.readouterr().err
    assert code == 2 and "'prompt' (data.prompt_column)" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # the run dir and the parents this attempt created
    good = make_config(tmp_path, "pretrain", name="good.yaml")
    assert main(["train", str(good), "--out", str(run_dir), "--quiet", "--max-steps", "1"]) == 0
    assert (run_dir / "checkpoints" / "checkpoint-1").is_dir()


def test_failed_start_in_an_existing_dir_removes_only_what_it_created(tmp_path, monkeypatch):
    from trainfit.train import runner

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")

    def boom(*a, **kw):
        raise RuntimeError("set-up failed")

    monkeypatch.setattr(runner, "make_model", boom)
    cfg = load_run_config(make_config(tmp_path, "pretrain"))
    with pytest.raises(RuntimeError, match="set-up failed"):
        run_training(cfg, run_dir, quiet=True)
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"]


def test_failure_after_a_checkpoint_keeps_the_run(tmp_path):
    from transformers import TrainerCallback

    class Crash(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 6:
                raise RuntimeError("crash at step 6")

    cfg = load_run_config(make_config(tmp_path, "pretrain"))
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="crash at step 6"):
        run_training(cfg, run_dir, quiet=True, extra_callbacks=[Crash()])
    assert (run_dir / "checkpoints" / "checkpoint-4").is_dir() and (run_dir / "config.sha256").is_file()


# ---------------------------------------------------------------------------------------------
# 4. small things
def _progress_state(max_steps, global_step):
    from transformers import TrainerState

    return TrainerState(max_steps=max_steps, global_step=global_step)


def test_progress_bar_counts_to_max_steps(capsys):
    from transformers import TrainerControl

    from trainfit.train.callbacks import MetricsWriter, Progress, StepTimer

    writer = MetricsWriter(None, lambda: 0, StepTimer(), 1)
    for stop, total, label in ((5, 5, "pretrain (to step 5 of 12)"), (None, 12, "pretrain"), (40, 12, "pretrain")):
        bar = Progress("bar", "pretrain", writer, stop_step=stop)
        bar.on_train_begin(None, _progress_state(12, 2), TrainerControl())
        task = bar._bar.tasks[0]
        assert (task.total, task.completed, task.description) == (total, 2, label)
        bar.on_train_end(None, _progress_state(12, 2), TrainerControl())
    lines = Progress("lines", "pretrain", writer, stop_step=5)
    lines._last_line = time.perf_counter()  # a line was just printed: only the last step gets one now
    lines.on_log(None, _progress_state(12, 4), TrainerControl(), logs={"loss": 1.0})
    lines.on_log(None, _progress_state(12, 5), TrainerControl(), logs={"loss": 0.5})
    err = capsys.readouterr().err
    assert "step 4/12" not in err and "step 5/12 loss 0.5000" in err


def test_tied_lm_head_is_not_reported_missing_other_keys_are(tmp_path):
    from trainfit.train.model_build import build_model
    from trainfit.train.trainer_ext import expected_missing_removed

    class Tok:
        bos_token_id = eos_token_id = pad_token_id = 0

        def __len__(self):
            return 256

    def model(tie: bool):
        shape = {"layers": 1, "hidden": 32, "heads": 2, "tie_embeddings": tie}
        cfg = load_run_config(make_config(tmp_path, "pretrain", name=f"tie{tie}.yaml",
                                          model={"shape": shape, "weights": "random"}))
        return build_model(cfg, Tok()).model

    tied = model(True)
    assert expected_missing_removed(tied, ["lm_head.weight"]) == []
    assert expected_missing_removed(tied, ["lm_head.weight", "model.norm.weight"]) == ["model.norm.weight"]
    # both halves of the tie missing: nothing was loaded for it, so it is reported
    both = ["lm_head.weight", "model.embed_tokens.weight"]
    assert expected_missing_removed(tied, both) == both
    assert expected_missing_removed(model(False), ["lm_head.weight"]) == ["lm_head.weight"]


def test_resumed_tied_model_prints_no_missing_keys(stopped, tmp_path, capfd):
    config = stopped[0]
    run_dir = _copy(stopped, tmp_path)
    messages = []
    run_training(load_run_config(config), run_dir, resume=True, quiet=True, stop_after=9, log=messages.append)
    err = capfd.readouterr().err
    assert "missing keys" not in err and not any("missing" in m for m in messages)


def test_quiet_libraries_filters_library_warnings_only(monkeypatch):
    from trainfit.train.environment import quiet_libraries

    monkeypatch.setattr(sys, "warnoptions", [])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_libraries():
            for module in ("transformers.modeling_utils", "torch.nn.modules", "peft.tuners", "trl.trainer"):
                warnings.warn_explicit("deprecated", FutureWarning, "lib.py", 1, module=module)
            warnings.warn_explicit("noise", UserWarning, "lib.py", 2, module="accelerate.utils")
            warnings.warn_explicit("ours", UserWarning, "tf.py", 3, module="trainfit.train.runner")
            warnings.warn_explicit("other", FutureWarning, "x.py", 4, module="torchvision_like_but_not")
        warnings.warn_explicit("after", FutureWarning, "lib.py", 5, module="transformers.x")
    assert [str(w.message) for w in seen] == ["ours", "other", "after"]


@pytest.mark.slow
def test_train_output_has_no_library_warnings(tmp_path):
    """A LoRA run (PEFT triggers Transformers' `is_gradient_checkpointing` FutureWarning)."""
    cfg = make_config(tmp_path, "lora", training={"lora": {"rank": 4, "alpha": 8, "dropout": 0.0,
                                                           "target_modules": ["q_proj", "v_proj"]}})
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TRANSFORMERS_VERBOSITY")}
    proc = subprocess.run([sys.executable, "-m", "trainfit.cli.main", "train", str(cfg), "--out",
                           str(tmp_path / "run"), "--max-steps", "2", "--quiet"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FutureWarning" not in proc.stderr and "DeprecationWarning" not in proc.stderr
    assert "UserWarning" not in proc.stderr and "warnings.warn" not in proc.stderr
    assert "weights: RANDOM initialisation" in proc.stderr and "done: step 2/12" in proc.stderr
