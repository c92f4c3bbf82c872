"""`trainfit estimate` predicts speed, power, run time, energy and electricity cost too."""

import dataclasses
import json
import subprocess
import sys

import pytest

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.catalog import get_model
from trainfit.core.run.prediction import predict_run
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.core.speed import Workload


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "trainfit", "estimate", *args], capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def test_json_has_speed_power_and_run_energy():
    rc, out, err = _cli("Qwen/Qwen2.5-0.5B", "--hardware", "a10g", "--examples", "1000", "--seq-len", "512", "--json")
    assert rc == 0, err
    run = json.loads(out)["run"]
    speed, power = run["speed"], run["power"]
    assert speed["total_steps"] == 1000 and speed["total_seconds"] > 0
    # Energy is draw x time, and cost is energy x price: the three must agree.
    assert power["energy_kwh"] == pytest.approx(power["total_watts"] * speed["total_seconds"] / 3.6e6)
    assert power["electricity_cost"] == pytest.approx(power["energy_kwh"] * power["price_per_kwh"])
    assert 0 < power["gpu_watts_each"] <= power["gpu_limit_watts_each"]


def test_cpu_draw_is_an_assumption_when_nothing_is_readable():
    spec = get_model("gpt2")
    catalog = resolve_hardware("cpu")
    # As in a VM: neither a TDP nor a RAPL reading.
    power = dataclasses.replace(catalog.power, cpu_tdp_watts=None, cpu_package_watts=None,
                                unavailable={**catalog.power.unavailable, "cpu_tdp_watts": "unknown",
                                             "cpu_package_watts": "no permission"})
    hw = dataclasses.replace(catalog, power=power)
    pred = predict_run(spec, TrainingSetup(device="cpu", precision="fp32", seq_len=128), hw,
                       Workload(dataset_tokens=10_000))
    assert pred.power.cpu_watts > 0
    assert any("assumed" in n for n in pred.power.notes)


def test_step_time_calibration_scales_durations_not_flops():
    spec = get_model("qwen2.5-0.5b")
    setup = TrainingSetup(method="lora", lora=LoraSettings(), seq_len=512)
    hw = resolve_hardware("a10g")
    plain = predict_run(spec, setup, hw, Workload(examples=100))
    slow = predict_run(spec, setup, hw, Workload(examples=100), step_time_factor=1.5, calibration_source="verify")
    assert slow.speed.step_seconds == pytest.approx(plain.speed.step_seconds * 1.5)
    assert slow.speed.total_seconds == pytest.approx(plain.speed.total_seconds * 1.5)
    assert slow.speed.step_flops == plain.speed.step_flops
    ignored = predict_run(spec, setup, hw, step_time_factor=40.0)
    assert ignored.step_time_factor == 1.0 and ignored.notes


@pytest.mark.parametrize("args,flag", [
    (["--examples", "0"], "--examples"),
    (["--dataset-tokens", "-5"], "--dataset-tokens"),
    (["--examples", "10", "--dataset-tokens", "10"], "--dataset-tokens"),
    (["--examples", "10", "--epochs", "0"], "--epochs"),
    (["--price-per-kwh", "-1"], "--price-per-kwh"),
])
def test_bad_run_flags(args, flag):
    rc, out, err = _cli("gpt2", "--hardware", "t4", *args)
    assert rc == 2 and flag in err and "Traceback" not in err and out == ""
