"""One bad field must not drop a GPU or every GPU; unknown sizes are None (null), never 0.

Faults come from the fake NVML (trainfit.hardware.fakes): a name that is not UTF-8, a device count
of the wrong type, a call that raises an exception that is not an NVMLError, a value of the wrong
type; and a memory probe that fails.
"""

import copy
import json

import pytest

from trainfit.cli.render_profile import profile_lines
from trainfit.core.memory import estimate_memory
from trainfit.core.memory.overheads import cpu_capacity, gpu_capacity
from trainfit.core.models.shapes import parse_shape
from trainfit.core.machines.profile import HardwareProfile, missing_reasons
from trainfit.core.setup import TrainingSetup
from trainfit.hardware.analysis import analyze_profile
from trainfit.hardware.fakes import sources_from_data
from trainfit.hardware.profiler import build_profile

from .conftest import fixture_data

RTX4090_BYTES = "NVIDIA GeForce RTX 4090".encode().hex()


def two_gpus(**changes) -> dict:
    data = copy.deepcopy(fixture_data("2x-rtx4090"))
    for key, value in changes.items():
        data["nvml"][key] = value
    return data


def profile(data: dict) -> HardwareProfile:
    return build_profile(sources=sources_from_data(data), quick=True)


def rows(p: HardwareProfile) -> dict[str, str]:
    return dict(profile_lines(p))


def test_name_that_is_not_utf8_keeps_both_gpus_and_says_so():
    data = two_gpus()
    data["nvml"]["devices"][1]["name_bytes"] = RTX4090_BYTES + "ff"  # a stray byte: not UTF-8
    p = profile(data)
    assert "nvidia" not in p.unavailable and len(p.gpus) == 2
    g0, g1 = p.gpus
    assert g1.name == "NVIDIA GeForce RTX 4090" and g1.catalog_id == "rtx-4090"
    assert "not UTF-8" in g1.unavailable["name"] and "\\xff" in g1.unavailable["name"]
    assert g1.vram_total_bytes == g0.vram_total_bytes and g1.temperature_c == 34.0
    assert "name" not in g0.unavailable and missing_reasons(p) == []


def test_name_of_only_undecodable_bytes_falls_back_to_the_index():
    data = two_gpus()
    data["nvml"]["devices"][0]["name_bytes"] = "fffe"
    p = profile(data)
    assert [g.name for g in p.gpus] == ["NVIDIA GPU 0", "NVIDIA GeForce RTX 4090"]
    assert "not UTF-8" in p.gpus[0].unavailable["name"] and p.gpus[0].vram_total_bytes


@pytest.mark.parametrize("count, note", [("2", "read as 2"), (2.0, "read as 2"),
                                         ("two", "asking for handles"), (None, "asking for handles")])
def test_count_of_the_wrong_type_keeps_the_gpus(count, note):
    p = profile(two_gpus(count=count))
    assert len(p.gpus) == 2 and "nvidia" not in p.unavailable
    assert note in p.unavailable["nvidia_count"] and repr(count) in p.unavailable["nvidia_count"]
    assert [g.index for g in p.gpus] == [0, 1] and missing_reasons(p) == []


def test_a_field_raising_an_unexpected_exception_costs_that_field_only():
    data = two_gpus()
    data["nvml"]["devices"][0]["raises"] = {"temperature": "RuntimeError", "pcie": "KeyError"}
    p = profile(data)
    g0, g1 = p.gpus
    assert g0.temperature_c is None
    assert g0.unavailable["temperature_c"].startswith("nvmlDeviceGetTemperature failed: RuntimeError")
    assert g0.pcie_gen is None and "KeyError" in g0.unavailable["pcie_gen"]
    assert g0.vram_total_bytes == 25757220864 and g0.power_limit_watts == 450.0 and g0.catalog_id == "rtx-4090"
    assert g1.temperature_c == 34.0 and g1.pcie_gen == 4 and missing_reasons(p) == []


def test_values_of_the_wrong_type_become_reasons():
    data = two_gpus()
    dev = data["nvml"]["devices"][1]
    dev["pcie"] = {"gen": "4", "width": 8, "gen_max": 4, "width_max": 16}
    dev["power_limit_mw"] = "450 W"
    dev["cc"] = ["8", "9"]
    p = profile(data)
    g1 = p.gpus[1]
    assert g1.pcie_gen is None and "unexpected value from nvmlDeviceGetCurrPcieLinkGeneration" in g1.unavailable["pcie_gen"]
    assert g1.pcie_width == 8
    assert g1.power_limit_watts is None and "expected a number" in g1.unavailable["power_limit_watts"]
    assert g1.compute_capability == "8.9"  # not readable from NVML, so taken from the catalog
    assert p.gpus[0].pcie_gen == 4 and missing_reasons(p) == []


def test_unreadable_vram_is_null_in_json_unknown_on_screen_and_no_verdict(tmp_path):
    data = two_gpus()
    for dev in data["nvml"]["devices"]:
        dev["raises"] = {"memory": "ValueError"}
    p = profile(data)
    assert all(g.vram_total_bytes is None and g.vram_free_bytes is None for g in p.gpus)
    why = p.gpus[0].unavailable["vram_total_bytes"]
    assert "nvmlDeviceGetMemoryInfo failed: ValueError" in why
    doc = json.loads(p.to_json())
    assert doc["gpus"][0]["vram_total_bytes"] is None and doc["gpus"][0]["vram_free_bytes"] is None
    assert HardwareProfile.from_json(p.to_json()).gpus[0].vram_total_bytes is None
    assert f"VRAM unknown ({why})" in rows(p)["GPU 0"] and "0.0 GiB" not in rows(p)["GPU 0"]
    assert gpu_capacity(p) is None
    est = estimate_memory(parse_shape("125m"), TrainingSetup(method="full", precision="bf16-mixed"), p)
    assert est.devices[0].capacity_bytes is None and est.fits is None
    assert any(n.startswith("memory of NVIDIA GeForce RTX 4090 unknown (nvmlDeviceGetMemoryInfo failed")
               and n.endswith("no fit verdict") for n in est.notes)
    a = analyze_profile(p)
    assert "VRAM unknown for GPU 0" in a.reasoning[0] and any("GPU 1 memory unknown" in w for w in a.warnings)


def test_failed_memory_probe_is_null_not_zero():
    data = copy.deepcopy(fixture_data("desktop-rtx4090"))
    del data["psutil"]["virtual_memory"]  # psutil.virtual_memory() raises: the probe fails
    p = build_profile(sources=sources_from_data(data), quick=True)
    m = p.memory
    assert (m.total_bytes, m.available_bytes, m.usable_bytes, m.os_reserve_bytes) == (None, None, None, None)
    assert m.unavailable["usable_bytes"].startswith("KeyError") and missing_reasons(p) == []
    doc = json.loads(p.to_json())
    assert doc["memory"]["total_bytes"] is None and doc["memory"]["usable_bytes"] is None
    again = HardwareProfile.from_json(p.to_json())
    assert again.memory.usable_bytes is None
    assert rows(p)["RAM"] == f"unknown ({m.unavailable['total_bytes']})"
    assert cpu_capacity(p) is None
    est = estimate_memory(parse_shape("125m"), TrainingSetup(method="full", precision="fp32", device="cpu"), p)
    assert est.devices[0].capacity_bytes is None and est.fits is None
    assert any(n.startswith("usable RAM unknown (KeyError") for n in est.notes)
    assert any(w.startswith("RAM size unknown") for w in analyze_profile(p).warnings)


def test_amdsmi_odd_answers_keep_every_gpu():
    import dataclasses
    from types import SimpleNamespace

    from trainfit.hardware.amd import probe_amd_gpus
    from trainfit.hardware.fakes import load_fixture

    from .conftest import FIXTURES

    def asic(h):
        if h == "h1":
            return "MI300X"  # a string where amdsmi documents a dict
        return {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"}

    def bdf(h):
        if h == "h2":
            raise KeyError("bdf")  # an exception that is not an AmdSmiLibraryException
        return f"0000:0{h[-1]}:00.0"

    module = SimpleNamespace(
        amdsmi_init=lambda: None, amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: ["h0", "h1", "h2"],
        amdsmi_get_gpu_asic_info=asic,
        amdsmi_get_gpu_vram_usage=lambda h: {"vram_total": "N/A" if h == "h1" else 196608, "vram_used": 2048},
        amdsmi_get_power_info=lambda h: {"average_socket_power": 180, "power_limit": 750_000_000},
        amdsmi_get_gpu_device_uuid=lambda h: f"uuid-{h}",
        amdsmi_get_gpu_device_bdf=bdf,
    )
    src = dataclasses.replace(load_fixture(FIXTURES / "amd-mi300x.yaml"), amdsmi=lambda: module)
    gpus, _ = probe_amd_gpus(src)
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].vram_total_bytes == 192 << 30 and gpus[0].name == "AMD Instinct MI300X"
    assert gpus[1].name == "AMD GPU" and gpus[1].vram_total_bytes is None
    assert gpus[1].unavailable["vram_total_bytes"] == "amdsmi reported vram_total 'N/A'"
    assert "returned str, expected dict" in gpus[1].unavailable["architecture"]
    assert gpus[2].pci_bus_id is None and "KeyError" in gpus[2].unavailable["pci_bus_id"]
    assert gpus[2].vram_total_bytes == 192 << 30
    assert all(missing_reasons(g) == [] for g in gpus)


def test_apple_gpu_stays_when_available_memory_cannot_be_read():
    data = copy.deepcopy(fixture_data("macbook-m2-16gb"))
    del data["psutil"]["virtual_memory"]
    p = build_profile(sources=sources_from_data(data), quick=True)
    (g,) = p.gpus
    assert g.vram_total_bytes == 16 << 30 and g.vram_free_bytes is None
    assert g.unavailable["vram_free_bytes"].startswith("psutil.virtual_memory failed: KeyError")
    assert p.memory.total_bytes is None and missing_reasons(p) == []
    # the capacity falls back to the GPU's unified-memory total, still by the one Metal rule
    from trainfit.core.machines.hardware_spec import metal_working_set_bytes

    assert gpu_capacity(p) == metal_working_set_bytes(16 << 30)


def test_plan_refuses_unknown_memory_and_analyze_still_reports(tmp_path):
    import argparse

    from trainfit.cli import cmd_analyze, cmd_plan
    from trainfit.core.plan.planner import MemoryUnknownError, plan
    from trainfit.errors import EXIT_UNAVAILABLE

    data = two_gpus()
    for dev in data["nvml"]["devices"]:
        dev["raises"] = {"memory": "ValueError"}
    path = tmp_path / "box.json"
    path.write_text(profile(data).to_json())
    hw = HardwareProfile.from_json(path.read_text())
    parser = argparse.ArgumentParser()
    cmd_plan.add_arguments(parser)
    args = parser.parse_args(["gpt2"])
    with pytest.raises(MemoryUnknownError) as exc:
        plan(cmd_plan.build_request(args, hardware=hw))
    assert exc.value.exit_code == EXIT_UNAVAILABLE and "--memory-budget" in exc.value.hint
    assert "memory of NVIDIA GeForce RTX 4090 unknown (nvmlDeviceGetMemoryInfo failed" in exc.value.message
    budgeted = plan(cmd_plan.build_request(parser.parse_args(["gpt2", "--memory-budget", "20GiB"]), hardware=hw))
    assert all(m.memory_budget_bytes <= 20 * (1 << 30) for m in budgeted.modes)

    parser = argparse.ArgumentParser()
    cmd_analyze.add_arguments(parser)
    doc = cmd_analyze.analyze(parser.parse_args(["--hardware", str(path)]))
    assert doc["plan"]["unavailable"] == exc.value.message
    assert any("GPU 0 memory unknown" in w for w in doc["analysis"]["warnings"])
