"""Usable GPU memory comes from the total the driver reports (ECC on a T4 keeps 1/16 of 16 GiB),
so a catalog profile ('--hardware t4') and a live NVML probe of the same GPU agree."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from trainfit.core.machines.gpu_catalog import CatalogError, all_gpus, get_gpu, parse_catalog
from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.memory import estimate_memory
from trainfit.core.memory.overheads import gpu_capacity
from trainfit.core.models.catalog import resolve_model
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
    assert g.vram_reserved_bytes == 430 * MIB  # the driver's own share: PyTorch sees 14.58 GiB
    assert g.vram_free_bytes == (15360 - 430 - 512) * MIB  # and the data-centre host keeps 0.5 GiB in use
    assert gpu_capacity(p) == (15360 - 430) * MIB
    est = estimate_memory(resolve_model("gpt2"), TrainingSetup(method="full", precision="fp16-mixed"), p)
    dev = est.devices[0]
    assert dev.capacity_bytes == (15360 - 430) * MIB
    margins = {c.name: c.bytes for c in dev.components if not c.in_tensor_peak}
    assert margins["cuda_context"] == 350 * MIB  # Turing context, counted against what is allocatable
    room = dev.capacity_bytes - margins["cuda_context"] - margins["framework_overhead"]
    assert room == (15360 - 430 - 350 - 64) * MIB


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


def test_capacity_is_what_pytorch_reports_as_the_total():
    # PyTorch's out-of-memory message names cudaMemGetInfo's total: "GPU 0 has a total capacity of
    # 79.25 GiB" on an A100 80GB, "23.64 GiB" on an RTX 4090 (driver 550); nvidia-smi shows 81920 / 24564 MiB.
    assert round(gpu_capacity(resolve_hardware("a100-80gb")) / GIB, 2) == 79.25
    assert round(gpu_capacity(resolve_hardware("rtx-4090")) / GIB, 2) == 23.64
    assert resolve_hardware("a100-80gb").gpus[0].vram_total_bytes == 81920 * MIB  # what nvidia-smi shows


def test_unrecorded_nvidia_parts_take_the_median_share_and_other_vendors_none():
    from trainfit.core.machines.gpu_catalog import driver_reserved_bytes

    recorded = [g for g in all_gpus() if g.driver_reserved_bytes]
    assert len(recorded) >= 12
    shares = sorted(g.driver_reserved_bytes / g.usable_vram_bytes for g in recorded)
    assert 0.004 < shares[0] and shares[-1] < 0.03  # 0.5-2.8 % of the total on every recorded part
    a100_40 = get_gpu("a100-40gb")
    assert a100_40.driver_reserved_bytes is None
    assert shares[0] * a100_40.usable_vram_bytes <= driver_reserved_bytes(a100_40) <= shares[-1] * a100_40.usable_vram_bytes
    assert driver_reserved_bytes(get_gpu("mi300x")) == 0
    assert gpu_capacity(resolve_hardware("m2-16gb")) == resolve_hardware("m2-16gb").gpus[0].vram_free_bytes


def test_live_probe_reads_the_reserved_share_or_takes_the_catalog_one():
    from trainfit.hardware.fakes import load_fixture_data, sources_from_data
    from trainfit.hardware.profiler import build_profile

    fixtures = Path(__file__).parents[1] / "hardware" / "fixtures"
    base = load_fixture_data(fixtures / "desktop-rtx4090.yaml")
    catalog_cap = gpu_capacity(resolve_hardware("rtx-4090"))

    def live(memory):
        data = copy.deepcopy(base)
        data["nvml"]["devices"][0]["memory"] = memory
        return build_profile(sources=sources_from_data(data), quick=True)

    total = 24564 * MIB
    # NVML v2 answers: its figure wins (this board's driver keeps 300 MiB)
    p = live({"total": total, "free": total - 400 * MIB, "reserved": 300 * MIB})
    assert p.gpus[0].vram_reserved_bytes == 300 * MIB and gpu_capacity(p) == total - 300 * MIB
    # no v2 call, same total as the catalog's: the catalog's recorded share (354 MiB)
    p = live({"total": total, "free": total - 400 * MIB})
    assert p.gpus[0].vram_reserved_bytes == 354 * MIB and gpu_capacity(p) == catalog_cap
    # an older driver that already leaves its share out of the total: nothing subtracted twice
    p = live({"total": 24210 * MIB, "free": 24000 * MIB})
    assert p.gpus[0].vram_reserved_bytes is None and "v2" in "".join(p.gpus[0].unavailable.values())
    assert gpu_capacity(p) == 24210 * MIB


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
    (("driver_total_mib: 15360", "driver_total_mib: 15360\n    driver_reserved_mib: 2000"), "10 % or more"),
    (("driver_total_mib: 15360", "driver_total_mib: 15360\n    driver_reserved_mib: -3"), "positive whole number"),
])
def test_driver_total_is_validated(change, message):
    assert parse_catalog(GOOD).gpus[0].driver_total_bytes == 15360 * MIB
    with pytest.raises(CatalogError) as exc:
        parse_catalog(GOOD.replace(*change))
    assert message in str(exc.value)
