"""Faults: NVML missing or mismatched, a hung driver call, unreadable sysfs files."""

import copy
import time

from trainfit.core.machines.profile import missing_reasons
from trainfit.hardware.fakes import sources_from_data
from trainfit.hardware.profiler import build_profile

from .conftest import fixture_data, fixture_profile


def test_driver_library_mismatch_is_a_reason():
    p = fixture_profile("fault-driver-mismatch")
    assert p.gpus == [] and missing_reasons(p) == []
    assert p.unavailable["nvidia"].startswith("Driver/library version mismatch")
    assert p.backends.cuda.reason == p.unavailable["nvidia"]


def test_nvml_library_missing_and_bindings_missing():
    p = fixture_profile("fault-nvml-library-missing")
    assert "NVML library not found" in p.unavailable["nvidia"]
    data = copy.deepcopy(fixture_data("desktop-rtx4090"))
    data["nvml"] = None  # nvidia-ml-py itself not importable
    p = build_profile(sources=sources_from_data(data))
    assert "not importable" in p.unavailable["nvidia"] and missing_reasons(p) == []


def test_hung_nvml_times_out_and_profile_finishes():
    t0 = time.perf_counter()
    p = fixture_profile("fault-nvml-hang", timeouts={"gpus.nvidia": 0.5})
    assert time.perf_counter() - t0 < 2.0
    assert p.unavailable["nvidia"] == "timed out after 0.5 s"
    assert p.probe_seconds["gpus.nvidia"] == 0.5
    assert missing_reasons(p) == [] and p.cpu.model  # the other probes still answered


def test_hung_system_profiler_is_bounded():
    data = copy.deepcopy(fixture_data("macbook-m2-16gb"))
    data["commands"]["system_profiler"] = {"hang": True}
    p = build_profile(sources=sources_from_data(data))
    (g,) = p.gpus
    assert g.name == "Apple M2" and missing_reasons(p) == []


def test_unreadable_sysfs_files_become_reasons():
    p = fixture_profile("fault-permission-denied")
    assert missing_reasons(p) == []
    assert p.power.unavailable["cpu_package_watts"].startswith("no permission")
    assert p.power.thermal_zones == []
    assert "no cache information" in p.cpu.unavailable["l2_cache_bytes"]
    assert p.cpu.base_clock_mhz is None and p.cpu.unavailable["base_clock_mhz"]
    assert p.power.on_ac is False  # still known from the battery API


def test_nvml_field_errors_are_per_field():
    data = copy.deepcopy(fixture_data("desktop-rtx4090"))
    dev = data["nvml"]["devices"][0]
    dev["errors"] = {"temperature": 4, "clock_events": 15}
    p = build_profile(sources=sources_from_data(data))
    g = p.gpus[0]
    assert g.temperature_c is None and g.unavailable["temperature_c"] == "no permission"
    assert "GPU is lost" in g.unavailable["throttle_reasons"]
    assert g.vram_total_bytes and missing_reasons(p) == []


def test_cuda_visible_devices_selects_and_renumbers():
    data = copy.deepcopy(fixture_data("8x-h100-sxm"))
    data["env"]["CUDA_VISIBLE_DEVICES"] = "3,GPU-00000005"
    p = build_profile(sources=sources_from_data(data))
    assert [g.index for g in p.gpus] == [0, 1]
    assert [g.uuid[:12] for g in p.gpus] == ["GPU-00000003", "GPU-00000005"]
    assert "hidden by CUDA_VISIBLE_DEVICES" in p.unavailable["nvidia_hidden"]
