"""The GPU catalog loads, validates, covers the required families and matches datasheet figures."""

from __future__ import annotations

import pytest

from trainfit.core.machines.gpu_catalog import (
    GIB, CatalogError, all_gpus, find_gpu, get_gpu, normalise_name, parse_catalog,
)  # fmt: skip
from trainfit.errors import BadInputError


def test_catalog_has_at_least_60_entries_each_fully_sourced():
    gpus = all_gpus()
    assert len(gpus) >= 60
    for g in gpus:
        for fig in ("vram_gib", "memory_bandwidth_gbps", "peak_tflops", "tdp_watts"):
            assert g.sources[fig].startswith("https://"), (g.id, fig)
        if g.compute_capability:
            assert g.sources["compute_capability"].startswith("http")
        assert "fp32" in g.peak_tflops and g.vram_bytes > 0 and g.tdp_watts > 0
        # dense tensor rates never exceed 64x the FP32 rate (a sparse figure would show as 2x)
        for prec, tf in g.peak_tflops.items():
            assert tf <= 128 * g.peak_tflops["fp32"], (g.id, prec)
    assert len({g.id for g in gpus}) == len(gpus)


REQUIRED_IDS = [
    # NVIDIA consumer, laptop, workstation, data centre
    "gtx-1060", "gtx-1080-ti", "gtx-1650", "gtx-1660-super", "rtx-2060", "rtx-2080-ti",
    "rtx-3060", "rtx-3090", "rtx-4060", "rtx-4060-ti-16gb", "rtx-4070", "rtx-4080", "rtx-4090",
    "rtx-5060-ti-16gb", "rtx-5070", "rtx-5080", "rtx-5090", "rtx-3060-laptop", "rtx-4090-laptop",
    "rtx-a4000", "rtx-a5000", "rtx-a6000", "rtx-6000-ada", "t4", "v100-16gb", "v100-32gb",
    "a10g", "a10", "l4", "l40s", "a100-40gb", "a100-80gb", "a100-40gb-pcie", "a100-80gb-pcie",
    "h100-pcie", "h100-sxm", "h200", "b200",
    # AMD
    "rx-6800-xt", "rx-7900-xtx", "rx-9070-xt", "mi100", "mi210", "mi250x", "mi300x", "mi325x",
    # Intel
    "arc-a770", "arc-a750", "arc-b580", "max-1100", "max-1550",
    # Apple base / Pro / Max / Ultra, M1-M4
    "m1-8gb", "m1-pro-16gb", "m1-max-32gb", "m1-ultra-64gb", "m2-16gb", "m2-pro-16gb",
    "m2-max-32gb", "m2-ultra-192gb", "m3-8gb", "m3-pro-18gb", "m3-max-36gb", "m3-ultra-96gb",
    "m4-16gb", "m4-pro-24gb", "m4-max-128gb",
]  # fmt: skip


def test_required_families_present():
    ids = {g.id for g in all_gpus()}
    assert not [i for i in REQUIRED_IDS if i not in ids]
    assert all(g.unified_memory for g in all_gpus() if g.vendor == "apple")


# Datasheet figures; tolerance 1 % (rounding in the vendors' own tables).
SPOT_CHECKS = [
    # NVIDIA H100 datasheet: SXM5 BF16 1979 TFLOPS with sparsity -> 989 dense; 3.35 TB/s; 700 W
    ("h100-sxm", 80, 3350, "bf16", 989.4, 700),
    # Ada whitepaper / product page: RTX 4090 24 GB, 1008 GB/s, 450 W, FP16 (FP32 acc.) 165.2
    ("rtx-4090", 24, 1008, "fp16", 165.2, 450),
    # A100 datasheet: 80GB SXM 2039 GB/s, BF16 312 dense, 400 W
    ("a100-80gb", 80, 2039, "bf16", 312, 400),
    ("a100-40gb-pcie", 40, 1555, "tf32", 156, 250),
    # AMD MI300X: 192 GB HBM3, 5.3 TB/s, BF16 1307.4 dense, 750 W
    ("mi300x", 192, 5300, "bf16", 1307.4, 750),
    # T4 datasheet: 16 GB, 320 GB/s, FP16 mixed 65 TFLOPS, 70 W
    ("t4", 16, 320, "fp16", 65, 70),
    # L4: 24 GB, 300 GB/s, FP8 485 sparse -> 242.5 dense, 72 W
    ("l4", 24, 300, "fp8", 242.5, 72),
    # Apple M2: 100 GB/s unified memory, 3.6 TFLOPS
    ("m2-16gb", 16, 100, "fp32", 3.6, 50),
]


@pytest.mark.parametrize("gid,vram_gib,bw,prec,tflops,tdp", SPOT_CHECKS)
def test_figures_match_datasheets(gid, vram_gib, bw, prec, tflops, tdp):
    g = get_gpu(gid)
    assert g.vram_bytes == vram_gib * GIB
    assert g.memory_bandwidth_gbps == pytest.approx(bw, rel=0.01)
    assert g.peak_tflops[prec] == pytest.approx(tflops, rel=0.01)
    assert g.tdp_watts == pytest.approx(tdp, rel=0.01)


def test_precision_support_follows_hardware():
    assert "bf16" not in get_gpu("t4").peak_tflops  # Turing has no BF16
    assert "bf16" not in get_gpu("v100-16gb").peak_tflops
    assert "fp8" in get_gpu("h100-sxm").peak_tflops and "fp8" not in get_gpu("a100-80gb").peak_tflops
    assert "fp4" in get_gpu("b200").peak_tflops
    assert "bf16" not in get_gpu("m1-8gb").peak_tflops and "bf16" in get_gpu("m2-8gb").peak_tflops
    assert get_gpu("gtx-1080").peak_tflops["fp16"] < get_gpu("gtx-1080").peak_tflops["fp32"] / 32
    assert get_gpu("h100-sxm").interconnect == "nvlink-4" and get_gpu("h100-sxm").interconnect_gbps == 900


# (reported name, reported memory in bytes or None, expected id): NVML, amdsmi, sysctl, lspci.
DETECTED = [
    ("NVIDIA H100 80GB HBM3", 81559 << 20, "h100-sxm"),
    ("NVIDIA H100 PCIe", 81559 << 20, "h100-pcie"),
    ("NVIDIA A100-SXM4-80GB", 81920 << 20, "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", 40960 << 20, "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", None, "a100-40gb-pcie"),
    ("NVIDIA A100 80GB PCIe", None, "a100-80gb-pcie"),
    ("Tesla T4", 15360 << 20, "t4"),
    ("Tesla V100-SXM2-32GB", None, "v100-32gb"),
    ("NVIDIA A10G", 23028 << 20, "a10g"),
    ("NVIDIA GeForce RTX 4090", 24564 << 20, "rtx-4090"),
    ("GeForce RTX 4090", None, "rtx-4090"),  # older drivers omit the vendor
    ("NVIDIA GeForce RTX 3060 Laptop GPU", 6144 << 20, "rtx-3060-laptop"),
    ("NVIDIA GeForce RTX 4090 Laptop GPU", 16376 << 20, "rtx-4090-laptop"),
    ("NVIDIA GeForce RTX 4060 Ti", 16380 << 20, "rtx-4060-ti-16gb"),
    ("NVIDIA GeForce RTX 4060 Ti", 8188 << 20, "rtx-4060-ti-8gb"),
    ("NVIDIA RTX 6000 Ada Generation", None, "rtx-6000-ada"),
    ("NVIDIA Corporation AD102 [GeForce RTX 4090] (rev a1)", None, "rtx-4090"),
    ("AMD Instinct MI300X", 205822885888, "mi300x"),
    ("AMD Instinct MI250X/MI250", 64 * GIB, "mi250x-gcd"),
    ("AMD Radeon RX 7900 XTX", None, "rx-7900-xtx"),
    ("Advanced Micro Devices, Inc. [AMD/ATI] Navi 31 [Radeon RX 7900 XT/7900 XTX]", 24 * GIB, "rx-7900-xtx"),
    ("Advanced Micro Devices, Inc. [AMD/ATI] Navi 31 [Radeon RX 7900 XT/7900 XTX]", 20 * GIB, "rx-7900-xt"),
    ("Intel(R) Arc(TM) A770 Graphics", None, "arc-a770"),
    ("Intel(R) Data Center GPU Max 1550", None, "max-1550"),
    ("Apple M2", 8 * GIB, "m2-8gb"),
    ("Apple M2", 16 * GIB, "m2-16gb"),
    ("Apple M2", 24 * GIB, "m2-24gb"),
    ("Apple M2 Pro", 32 * GIB, "m2-pro-32gb"),
    ("Apple M3 Max", 36 * GIB, "m3-max-36gb"),
    ("Apple M4 Max", 128 * GIB, "m4-max-128gb"),
]


@pytest.mark.parametrize("name,vram,expected", DETECTED)
def test_find_gpu_on_reported_names(name, vram, expected):
    found = find_gpu(name, vram)
    assert found is not None and found.id == expected


def test_find_gpu_unknown_and_empty():
    assert find_gpu("Matrox G200eW") is None
    assert find_gpu("") is None
    assert find_gpu("NVIDIA GeForce RTX 9999") is None


def test_normalise_name_folds_vendor_words():
    assert normalise_name("NVIDIA GeForce RTX 3060 Laptop GPU") == "rtx 3060 laptop"
    assert normalise_name("Intel(R) Arc(TM) A770 Graphics") == "arc a770"


def test_get_gpu_by_id_alias_and_bad_id():
    assert get_gpu("RTX-4090").id == "rtx-4090"
    assert get_gpu("NVIDIA H100 80GB HBM3").id == "h100-sxm"
    with pytest.raises(BadInputError) as exc:
        get_gpu("rtx-4090x")
    assert "rtx-4090" in str(exc.value)
    with pytest.raises(BadInputError) as exc:
        get_gpu("Apple M2")  # three memory variants: the error lists them
    assert "m2-16gb" in str(exc.value)


GOOD_ENTRY = """
refs: {ds: https://example.com/datasheet}
gpus:
  - id: test-gpu
    name: Test GPU
    vendor: nvidia
    gpu_class: datacenter
    architecture: hopper
    compute_capability: "9.0"
    matrix_unit: tensor-core-4
    vram_gib: 80
    memory_bandwidth_gbps: 3350
    peak_tflops: {fp32: 67, bf16: 989}
    tdp_watts: 700
    pcie_gen: 5
    aliases: []
    sources: {all: ds}
"""


def test_parse_catalog_accepts_a_valid_entry():
    cat = parse_catalog(GOOD_ENTRY)
    assert cat.gpus[0].sources["tdp_watts"] == "https://example.com/datasheet"


@pytest.mark.parametrize(
    "change,message",
    [
        (("sources: {all: ds}", "sources: {vram_gib: ds}"), "'tdp_watts' has no source"),
        (("sources: {all: ds}", "sources: {all: nowhere}"), "neither a URL nor a name"),
        (("vendor: nvidia", "vendor: nvidya"), "vendor"),
        (("tdp_watts: 700", "tdp_watts: -1"), "tdp_watts"),
        (("peak_tflops: {fp32: 67, bf16: 989}", "peak_tflops: {fp32: 67, bf17: 1}"), "peak_tflops.bf17"),
        (('compute_capability: "9.0"', "compute_capability: 9.0"), "compute_capability"),
        (("pcie_gen: 5", "pcie_gen: 5\n    speed: fast"), "unknown key 'speed'"),
    ],
)
def test_parse_catalog_names_entry_and_key(change, message):
    text = GOOD_ENTRY.replace(*change)
    with pytest.raises(CatalogError) as exc:
        parse_catalog(text)
    assert "gpu 'test-gpu'" in str(exc.value) and message in str(exc.value)


def test_parse_catalog_reports_duplicates_and_bad_yaml():
    doubled = GOOD_ENTRY + GOOD_ENTRY.split("gpus:\n", 1)[1]
    with pytest.raises(CatalogError, match="duplicate id"):
        parse_catalog(doubled)
    with pytest.raises(CatalogError, match="not valid YAML"):
        parse_catalog("gpus: [")
