"""Tiny run configs for the training tests (CPU, a few seconds each)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

BASE = {
    "version": 1,
    "model": {"shape": {"layers": 1, "hidden": 64, "heads": 4}, "weights": "random"},
    "tokenizer": {"vocab_size": 512, "train_max_bytes": 150_000},
    "training": {"precision": "fp32", "micro_batch": 4, "seq_len": 64},
    "schedule": {"max_steps": 12, "lr": 3.0e-3, "warmup_steps": 2, "seed": 7},
    "checkpointing": {"every_steps": 4, "keep_last": 2},
    "logging": {"every_steps": 1, "progress": "lines"},
}
DATA = {
    "pretrain": {"paths": ["builtin:tiny-corpus"], "max_samples": 600},
    "sft": {"paths": ["builtin:tiny-chat"], "format": "chat"},
    "lora": {"paths": ["builtin:tiny-chat"], "format": "chat"},
    "dpo": {"paths": ["builtin:tiny-preferences"]},
}


def make_config(tmp: Path, method: str = "pretrain", name: str = "run.yaml", **overrides) -> Path:
    """Write a tiny run config; overrides are section -> dict merged into BASE."""
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    cfg["method"] = method
    cfg["data"] = dict(DATA[method])
    for section, values in overrides.items():
        if isinstance(values, dict):
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def loss_trajectory(run_dir: Path) -> dict[int, float]:
    """step -> loss of every logged step in the run's metrics.jsonl."""
    import json

    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root (to prove nothing was touched)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def calib_home(tmp_path, monkeypatch):
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home

def run_torchrun(args: list[str], env: dict[str, str], nproc: int = 2, timeout_s: float = 240) -> tuple[int, str, str]:
    """Run torchrun in its own process group; on timeout kill the whole group (workers too),
    so that a hung collective cannot leave orphan processes behind."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"torchrun timed out after {timeout_s} s: {stderr[-3000:]}") from None
    return proc.returncode, stdout, stderr
