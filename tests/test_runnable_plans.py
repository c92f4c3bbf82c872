"""A plan you can run as written (issue 33, items 7 and 9): the device a run config names exists,
a run that needs the Hub fails fast offline, `verify` names the extra it needs, `analyze` takes
the flags its advice names, `cloud`'s table keeps its key columns and whole flavor ids at 80
columns, and a pretraining plan describes the model its exported run trains."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainfit.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _config(tmp_path: Path, **sections) -> Path:
    cfg = {"version": 1, "method": "pretrain", "model": {"shape": {"layers": 1, "hidden": 64, "heads": 4}},
           "data": {"paths": ["builtin:tiny-corpus"], "max_samples": 200},
           "tokenizer": {"vocab_size": 300, "train_max_bytes": 50_000},
           "training": {"precision": "fp32", "micro_batch": 2, "seq_len": 32},
           "schedule": {"max_steps": 2, "lr": 1e-3}}
    cfg.update(sections)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# ---------------------------------------------------------------- device: mps
def test_device_mps_without_an_apple_gpu_is_refused_like_cuda(capsys, tmp_path):
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("this machine has an Apple GPU")
    config = _config(tmp_path, training={"precision": "fp32", "micro_batch": 2, "seq_len": 32, "device": "mps"})
    code, _, err = run_cli(capsys, "train", str(config), "--out", str(tmp_path / "run"))
    assert code == 4, err
    assert "training.device: mps asked, but torch sees no Apple GPU" in err
    assert not (tmp_path / "run" / "summary.json").exists()


# ---------------------------------------------------------------- the Hub, offline
def test_a_hub_model_offline_is_not_asked_for_again_and_again(capsys, tmp_path, monkeypatch):
    """No HF_HUB_OFFLINE, and the Hub's host refuses connections: one quick probe, then the cache
    only (the Hub client would retry each file five times with back-off, about a minute)."""
    import transformers

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)  # read as huggingface_hub reads it
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port: never the real Hub
    asked: list[bool] = []

    def from_pretrained(name, *args, local_files_only=False, **kwargs):
        asked.append(local_files_only)
        raise OSError(f"{name} is not in the cache")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    config = _config(tmp_path, method="lora", model={"id": "Qwen/Qwen2.5-0.5B-Instruct", "weights": "hub"},
                     data={"paths": ["builtin:tiny-chat"], "format": "chat"}, tokenizer={})
    started = time.perf_counter()
    code, _, err = run_cli(capsys, "train", str(config), "--out", str(tmp_path / "run"))
    assert code == 4, err
    assert asked == [True]  # the cache only, once
    assert "127.0.0.1:9 cannot be reached" in err and "HF_HUB_OFFLINE=1" in err
    assert time.perf_counter() - started < 20


@pytest.mark.slow
def test_an_offline_pipeline_run_fails_within_seconds_without_retries(tmp_path):
    """The real Hub client, in a fresh process with no offline setting: no 'Retrying'."""
    config = _config(tmp_path, method="lora", model={"id": "Qwen/Qwen2.5-0.5B-Instruct", "weights": "hub"},
                     data={"paths": ["builtin:tiny-chat"], "format": "chat"}, tokenizer={})
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(REPO / "src"))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainfit", "train", str(config), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 4, done.stderr
    assert "Retry" not in done.stderr and "Traceback" not in done.stderr
    assert time.perf_counter() - started < 45  # start-up; the retries alone took about 46 s


# ---------------------------------------------------------------- verify on a core-only install
_CORE_ONLY = """
import importlib.abc, importlib.util, sys
EXTRAS = {"torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "matplotlib",
          "deepspeed", "bitsandbytes"}
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
real_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: (
    None if name.split(".")[0] in EXTRAS else real_find_spec(name, package))
from trainfit.cli.main import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["verify", "train"])
def test_verify_on_a_core_only_install_names_the_extra_as_train_does(tmp_path, command):
    config = _config(tmp_path)
    extra = ["--out", str(tmp_path / "run")] if command == "train" else []
    done = subprocess.run([sys.executable, "-c", _CORE_ONLY, command, str(config), *extra], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr
    assert "pip install 'trainfit[train]'" in done.stderr


# ---------------------------------------------------------------- analyze takes what its advice names
def test_analyze_takes_the_workload_flags_its_advice_names(capsys):
    code, out, err = run_cli(capsys, "analyze", "--hardware", "rtx-4090", "--model", "llama-3.2-1b",
                             "--method", "lora")
    assert code == 0, err
    advised = set(re.findall(r"give ((?:--[a-z-]+(?:, | or )?)+)", out))
    flags = {f for group in advised for f in re.findall(r"--[a-z-]+", group)}
    assert "--examples" in flags
    code, help_text, _ = run_cli(capsys, "analyze", "--help")
    assert all(f in help_text for f in flags), flags
    code, out, err = run_cli(capsys, "analyze", "--hardware", "rtx-4090", "--model", "llama-3.2-1b",
                             "--method", "lora", "--examples", "10000", "--json")
    assert code == 0, err
    modes = json.loads(out)["plan"]["modes"]
    assert modes and all("give --examples" not in json.dumps(m) for m in modes)


# ---------------------------------------------------------------- cloud's table at 80 columns
@pytest.mark.parametrize("extra", [[], ["--spot"]])
def test_cloud_table_at_80_columns_keeps_hours_cost_class_and_whole_flavor_ids(capsys, monkeypatch, extra):
    argv = ["cloud", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "full", "--examples", "10000", "--seq-len", "1024",
            "--top", "0", *extra]
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    ids = [r["flavor"] for r in json.loads(out)["results"]]
    assert max(map(len, ids)) > 18  # the ids the old table cut ('Standard_NC24ads_A100_v4')
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("flavor"))
    for column in ("hours", "cost", "spot: M ckpt +" if extra else "class"):
        assert column in header
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    first_words = {line.split()[0] for line in lines if line.strip()}
    assert set(ids) <= first_words, sorted(set(ids) - first_words)[:5]  # every id whole, pastable
    assert "…" not in "".join(line.split()[0] for line in lines if line.strip())


# ---------------------------------------------------------------- the pretraining model planned is the one trained
def test_training_a_pretraining_plan_trains_the_model_planned(capsys, tmp_path):
    """shape:1m is planned at 32,000 tokens of vocabulary; the shipped corpus gives its BPE only
    about 850: the run keeps the planned embedding (the model that runs is the one planned) and
    says what the corpus gave and how to get the smaller model instead."""
    from trainfit.core.models.catalog import resolve_model
    from trainfit.core.models.params import count_params

    out = tmp_path / "plan"
    code, _, err = run_cli(capsys, "plan", "shape:1m", "--method", "pretrain", "--hardware", "cpu", "--mode",
                           "balanced", "--out", str(out))
    assert code == 0, err
    config = out / "balanced" / "run.yaml"
    cfg = yaml.safe_load(config.read_text())
    planned_vocab = cfg["tokenizer"]["vocab_size"]
    assert planned_vocab == 32000
    # Only the run's length and batch are cut down, to train in seconds; the model is as written.
    cfg["training"].update(micro_batch=1, grad_accum=1, seq_len=64)
    cfg["schedule"] = {"max_steps": 1, "lr": 1e-3}
    cfg["data"]["max_samples"] = 300
    config.write_text(yaml.safe_dump(cfg))
    code, _, err = run_cli(capsys, "train", str(config), "--out", str(tmp_path / "run"))
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["params_total"] == count_params(resolve_model("shape:1m")).total == 2_113_728
    got = int(re.search(r"the corpus gave the byte-level BPE ([\d,]+) of the 32,000 tokens", err).group(1)
              .replace(",", ""))
    assert got < planned_vocab and f"--vocab {got}" in err and f"tokenizer.vocab_size: {got}" in err
    assert "the corpus gave" in summary["tokenizer"]
