"""`--verify` / `trainfit verify`: measured vs predicted memory and time, stored as calibration."""

from __future__ import annotations

import json

import pytest

from trainfit.cli.main import main
from trainfit.train import calibration as cal

from .conftest import make_config


def test_verify_command_reports_and_calibrates(tmp_path, capsys, calib_home):
    cfg = make_config(tmp_path, "pretrain")
    assert main(["verify", str(cfg), "--steps", "3", "--warmup", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["measured_tensor_peak_bytes"] > 0 and report["measured_step_seconds"] > 0
    assert report["measured_peak_rss_bytes"] > report["measured_tensor_peak_bytes"]
    assert report["framework"]["own_run"] and "with the installed" in report["framework"]["describes"]
    if report["predicted_tensor_peak_bytes"] is None:
        assert "tensor_peak_bytes" in report["unavailable"]  # the reason, never a silent gap
    else:
        # The tensor counter measures what the memory model predicts; they agree within 2x.
        assert 0.5 < report["memory_ratio"] < 2.0
        stored = cal.load_calibration(report["fingerprint"], calib_home / "trainfit" / "calibration.json")
        assert stored is not None and stored.devices["cpu"].memory_factor == pytest.approx(report["memory_ratio"])


@pytest.mark.slow
def test_train_with_verify_saves_verify_json(tmp_path, capsys, calib_home):
    cfg = make_config(tmp_path, "pretrain", schedule={"max_steps": 3})
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run_dir), "--verify", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "tensor peak   measured" in err and "step time     measured" in err
    verify = json.loads((run_dir / "verify.json").read_text())
    assert verify["measured_step_seconds"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["predicted"]) >= {"tensor_peak_bytes", "total_bytes", "step_seconds", "unavailable"}


def test_apply_calibration_is_pure(tmp_path):
    path = tmp_path / "c.json"
    assert cal.load_calibration("m1", path) is None
    for ratio in (1.2, 1.1, 5.0):  # one outlier: the median ignores it
        cal.record_sample("m1", "cpu", {"memory_ratio": ratio, "step_time_ratio": 2.0}, path)
    c = cal.load_calibration("m1", path)
    assert c.devices["cpu"].memory_factor == pytest.approx(1.2)
    assert c.devices["cpu"].step_time_factor == pytest.approx(2.0)
    assert "cuda:x" not in c.devices
