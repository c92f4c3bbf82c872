"""estimate's speed line names the backend that runs (mps / rocm / xpu / cuda / cpu), and its
power line and the CPU note state the same watts."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from trainfit.cli.cmd_estimate import _run_prediction, estimate
from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.catalog import resolve_model
from trainfit.core.run.power import assumed_cpu_tdp_watts


def _cli(*args, config_home):
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    proc = subprocess.run([sys.executable, "-m", "trainfit", "estimate", *args], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode in (0, 3), proc.stderr
    return " ".join(proc.stdout.split())  # rich wraps long lines: compare on one line


def _prediction(hardware: str):
    import argparse

    _, setup, _ = estimate("gpt2", hardware=hardware)
    args = argparse.Namespace(dataset_tokens=None, examples=None, epochs=1.0, price_per_kwh=None,
                              hardware=hardware, no_calibration=True)
    return _run_prediction(args, resolve_model("gpt2"), resolve_hardware(hardware), setup)


@pytest.mark.parametrize("hardware, label", [
    ("m2-16gb", "mps x1 (Apple M2"), ("mi300x", "rocm x1 (AMD Instinct MI300X)"),
    ("arc-a770", "xpu x1 (Intel Arc A770"), ("rtx-4090", "cuda x1 (NVIDIA GeForce RTX 4090)"),
    ("cpu", "cpu ("),
])
def test_speed_label_names_the_backend(hardware, label):
    assert _prediction(hardware).speed.device.startswith(label)


def test_speed_line_on_apple_says_mps(tmp_path):
    out = _cli("gpt2", "--hardware", "m2-16gb", config_home=tmp_path)
    line = re.search(r"speed \((.*?)\):", out)
    assert line and line.group(1).startswith("mps x1") and "cuda" not in line.group(1)


def test_assumed_cpu_power_line_and_note_agree(tmp_path):
    p = resolve_hardware("rtx-4090")
    p = dataclasses.replace(p, power=dataclasses.replace(p.power, cpu_tdp_watts=None, cpu_package_watts=None))
    path = tmp_path / "box.json"
    path.write_text(p.to_json())
    out = _cli("gpt2", "--hardware", str(path), config_home=tmp_path)
    line_w = int(re.search(r"GPU \+ (\d+) W CPU\)", out).group(1))
    note = re.search(r"note: CPU: (\d+) W = assumed TDP (\d+) W \((\d+) cores x 10 W\) at (\d+)% load", out)
    assert note, out
    assert int(note.group(1)) == line_w  # the line and the note state the same figure
    watts, cores = assumed_cpu_tdp_watts(p.cpu.physical_cores, p.cpu.logical_cores)
    assert (int(note.group(2)), int(note.group(3))) == (watts, cores)
    assert line_w == round(watts * int(note.group(4)) / 100)


def test_cpu_training_note_is_the_full_load_figure():
    p = resolve_hardware("cpu")
    p = dataclasses.replace(p, power=dataclasses.replace(p.power, cpu_tdp_watts=None, cpu_package_watts=None))
    from trainfit.core.run.power import estimate_power
    from trainfit.core.speed import predict_step
    from trainfit.core.setup import TrainingSetup

    speed = predict_step(resolve_model("gpt2"), TrainingSetup(method="full", precision="fp32", device="cpu"), p)
    pw = estimate_power(p, speed)
    (note,) = [n for n in pw.notes if n.startswith("CPU:")]
    assert note.startswith(f"CPU: {pw.cpu_watts:.0f} W = assumed TDP") and "at full load" in note


def test_apple_cpu_is_inside_the_chip_figure():
    pw = _prediction("m2-16gb").power
    assert pw.cpu_watts == 0 and pw.total_watts == pytest.approx(pw.gpu_watts_each)
    assert any("CPU draw counted in the GPU figure" in n for n in pw.notes)
    assert not any("assumed" in n for n in pw.notes)
