"""`trainfit report` on runs that have no summary.json: a `trainfit train` killed (SIGKILL) at a
random step, compared with the plan it wrote when it started; and a training monitored from
Python (MonitorCallback / monitor_training), whose folder holds only metrics.jsonl."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainfit.cli.main import main

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from train.conftest import make_config  # noqa: E402

pytest.importorskip("matplotlib")


def report_json(capsys, run_dir: Path) -> dict:
    capsys.readouterr()
    code = main(["report", str(run_dir), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)["summary"]


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the line being written
        if "event" not in rec and "loss" in rec:
            out.append(rec["step"])
    return out


def test_a_run_killed_at_a_random_step_is_compared_with_its_plan(tmp_path, capsys):
    kill_after = random.Random(34).randint(2, 8)
    config = make_config(tmp_path, "pretrain", schedule={"max_steps": 60})
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "train", str(config), "--out", str(run_dir), "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not any(s >= kill_after for s in logged_steps(run_dir)):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run did not reach its step in time"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run_dir / "summary.json").exists()
    summary = report_json(capsys, run_dir)
    assert summary["finished"] is False
    plan = summary["planned"]
    assert plan["max_steps"] == 60 and plan["source"] == "run_plan event"
    assert plan["step_seconds"] > 0 and math.isclose(plan["seconds"], 60 * plan["step_seconds"])
    mem = summary["memory"]
    assert mem["predicted_total_bytes"] > 0 and mem["measured_peak_bytes"] > 0
    assert mem["measured_over_predicted_total"] == pytest.approx(
        mem["measured_peak_bytes"] / mem["predicted_total_bytes"])
    assert summary["steps"]["last"] >= kill_after
    assert summary["method"] == "pretrain" and summary["device"] == "cpu"
    from trainfit.report.html_page import summary_rows

    rows = dict(summary_rows(summary))
    assert rows["planned length"].startswith("60 steps") and "unavailable" not in rows["peak memory, predicted"]


def test_a_loop_monitored_with_monitor_training_is_reportable(tmp_path, capsys):
    from trainfit.hardware.sample_fakes import FakeSampler
    from trainfit.train.monitor.callback import monitor_training

    run_dir = tmp_path / "loop"
    run_dir.mkdir()
    sampler = FakeSampler(host={"ram_used_bytes": 8 << 30, "ram_total_bytes": 16 << 30, "cpu_temperature_c": 60.0})
    with monitor_training(run_dir / "metrics.jsonl", total_steps=20, interval_seconds=0.02, sampler=sampler,
                          say=None) as mon:
        for step in range(1, 21):
            time.sleep(0.01)
            mon.step(loss=5.0 - step * 0.1 if step != 7 else float("nan"), tokens=256, samples=4)
    summary = report_json(capsys, run_dir)
    assert summary["steps"]["logged"] == 20 and summary["steps"]["last"] == 20
    assert summary["loss"]["first"] == pytest.approx(4.9) and summary["loss"]["min"] == pytest.approx(3.0)
    assert summary["loss"]["non_finite_steps"] == 1
    assert summary["samples"] > 0 and summary["memory"]["measured_peak_bytes"] > 0
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "event" not in r]
    assert [r["step"] for r in steps] == list(range(1, 21))
    assert steps[-1]["eta_seconds"] == 0 and steps[5]["eta_seconds"] > 0


def test_a_trainer_with_monitor_callback_is_reportable_and_says_what_it_does_not_protect(tmp_path, capsys):
    import torch
    from transformers import Trainer, TrainingArguments

    from trainfit.train.monitor.callback import PROTECTION_NOTE, MonitorCallback
    from trainfit.train.monitor.run_policies import NonFiniteGuard

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, y):
            return {"loss": ((self.lin(x).squeeze(-1) - y) ** 2).mean()}

    data = [{"x": torch.randn(4), "y": torch.randn(())} for _ in range(32)]
    run_dir = tmp_path / "hf"
    said: list[str] = []
    args = TrainingArguments(output_dir=str(run_dir / "out"), max_steps=8, per_device_train_batch_size=4,
                             logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data,
                      callbacks=[MonitorCallback(run_dir / "metrics.jsonl", interval_seconds=0.05, say=said.append),
                                 NonFiniteGuard(log=said.append)])
    trainer.train()
    assert said[0] == PROTECTION_NOTE and "need `trainfit train`" in PROTECTION_NOTE
    summary = report_json(capsys, run_dir)
    assert summary["steps"]["logged"] == 8 and summary["loss"]["first"] is not None
