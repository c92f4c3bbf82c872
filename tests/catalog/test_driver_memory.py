"""Usable GPU memory comes from the total the driver reports (ECC on a T4 keeps 1/16 of 16 GiB),
so a catalog profile ('--hardware t4') and a live NVML probe of the same GPU agree."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from trainfit.core.gpu_catalog import CatalogError, all_gpus, get_gpu, parse_catalog
from trainfit.core.hardware_spec import resolve_hardware
from trainfit.core.memory import estimate_memory
from trainfit.core.memory.overheads import gpu_capacity
from trainfit.core.model_catalog import resolve_model
from trainfit.core.setup import TrainingSetup

MIB, GIB = 1 << 20, 1 << 30

GOOD = """
refs: {ds: https://example.com/datasheet, smi: https://example.com/nvidia-smi}
gpus:
  - id: test-gpu
    name: Test GPU
    vendor: nvidia
    gpu_class: datacenter
    architecture: turing
    compute_capability: "7.5"
    matrix_unit: tensor-core-2
    vram_gib: 16
    driver_total_mib: 15360
    memory_bandwidth_gbps: 320
    peak_tflops: {fp32: 8.1, fp16: 65}
    tdp_watts: 70
    pcie_gen: 3
    aliases: []
    sources: {all: ds, driver_total_mib: smi}
"""


def test_t4_capacity_is_the_driver_total_minus_what_the_model_subtracts():
    t4 = get_gpu("t4")
    assert t4.vram_bytes == 16 * GIB and t4.driver_total_bytes == 15360 * MIB  # 16384 x 15/16, ECC on
    assert t4.sources["driver_total_mib"].startswith("https://")
    p = resolve_hardware("t4")
    g = p.gpus[0]
    assert g.vram_total_bytes == 15360 * MIB  # as nvidia-smi shows it, not the marketing 16 GiB
    assert g.vram_free_bytes == 15360 * MIB - 512 * MIB  # the data-centre host keeps 0.5 GiB in use
    assert gpu_capacity(p) == 15360 * MIB
    est = estimate_memory(resolve_model("gpt2"), TrainingSetup(method="full", precision="fp16-mixed"), p)
    dev = est.devices[0]
    assert dev.capacity_bytes == 15360 * MIB
    margins = {c.name: c.bytes for c in dev.components if not c.in_tensor_peak}
    assert margins["cuda_context"] == 350 * MIB  # Turing context, counted against the 15360 MiB
    room = dev.capacity_bytes - margins["cuda_context"] - margins["framework_overhead"]
    assert room == (15360 - 350 - 64) * MIB


def test_catalog_and_live_probe_agree_on_t4():
    from trainfit.hardware.fakes import load_fixture_data, sources_from_data
    from trainfit.hardware.profiler import build_profile

    fixtures = Path(__file__).parents[1] / "hardware" / "fixtures"
    data = copy.deepcopy(load_fixture_data(fixtures / "desktop-rtx4090.yaml"))
    dev = data["nvml"]["devices"][0]
    dev.update(name="Tesla T4", cc=[7, 5], power_limit_mw=70000,
               memory={"total": 15360 * MIB, "free": 15360 * MIB - 256 * MIB})
    live = build_profile(sources=sources_from_data(data), quick=True)
    assert live.gpus[0].catalog_id == "t4"
    assert live.gpus[0].vram_total_bytes == resolve_hardware("t4").gpus[0].vram_total_bytes
    assert gpu_capacity(live) == gpu_capacity(resolve_hardware("t4"))


def test_every_driver_total_is_sourced_and_below_the_marketing_size():
    with_total = [g for g in all_gpus() if g.driver_total_bytes]
    assert {"t4", "l4", "l40s", "a10", "a40", "a100-80gb", "h100-sxm", "h100-nvl", "h200"} <= {g.id for g in with_total}
    for g in with_total:
        assert g.sources["driver_total_mib"].startswith("https://"), g.id
        assert 0.9 * g.vram_bytes < g.driver_total_bytes <= g.vram_bytes, g.id
        assert resolve_hardware(g.id).gpus[0].vram_total_bytes == g.driver_total_bytes


@pytest.mark.parametrize("change, message", [
    (("sources: {all: ds, driver_total_mib: smi}", "sources: {vram_gib: ds, memory_bandwidth_gbps: ds, "
      "peak_tflops: ds, tdp_watts: ds, compute_capability: ds}"), "'driver_total_mib' has no source"),
    (("driver_total_mib: 15360", "driver_total_mib: 17000"), "more than vram_gib"),
    (("driver_total_mib: 15360", "driver_total_mib: 15.5"), "positive whole number of MiB"),
])
def test_driver_total_is_validated(change, message):
    assert parse_catalog(GOOD).gpus[0].driver_total_bytes == 15360 * MIB
    with pytest.raises(CatalogError) as exc:
        parse_catalog(GOOD.replace(*change))
    assert message in str(exc.value)
