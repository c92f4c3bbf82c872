"""Each bad input a user reported (the hardening issue's list) is refused with exit 2, a message
that names the flag, key or file and what is valid, no traceback and nothing left behind."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainfit.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = exc.code
    return code, capsys.readouterr().err


@pytest.fixture()
def binary_file(tmp_path) -> Path:
    p = tmp_path / "blob.yaml"
    p.write_bytes(bytes(range(256)) * 8)
    return p


def _llama_dir(tmp_path: Path, **overrides) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "intermediate_size": 128, "vocab_size": 256, **overrides}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _safetensors(header: dict, data_bytes: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes


@pytest.mark.parametrize("argv, needle", [
    (["models", "show", "shape:99999999999999999t"], "from 1m to 10t"),
    (["estimate", "--params", "1e999"], "not understood"),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--gpus", "0"], "--gpus: must be an integer from 1"),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--gpus", "3"], "the hardware has 1 GPU"),
    (["estimate", "llama-3.2-1b", "--hardware", ""], "--hardware: empty"),
    (["estimate", "llama-3.2-1b", "--hardware", "-3x rtx-4090"], "GPU count must be 1..16"),
    (["cloud", "llama-3.2-1b", "--examples", "1000", "--top", "-1"], "--top: must be an integer from 0"),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--lora-dropout", "2"], "--lora-dropout: must be a number"),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--lora-dropout", "0.1"], "not --method full"),
    (["estimate", "--layers", "2", "--hidden", "1000", "--heads", "7"], "multiple of 'heads'"),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--seq-len", "nan"], "--seq-len: must be an integer"),
    (["plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--epochs", "inf"], "--epochs: must be a number"),
    (["plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--out", ""], "--out: empty path"),
    (["profile", "--quick", "--out", ""], "--out: empty path"),
    (["train", str(EXAMPLES / "pretrain.yaml"), "--out", ""], "--out: empty path"),
    (["train", str(EXAMPLES / "pretrain.yaml"), "--max-steps", "0"], "--max-steps: must be an integer from 1"),
    (["profile", "--quick", "--out", "/proc/version"], "cannot write in /proc"),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--seq-len", "١٢"], "ASCII digits"),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--method", "lora", "--lora-targets", ","], "names no module"),
    (["plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--data", ""], "--data: empty path"),
    (["plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--data", "/no/such/data"], "does not exist"),
])
def test_flag_values_out_of_range(capsys, argv, needle):
    code, err = run_cli(capsys, *argv)
    assert code == 2, err
    assert needle in err and "Traceback" not in err


def test_profile_out_to_a_directory(capsys, tmp_path):
    code, err = run_cli(capsys, "profile", "--quick", "--out", str(tmp_path))
    assert code == 2 and "is a directory; give a file name inside it" in err
    assert list(tmp_path.iterdir()) == []


def test_binary_files_are_refused_as_inputs(capsys, binary_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (["cloud", "llama-3.2-1b", "--examples", "1000", "--prices", str(binary_file)],
                 ["train", str(binary_file)], ["verify", str(binary_file)],
                 ["estimate", "llama-3.2-1b", "--hardware", str(binary_file)]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and "is a binary file, not text" in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.yaml"]


def test_a_directory_as_run_config_says_so(capsys, tmp_path):
    code, err = run_cli(capsys, "train", str(tmp_path))
    assert code == 2 and "is a directory, not a file" in err


@pytest.mark.parametrize("key, value, needle", [
    ("lr", float("nan"), "schedule.lr: must be a number greater than 0"),
    ("lr", float("inf"), "schedule.lr: must be a number greater than 0"),
    ("max_steps", 99999999999999999999999, "schedule.max_steps: must be an integer from 1 to 1,000,000,000"),
    ("warmup_steps", -3, "schedule.warmup_steps: must be an integer from 0"),
])
def test_run_config_numbers_are_bounded_and_leave_no_run_dir(capsys, tmp_path, key, value, needle):
    cfg = yaml.safe_load((EXAMPLES / "pretrain.yaml").read_text())
    cfg["schedule"][key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    started = time.perf_counter()
    code, err = run_cli(capsys, "train", str(path), "--out", str(tmp_path / "run"))
    assert code == 2 and needle in err, err
    assert time.perf_counter() - started < 5  # refused before torch is imported or a step runs
    assert not (tmp_path / "run").exists()


def test_model_config_with_heads_that_do_not_divide_the_width(capsys, tmp_path):
    d = _llama_dir(tmp_path, hidden_size=1000, num_attention_heads=7)
    code, err = run_cli(capsys, "models", "show", str(d))
    assert code == 2 and "not a multiple of the 7 attention heads" in err


def test_model_config_claiming_absurd_parameter_count(capsys, tmp_path):
    d = _llama_dir(tmp_path, hidden_size=1 << 20, num_hidden_layers=100_000, intermediate_size=1 << 22,
                   num_attention_heads=1 << 10)
    code, err = run_cli(capsys, "models", "show", str(d))
    assert code == 2 and "any real model has" in err


def test_safetensors_header_with_bad_shape(capsys, tmp_path):
    d = _llama_dir(tmp_path)
    (d / "model.safetensors").write_bytes(_safetensors({"w": {"dtype": "F32", "shape": ["64", 2],
                                                              "data_offsets": [0, 0]}}, 0))
    code, err = run_cli(capsys, "models", "show", str(d))
    assert code == 2 and "'shape' must be a list of non-negative integers" in err


def test_truncated_safetensors_file(capsys, tmp_path):
    d = _llama_dir(tmp_path)
    (d / "model.safetensors").write_bytes(_safetensors({"w": {"dtype": "F32", "shape": [64, 64],
                                                              "data_offsets": [0, 64 * 64 * 4]}}, 100))
    code, err = run_cli(capsys, "models", "show", str(d))
    assert code == 2 and "truncated" in err and "fetch the file again" in err


def test_weight_map_outside_the_model_directory_is_refused_without_echoing_it(capsys, tmp_path):
    d = _llama_dir(tmp_path)
    secret = tmp_path / "secret.safetensors"
    secret.write_text("TOP-SECRET-CONTENT")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../secret.safetensors"}}))
    code, err = run_cli(capsys, "models", "show", str(d))
    assert code == 2 and "is not a file name inside the model directory" in err
    assert "TOP-SECRET" not in err


def test_verify_refuses_a_missing_config_before_importing_torch(tmp_path):
    probe = ("import sys\nfrom trainfit.cli.main import main\n"
             f"code = main(['verify', {str(tmp_path / 'missing.yaml')!r}])\n"
             "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "does not exist" in done.stderr


@pytest.fixture()
def tiny_config(tmp_path) -> Path:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "version": 1, "name": "tiny", "method": "pretrain",
        "model": {"shape": {"layers": 1, "hidden": 32, "heads": 2}}, "tokenizer": {"vocab_size": 300},
        "data": {"paths": ["builtin:tiny-corpus"]}, "training": {"precision": "fp32", "micro_batch": 2, "seq_len": 32},
        "schedule": {"max_steps": 2, "lr": 1e-3}, "checkpointing": {"every_steps": 1}}))
    return config


def test_resuming_a_finished_run_trains_nothing(capsys, tmp_path, tiny_config):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", str(tiny_config), "--out", str(run), "--quiet")[0] == 0
    before = (run / "summary.json").read_text()
    code, err = run_cli(capsys, "train", str(tiny_config), "--out", str(run), "--resume", "--quiet")
    assert code == 0 and "already finished: step 2 of 2; nothing to train" in err
    assert (run / "summary.json").read_text() == before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-2"]


def test_damaged_run_tokenizer_names_itself_and_the_way_out(capsys, tmp_path, tiny_config):
    config = tiny_config
    run = tmp_path / "run"
    assert run_cli(capsys, "train", str(config), "--out", str(run), "--quiet", "--max-steps", "1")[0] == 0
    tok = run / "tokenizer" / "tokenizer.json"
    tok.write_text(tok.read_text()[: tok.stat().st_size // 2])
    code, err = run_cli(capsys, "train", str(config), "--out", str(run), "--resume", "--max-steps", "2")
    assert code == 2 and "Traceback" not in err
    assert "the tokenizer this run trained on its corpus" in err and "is damaged" in err and "another --out" in err
