"""`trainfit plan --flavor ID [--spot]`: the flavor's GPUs and price, and on spot its interruption
figure in the plan's cost and in the exported run config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from trainfit.config.run_config import load_run_config

TRACE_HOURS = 431.17 / 202  # the shipped GPU spot trace (data/cloud.yaml)


def _plan(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", "plan", "Qwen/Qwen2.5-0.5B", "--method", "lora",
                           "--examples", "4000", "--mode", "balanced", *args],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "250"})


def test_plan_for_a_spot_flavor_writes_its_interruption_figure(tmp_path):
    done = _plan("--flavor", "n1-standard-8+t4", "--spot", "--json", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    mode = doc["modes"][0]
    run, spot = mode["run"], mode["run"]["spot"]
    assert "n1-standard-8+t4" in doc["hardware"]
    assert mode["setup"]["num_gpus"] == 1 and mode["setup"]["precision"] == "fp16"  # a T4: no bf16
    assert run["rental_usd"] == pytest.approx(run["hours"] * 0.18)  # the spot price
    assert run["rental_expected_usd"] == pytest.approx(spot["expected_hours"] * 0.18)
    assert run["rental_expected_usd"] > run["rental_usd"]
    assert spot["interruption_hours"] == pytest.approx(TRACE_HOURS) and spot["assumed"] is True
    assert any(r.startswith("spot: ") and "between interruptions" in r for r in mode["reasons"])

    cfg_path = tmp_path / "balanced" / "run.yaml"
    raw = yaml.safe_load(cfg_path.read_text())
    assert raw["safety"] == {"mode": "balanced", "interruption_hours": round(TRACE_HOURS, 4)}
    step = mode["speed"]["step_seconds"]
    assert raw["checkpointing"]["every_steps"] <= max(1, int(spot["checkpoint_interval_seconds"] / step))
    cfg = load_run_config(cfg_path)  # what trainfit train reads
    assert cfg.safety.interruption_hours == round(TRACE_HOURS, 4)
    assert "expected cost incl. re-done work" in cfg_path.read_text()


def test_plan_for_an_on_demand_flavor():
    done = _plan("--flavor", "g5.xlarge", "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["modes"][0]["run"]
    assert run["rental_usd"] == pytest.approx(run["hours"] * 1.006)
    assert run["spot"] is None and run["rental_expected_usd"] is None


def test_plan_text_shows_the_expected_cost():
    done = _plan("--flavor", "n1-standard-8+t4", "--spot")
    assert done.returncode == 0, done.stderr
    assert "expected incl. re-done work $" in done.stdout


@pytest.mark.parametrize("args,needle", [
    (["--spot"], "--spot: plans for a cloud flavor's spot price; give --flavor ID too"),
    (["--flavor", "g5.xlarge", "--spot"], "--spot: g5.xlarge has no spot price in the catalog"),
    (["--flavor", "g5.xlarge", "--hardware", "rtx-4090"], "give either --flavor or --hardware"),
    (["--flavor", "g5.xlarge", "--usd-per-hour", "2"], "give either --flavor or --usd-per-hour"),
    (["--flavor", "g5.xlarg"], "unknown cloud flavor 'g5.xlarg'"),
    (["--flavor", "v5e-1x1"], "tpu flavor"),
])
def test_bad_flavor_flags_exit_2(args, needle):
    done = _plan(*args)
    assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_plan_takes_a_spot_price_from_a_price_file(tmp_path):
    """An AWS flavor with the user's spot price and the advisor band they read (15-20 %/month:
    M = 720 / -ln(0.80) = 3,227 h)."""
    prices = tmp_path / "p.csv"
    prices.write_text("id,spot_usd_per_hour,spot_interruption\ng5.xlarge,0.45,aws-band-15-20\n")
    done = _plan("--flavor", "g5.xlarge", "--spot", "--prices", str(prices), "--json", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["modes"][0]["run"]
    assert run["rental_usd"] == pytest.approx(run["hours"] * 0.45)
    assert run["spot"]["interruption_hours"] == pytest.approx(3226.6, abs=0.1) and run["spot"]["assumed"] is False
    raw = yaml.safe_load((tmp_path / "o" / "balanced" / "run.yaml").read_text())
    assert raw["safety"]["interruption_hours"] == pytest.approx(3226.6225, abs=1e-3)
    lone = _plan("--prices", str(prices))
    assert lone.returncode == 2 and "--prices: prices a cloud flavor; give --flavor ID too" in lone.stderr
