"""The real entry point: stdout, stderr and exit codes of `profile` and `analyze`."""

import json
import subprocess
import sys

import pytest

from trainfit.core.machines.profile import HardwareProfile

from .conftest import fixture_profile


def trainfit(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_profile_json_is_one_document_and_out_is_written(tmp_path):
    out = tmp_path / "p.json"
    r = trainfit("profile", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = HardwareProfile.from_json(r.stdout)
    assert doc.source == "live"
    assert HardwareProfile.from_json(out.read_text()).cpu == doc.cpu
    assert "Traceback" not in r.stderr


def test_profile_terminal_summary():
    r = trainfit("profile", "--quick")
    assert r.returncode == 0 and "GiB = 2^30 bytes" in r.stdout and "CPU" in r.stdout


@pytest.mark.parametrize("watts", ["-100", "1e7", "lots"])
def test_profile_bad_psu_watts(watts):
    r = trainfit("profile", "--psu-watts", watts)
    assert r.returncode == 2 and "--psu-watts" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_analyze_screen_for_a_saved_fixture_profile(tmp_path):
    path = tmp_path / "laptop.json"
    path.write_text(fixture_profile("laptop-rtx3060-battery").to_json())
    r = trainfit("analyze", "--hardware", str(path))
    assert r.returncode == 0, r.stderr
    for text in ("HARDWARE ANALYSIS COMPLETE", "Performance Score", "On battery", "RECOMMENDED CONFIGURATIONS",
                 "OPTIMIZATION SUGGESTIONS", "WARNINGS"):
        assert text in r.stdout


def test_analyze_json_for_a_catalog_name():
    r = trainfit("analyze", "--hardware", "2x rtx-4090", "--json", "--profile-only")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["profile"]["gpus"]) == 2 and 0 <= doc["analysis"]["score"] <= 10
    assert doc["analysis"]["reasoning"]


def test_analyze_live_profile_only():
    r = trainfit("analyze", "--profile-only")
    assert r.returncode == 0 and "Performance Score" in r.stdout and "RECOMMENDED" not in r.stdout


@pytest.mark.parametrize("spec, expect", [("3x nonsense", "valid forms"), ("missing.json", "not found")])
def test_analyze_bad_hardware(spec, expect):
    r = trainfit("analyze", "--hardware", spec)
    assert r.returncode == 2 and expect in r.stderr and "Traceback" not in r.stderr


def test_analyze_malformed_profile_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "cpu": 3}')
    r = trainfit("analyze", "--hardware", str(bad))
    assert r.returncode == 2 and "not a trainfit hardware profile" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
