"""launch_command and launch.sh: the forms the launchers parse, run from any directory."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.export.launch import launch_command

from .conftest import HEADER, make_cfg, write_bundle


def test_one_process_runs_trainfit_directly():
    assert launch_command("run.yaml", out_dir="runs/a b", num_processes=1, strategy="single") == \
        "trainfit train run.yaml --out 'runs/a b'"


def test_torchrun_form_parses_like_the_tests_launch_it():
    from torch.distributed.run import get_args_parser

    cmd = launch_command("run.yaml", out_dir="runs/x", num_processes=3, strategy="ddp")
    words = shlex.split(cmd)
    assert words[0] == "torchrun"
    args = get_args_parser().parse_args(words[1:])
    assert args.standalone and args.nproc_per_node == "3" and args.module
    assert args.training_script == "trainfit" and args.training_script_args == ["train", "run.yaml", "--out", "runs/x"]


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_sharding_engines_use_a_launcher_even_for_one_process(strategy):
    cmd = launch_command("run.yaml", out_dir="o", num_processes=1, strategy=strategy)
    assert cmd.startswith("torchrun --standalone --nproc-per-node 1 -m trainfit train")


def test_accelerate_form_parses():
    pytest.importorskip("accelerate")
    from accelerate.commands.launch import launch_command_parser

    cmd = launch_command("run.yaml", out_dir="o", num_processes=2, strategy="ddp", accelerate_file="accelerate.yaml")
    words = shlex.split(cmd)
    assert words[:2] == ["accelerate", "launch"]
    args = launch_command_parser().parse_args(words[2:])
    assert args.config_file == "accelerate.yaml" and args.module and args.training_script == "trainfit"
    assert args.training_script_args == ["train", "run.yaml", "--out", "o"]


def test_bad_arguments():
    with pytest.raises(ValueError):
        launch_command("r.yaml", out_dir="o", num_processes=1, strategy="zero3")
    with pytest.raises(ValueError):
        launch_command("r.yaml", out_dir="o", num_processes=0, strategy="single")


def test_python_m_trainfit_works():
    proc = subprocess.run([sys.executable, "-m", "trainfit", "train", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "--out" in proc.stdout


@pytest.mark.parametrize("procs,device,first", [(1, "cpu", "trainfit"), (2, "cpu", "torchrun"),
                                                (2, "cuda", "accelerate")])
def test_launch_sh_runs_in_its_folder(tmp_path, procs, device, first):
    """launch.sh with stand-ins for the launchers on PATH: it runs in its own folder, passes its
    arguments on, and stops on the first error (set -euo pipefail)."""
    out = write_bundle(tmp_path / "bundle", make_cfg("pretrain"), num_processes=procs, device=device)
    script = out / "launch.sh"
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n" + "".join(f"# {h}\n" for h in HEADER))
    assert "set -euo pipefail\n" in text and os.access(script, os.X_OK)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / first
    stub.write_text('#!/usr/bin/env bash\necho "$PWD"\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([str(script), "--resume"], cwd=elsewhere, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert Path(lines[0]).resolve() == out.resolve()
    assert lines[-5:] == ["train", "run.yaml", "--out", "runs/tiny-run", "--resume"]
