"""`estimate` and `plan` give the same numbers for the same setting, this machine's `trainfit verify`
calibration included."""

import json
import os
import subprocess
import sys


def _run(cmd, args, home):
    env = {**os.environ, "XDG_CONFIG_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "trainfit", cmd, *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode in (0, 3), done.stderr
    return json.loads(done.stdout)


def _estimate_args(setup):
    args = ["--method", setup["method"], "--precision", setup["precision"], "--optimizer", setup["optimizer"],
            "--micro-batch", str(setup["micro_batch"]), "--grad-accum", str(setup["grad_accum"]),
            "--seq-len", str(setup["seq_len"]), "--grad-checkpointing", setup["grad_checkpointing"],
            "--attn", setup["attention"], "--device", setup["device"], "--examples", "2000"]
    return args


def test_plan_and_estimate_agree_with_a_stored_calibration(tmp_path):
    from trainfit.hardware.profiler import build_profile
    from trainfit.train.calibration import machine_fingerprint, record_sample

    record_sample(machine_fingerprint(build_profile(quick=True)), "cpu",
                  {"memory_ratio": 1.2, "step_time_ratio": 1.5}, tmp_path / "trainfit" / "calibration.json")
    plan = _run("plan", ["gpt2", "--method", "full", "--mode", "balanced", "--seq-len", "256", "--examples", "2000"],
                tmp_path)
    mode = plan["modes"][0]
    est = _run("estimate", ["gpt2", *_estimate_args(mode["setup"])], tmp_path)
    assert est["fits"] is True
    assert est["devices"][0]["total_bytes"] == mode["memory"]["devices"][0]["total_bytes"]
    assert any(c["name"] == "calibration" for c in mode["memory"]["devices"][0]["components"])
    assert abs(est["run"]["speed"]["step_seconds"] - mode["speed"]["step_seconds"]) < 1e-9
    assert abs(est["run"]["speed"]["total_seconds"] - mode["speed"]["total_seconds"]) < 1e-6
    assert any("step time x1.50" in r for r in mode["reasons"])
