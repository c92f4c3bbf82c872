"""A step time `verify` measured on a busy machine is stored flagged and never applied.

The load is a fake reading (check_load with a given 1-minute load average), so the tests do not
depend on how busy the test machine is.
"""

import argparse
import os

import pytest

from trainfit.cli import cmd_estimate
from trainfit.core.models import shapes as model_shapes
from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.train import calibration as cal


def test_load_rule():
    busy = cal.check_load(8.0, 2)  # the run that gave a 6.6x ratio: load 8 on 2 cores
    assert busy.contended and busy.cores == 2 and busy.load_average_1m == 8.0
    assert "8.0 on 2 cores" in busy.reason and "above 2.5" in busy.reason and "memory ratio was stored" in busy.reason
    # The run may keep every core busy itself; 25 % of the cores beyond that is tolerated.
    assert not cal.check_load(2.0, 2).contended and not cal.check_load(2.5, 2).contended
    assert cal.check_load(2.6, 2).contended and not cal.check_load(19.0, 16).contended


def test_no_load_average_is_not_a_refusal(monkeypatch):
    def missing():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", missing)
    check = cal.check_load(cores=4)
    assert check.load_average_1m is None and not check.contended and check.reason is None


def test_busy_step_time_is_stored_flagged_and_not_applied(tmp_path):
    path = tmp_path / "calibration.json"
    file, load = cal.record_verify_sample("m1", "cpu", {"memory_ratio": 1.05, "step_time_ratio": 6.6}, path,
                                          load=cal.check_load(8.0, 2))
    assert file == path and load.contended
    stored = cal.read_calibration(path)["machines"]["m1"]["cpu"]["samples"][0]
    assert stored["load_average_1m"] == 8.0 and stored["cores"] == 2
    assert stored["step_time_contended"] == load.reason and stored["step_time_ratio"] == 6.6
    dev = cal.load_calibration("m1", path).devices["cpu"]
    assert dev.step_time_factor is None and dev.contended_samples == 1
    assert dev.memory_factor == pytest.approx(1.05)  # peak memory does not depend on the load

    for ratio in (1.1, 1.3):  # idle runs: only these count
        cal.record_verify_sample("m1", "cpu", {"memory_ratio": 1.0, "step_time_ratio": ratio}, path,
                                 load=cal.check_load(0.4, 2))
    dev = cal.load_calibration("m1", path).devices["cpu"]
    assert dev.step_time_factor == pytest.approx(1.2) and dev.samples == 3 and dev.contended_samples == 1


def test_estimate_ignores_a_flagged_step_time(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    profile_file = tmp_path / "machine.json"
    profile_file.write_text(resolve_hardware("cpu-16gb").to_json())
    hw = cmd_estimate.load_hardware(str(profile_file))  # a saved profile is "this machine"
    fingerprint, key = cal.machine_fingerprint(hw), cal.device_key("cpu")
    spec = model_shapes.parse_shape("30m")
    setup = cmd_estimate.estimate(None, hardware=str(profile_file), params="30m", device="cpu", seq_len=128)[1]
    args = argparse.Namespace(dataset_tokens=None, examples=None, epochs=1.0, price_per_kwh=None,
                              hardware=str(profile_file), no_calibration=False)

    def step_seconds() -> float:
        return cmd_estimate._run_prediction(args, spec, hw, setup).speed.step_seconds

    plain = step_seconds()
    cal.record_verify_sample(fingerprint, key, {"memory_ratio": 1.0, "step_time_ratio": 6.6},
                             load=cal.check_load(8.0, 2))
    found = cmd_estimate.machine_calibration(hw, "cpu", named_hardware=str(profile_file))
    assert found is not None and found.step_time_factor is None and found.contended_samples == 1
    assert step_seconds() == pytest.approx(plain)  # the busy machine's 6.6x is not applied
    cal.record_verify_sample(fingerprint, key, {"memory_ratio": 1.0, "step_time_ratio": 2.0},
                             load=cal.check_load(0.3, 2))
    assert step_seconds() == pytest.approx(2.0 * plain)  # an idle machine's ratio is
