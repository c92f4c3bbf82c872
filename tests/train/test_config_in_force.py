"""The config a run trains with changes only through train/in_force.InForce, and every change is a
`config_change` event in metrics.jsonl: the fields (old -> new), why, and what made it."""

from __future__ import annotations

import dataclasses
import json

from trainfit.cli.main import main
from trainfit.config.run_config import load_run_config
from trainfit.report.html_page import summary_rows
from trainfit.report.run_data import load_run
from trainfit.report.summary import summarize
from trainfit.train.recovery import faults
from trainfit.train.in_force import InForce, changed_fields

from .conftest import make_config


def _changes(run_dir):
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r.get("event") == "config_change"]


def test_changed_fields_name_each_leaf_that_differs(tmp_path):
    cfg = load_run_config(make_config(tmp_path, "pretrain"))
    new = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, micro_batch=2, grad_accum=2),
                              data=dataclasses.replace(cfg.data, num_workers=cfg.data.num_workers))
    assert changed_fields(cfg, new) == {"training.micro_batch": (4, 2), "training.grad_accum": (1, 2)}
    assert changed_fields(cfg, cfg) == {}


def test_changes_are_held_back_until_recording_starts(tmp_path):
    cfg = load_run_config(make_config(tmp_path, "pretrain"))
    in_force = InForce(cfg)
    smaller = dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, micro_batch=2, grad_accum=2))
    assert in_force.change(cfg, "nothing differs", source="test") is cfg and in_force.changes == []
    in_force.change(smaller, "split for the test", source="test", step=3)
    metrics = tmp_path / "metrics.jsonl"
    assert not metrics.exists()  # a start that fails before its first step writes nothing
    in_force.record_to(metrics)
    in_force.change(cfg, "back again", source="test", step=5)
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["reason"], r["step"], r["changes"]["training.micro_batch"]) for r in recs] == [
        ("split for the test", 3, {"from": 4, "to": 2}), ("back again", 5, {"from": 2, "to": 4})]
    assert in_force.user is cfg and in_force.cfg is cfg and len(in_force.changes) == 2


def test_trainfit_train_records_each_change_of_its_config_with_its_reason(tmp_path, monkeypatch):
    """`precision: auto` made concrete for the CPU at start, then an out-of-memory error in step 3
    splits the micro-batch: two config_change events, which `trainfit report` reads."""
    config = make_config(tmp_path, "pretrain", training={"precision": "auto", "micro_batch": 4, "seq_len": 32},
                         schedule={"max_steps": 4, "warmup_steps": 1}, checkpointing={"every_steps": 2})
    monkeypatch.setenv(faults.ENV, "oom@3:cuda")
    run_dir = tmp_path / "run"
    assert main(["train", str(config), "--out", str(run_dir), "--quiet"]) == 0
    device, oom = _changes(run_dir)

    assert device["source"] == "device" and device["step"] is None and "auto" in device["reason"]
    assert list(device["changes"]) == ["training.precision"]
    assert device["changes"]["training.precision"]["from"] == "auto"
    precision = device["changes"]["training.precision"]["to"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["training"]["precision"] == precision  # the run trained with what was recorded

    recovered = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if '"oom_recovered"' in x]
    assert oom["source"] == "oom_recovered" and oom["reason"] == recovered[0]["reason"]
    assert oom["step"] == 2  # it trains with the new split from the checkpoint of step 2 on
    assert oom["changes"] == {"training.micro_batch": {"from": 4, "to": 2}, "training.grad_accum": {"from": 1, "to": 2}}
    assert summary["training"]["micro_batch"] == 2 and summary["training"]["grad_accum"] == 2
    assert [c["source"] for c in summary["config_changes"]] == ["device", "oom_recovered"]
    assert summary["config_changes"][1]["changes"] == oom["changes"]

    # what `trainfit report` reads and counts (its plots left out: they add seconds, not checks)
    run = load_run(run_dir)
    assert [e.details["source"] for e in run.events if e.kind == "config_change"] == ["device", "oom_recovered"]
    shown = summarize(run)
    assert shown["events"]["config_change"] == 2
    assert shown["config_changes"][1]["fields"] == ["training.micro_batch: 4 -> 2", "training.grad_accum: 1 -> 2"]
    rows = [value for label, value in summary_rows(shown) if label == "config changed"]
    assert len(rows) == 2 and rows[1].startswith("training.micro_batch: 4 -> 2, training.grad_accum: 1 -> 2 from "
                                                  "step 2 (out of memory in step 3")
