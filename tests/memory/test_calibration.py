"""`trainfit verify` stores measured/predicted ratios; later estimates for this machine use them."""

import json
import os
import subprocess
import sys

from trainfit.core.memory.calibrated import apply_memory_factor
from trainfit.core.memory_types import DeviceMemory, MemoryComponent, MemoryEstimate


def _estimate(peak=1000, total=1200):
    dev = DeviceMemory("cpu", peak, total, 2000, [MemoryComponent("weights", peak, "w", True)])
    return MemoryEstimate("m", 1, 1, [dev])


def test_factor_adds_a_visible_component_and_moves_peak_and_total():
    out = apply_memory_factor(_estimate(), "cpu", 1.1, "verify")
    dev = out.devices[0]
    assert dev.tensor_peak_bytes == 1100 and dev.total_bytes == 1300
    assert dev.components[-1].name == "calibration" and dev.components[-1].bytes == 100


def test_implausible_factor_is_ignored_with_a_note():
    out = apply_memory_factor(_estimate(), "cpu", 7.0, "verify")
    assert out.devices[0].tensor_peak_bytes == 1000
    assert any("calibration ignored" in n for n in out.notes)


def test_other_devices_are_left_alone():
    out = apply_memory_factor(_estimate(), "cuda", 1.5, "verify")
    assert out.devices[0].tensor_peak_bytes == 1000


def _cli(args, config_home):
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    proc = subprocess.run([sys.executable, "-m", "trainfit", "estimate", *args, "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode in (0, 3), proc.stderr
    return json.loads(proc.stdout)


def test_estimate_on_this_machine_uses_the_stored_ratio(tmp_path):
    from trainfit.hardware.profiler import build_profile
    from trainfit.train.calibration import machine_fingerprint, record_sample

    args = ["gpt2", "--device", "cpu", "--seq-len", "128"]
    plain = _cli(args, tmp_path)
    assert not any(c["name"] == "calibration" for c in plain["devices"][0]["components"])

    fingerprint = machine_fingerprint(build_profile(quick=True))
    path = tmp_path / "trainfit" / "calibration.json"
    for ratio in (1.08, 1.10, 1.30):  # the median (1.10) is applied, robust to one outlier
        record_sample(fingerprint, "cpu", {"memory_ratio": ratio, "step_time_ratio": 1.0}, path)
    calibrated = _cli(args, tmp_path)
    dev = calibrated["devices"][0]
    assert dev["components"][-1]["name"] == "calibration"
    assert abs(dev["tensor_peak_bytes"] / plain["devices"][0]["tensor_peak_bytes"] - 1.10) < 1e-3

    assert _cli([*args, "--no-calibration"], tmp_path)["devices"][0]["tensor_peak_bytes"] == \
        plain["devices"][0]["tensor_peak_bytes"]
    # A catalog machine is not this machine: no calibration there.
    other = _cli(["gpt2", "--hardware", "cpu-64gb", "--seq-len", "128"], tmp_path)
    assert not any(c["name"] == "calibration" for c in other["devices"][0]["components"])
