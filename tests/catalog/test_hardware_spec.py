"""`--hardware SPEC` resolves to complete profiles; bad specs give one clear BadInputError."""

from __future__ import annotations

import json

import pytest

from trainfit.core.machines.gpu_catalog import GIB
from trainfit.core.machines.hardware_spec import NOT_MEASURED, resolve_hardware
from trainfit.core.machines.profile import SCHEMA_VERSION, HardwareProfile, missing_reasons
from trainfit.errors import BadInputError


@pytest.mark.parametrize(
    "spec,count,gpu_id,source",
    [
        ("rtx-4090", 1, "rtx-4090", "catalog:rtx-4090"),
        ("2x rtx-4090", 2, "rtx-4090", "catalog:2x rtx-4090"),
        ("8xh100-sxm", 8, "h100-sxm", "catalog:8x h100-sxm"),
        ("4 x l4", 4, "l4", "catalog:4x l4"),
        ("a100-80gb", 1, "a100-80gb", "catalog:a100-80gb"),
        ("m2-16gb", 1, "m2-16gb", "catalog:m2-16gb"),
        ("RTX 4090", 1, "rtx-4090", "catalog:rtx-4090"),
        ("rtx-3060-laptop", 1, "rtx-3060-laptop", "catalog:rtx-3060-laptop"),
        ("mi300x", 1, "mi300x", "catalog:mi300x"),
        ("cpu", 0, None, "catalog:cpu"),
        ("cpu-64gb", 0, None, "catalog:cpu-64gb"),
    ],
)
def test_every_form_gives_a_complete_profile(spec, count, gpu_id, source):
    p = resolve_hardware(spec)
    assert p.source == source and p.gpu_count == count
    assert missing_reasons(p) == []
    assert all(g.catalog_id == gpu_id for g in p.gpus)
    # round-trips through the saved-profile format
    assert HardwareProfile.from_json(p.to_json()) == p


def test_gpu_fields_come_from_the_catalog_and_live_readings_are_marked():
    p = resolve_hardware("2x rtx-4090")
    g = p.gpus[0]
    # the total nvidia-smi reports (24564 MiB, gpus.yaml driver_total_mib), minus the driver's own
    # share (354 MiB) and the 1 GiB desktop reserve
    assert g.vram_total_bytes == 24564 << 20 and g.vram_reserved_bytes == 354 << 20
    assert g.vram_free_bytes == ((24564 - 354) << 20) - GIB
    assert g.peak_tflops["bf16"] == pytest.approx(165.2) and "bf16" in g.precisions
    assert g.memory_bandwidth_gbps == 1008 and g.tdp_watts == 450 and g.compute_capability == "8.9"
    assert g.temperature_c is None and g.unavailable["temperature_c"] == NOT_MEASURED
    assert g.nvlink_peers == []  # PCIe consumer cards
    assert p.accelerator == "cuda" and p.backends.cuda.available and not p.backends.rocm.available
    # typical multi-GPU desktop: 16-core HEDT, RAM >= 2x total VRAM rounded to a power of two
    assert p.memory.total_bytes == 128 * GIB and p.cpu.physical_cores == 16  # 2 x 48 -> 128
    assert p.power.estimated_system_tdp_watts > 900


def test_sxm_node_links_every_gpu_and_gets_a_server_host():
    p = resolve_hardware("8xh100-sxm")
    assert [g.index for g in p.gpus] == list(range(8))
    assert p.gpus[3].nvlink_peers == [0, 1, 2, 4, 5, 6, 7]
    assert p.cpu.logical_cores == 96 and p.memory.total_bytes == 2048 * GIB
    assert p.gpus[0].vram_free_bytes == ((81559 - 454) << 20) - GIB // 2  # H100 80GB HBM3 as nvidia-smi reports it


def test_apple_profile_is_unified_memory():
    p = resolve_hardware("m2-16gb")
    g = p.gpus[0]
    assert p.accelerator == "mps" and p.memory.unified_with_gpu and g.unified_memory
    assert p.memory.total_bytes == 16 * GIB and p.cpu.architecture == "arm64"
    assert p.cpu.physical_cores == 8
    assert g.vram_free_bytes == int(16 * GIB * 2 / 3)  # Metal working-set cap
    assert g.pcie_gen is None and "pcie_gen" in g.unavailable


def test_cpu_specs():
    p = resolve_hardware("cpu")
    assert p.gpus == [] and p.accelerator == "cpu" and p.memory.total_bytes == 32 * GIB
    assert resolve_hardware("cpu-256gb").cpu.physical_cores == 16
    assert resolve_hardware("CPU-8GB").memory.total_bytes == 8 * GIB


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("3x nonsense", "unknown GPU 'nonsense'"),
        ("0x rtx-4090", "GPU count must be 1..16"),
        ("17x h100-sxm", "GPU count must be 1..16"),
        ("rtx-4090x", "did you mean rtx-4090"),
        ("2x m2-16gb", "one per machine"),
        ("", "empty"),
        ("cpu-0gb", "RAM must be"),
        ("3x ", "no GPU named"),
    ],
)
def test_bad_specs_name_the_valid_forms(spec, fragment):
    with pytest.raises(BadInputError) as exc:
        resolve_hardware(spec)
    text = str(exc.value)
    assert fragment in text and "--hardware" in text
    if "did you mean" not in fragment and fragment not in ("one per machine",):
        assert "2x rtx-4090" in text  # the valid forms are listed


def test_profile_files(tmp_path):
    saved = resolve_hardware("rtx-4090")
    good = tmp_path / "profile.json"
    good.write_text(saved.to_json())
    loaded = resolve_hardware(str(good))
    assert loaded.source == f"file:{good}" and loaded.gpus == saved.gpus

    with pytest.raises(BadInputError, match="not found"):
        resolve_hardware(str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(BadInputError, match="not valid JSON"):
        resolve_hardware(str(broken))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**json.loads(saved.to_json()), "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(BadInputError, match="schema_version"):
        resolve_hardware(str(old))
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({**json.loads(saved.to_json()), "gpuz": []}))
    with pytest.raises(BadInputError, match="gpuz"):
        resolve_hardware(str(typo))
    unreadable = tmp_path / "dir.json"
    unreadable.mkdir()
    with pytest.raises(BadInputError, match="is a directory"):
        resolve_hardware(str(unreadable))
