"""Run configs and rendered bundles for the export tests (pure: no training, no network)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from trainfit.config.run_config import parse_run_config
from trainfit.export.bundle import render_files
from trainfit.export.publish import write_tree

DATA = {"pretrain": ["builtin:tiny-corpus"], "dpo": ["builtin:tiny-preferences"]}  # others: chat rows
HEADER = ["trainfit export test", "predicted peak: 1.0 GiB"]


def make_cfg(method: str = "pretrain", **sections):
    """A validated RunConfig; sections are merged over a tiny base config."""
    raw = {"version": 1, "method": method, "name": "tiny run",
           "model": {"shape": {"layers": 1, "hidden": 64, "heads": 4}},
           "data": {"paths": DATA.get(method, ["builtin:tiny-chat"])},
           "training": {"micro_batch": 2, "grad_accum": 3, "seq_len": 64},
           "schedule": {"max_steps": 7, "lr": 1.0e-3, "warmup_steps": 1, "seed": 5}}
    for key, values in sections.items():
        raw.setdefault(key, {}).update(values)
    return parse_run_config(raw, base_dir=Path.cwd())


def write_bundle(out: Path, cfg, *, num_processes: int = 1, device: str = "cpu", **kw) -> Path:
    files = render_files(cfg, header_lines=HEADER, num_processes=num_processes, device=device,
                         run_config_text="version: 1\n", **kw)
    write_tree(out, {"": files}, force=False)
    return out


def runnable_here(kwargs: dict) -> dict:
    """Trainer-config kwargs this test process can construct: the CPU, and no ddp_backend (a
    backend needs a launched process group)."""
    return {**{k: v for k, v in kwargs.items() if k != "ddp_backend"}, "use_cpu": True}


def load_args(path, *, drop: tuple[str, ...] = (), **overrides):
    """Construct the config class named in the file's header from the file's kwargs.

    drop: keys this test process cannot honour (ddp_backend needs a launched process group)."""
    text = path.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[:len(HEADER)] == [f"# {h}" for h in HEADER]
    qualified = next(w for line in header for w in line.split() if w.rstrip(",").count(".") == 1
                     and w.split(".")[0] in ("transformers", "trl"))
    module, name = qualified.rstrip(",").split(".")
    kwargs = yaml.safe_load(text)
    usable = {k: v for k, v in kwargs.items() if k not in drop}
    return name, kwargs, getattr(importlib.import_module(module), name)(**{**usable, **overrides})


@pytest.fixture
def bundle(tmp_path, monkeypatch):
    """Write a bundle into tmp_path/<name> and chdir there (the files name each other relatively)."""
    counter = iter(range(1000))

    def make(cfg, **kw) -> Path:
        out = write_bundle(tmp_path / f"bundle{next(counter)}", cfg, **kw)
        monkeypatch.chdir(out)
        return out

    return make
