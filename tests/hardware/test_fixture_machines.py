"""Each recorded machine yields a complete profile with the right values and reasons."""

import json

import pytest

from trainfit.core.machines.profile import HardwareProfile, missing_reasons

from .conftest import MACHINES

GIB = 1 << 30


@pytest.mark.parametrize("name", MACHINES)
def test_every_unknown_has_a_reason_and_json_round_trips(profiles, name):
    p = profiles[name]
    assert missing_reasons(p) == []
    assert p.source == f"fixture:{name}"
    assert HardwareProfile.from_json(p.to_json()) == p
    json.loads(p.to_json())  # plain JSON, no NaN


def test_cpu_only_vm_recorded_from_this_machine(profiles):
    p = profiles["cpu-only-vm"]
    assert p.gpus == [] and p.accelerator == "cpu"
    assert p.cpu.model == "AMD EPYC" and p.cpu.logical_cores == 2 and p.cpu.physical_cores == 2
    assert p.cpu.flags["avx512_bf16"] and p.cpu.flags["bf16"] and not p.cpu.flags["amx_bf16"]
    assert p.cpu.l2_cache_bytes == 2 * 1024 * 1024 and p.cpu.l3_cache_bytes == 32 << 20
    assert "no cpufreq" in p.cpu.unavailable["boost_clock_mhz"]
    assert p.storage[0].device == "vda" and "virtual disk" in p.storage[0].kind_reason
    assert p.power.cooling_verdict == "unknown" and p.power.throttling is None
    assert "NVML library not found" in p.unavailable["nvidia"]


def test_macbook_m2(profiles):
    p = profiles["macbook-m2-16gb"]
    (g,) = p.gpus
    assert g.vendor == "apple" and g.unified_memory and g.vram_total_bytes == 16 * GIB
    assert g.name == "Apple M2 (10-core GPU)" and g.architecture == "apple-m2"
    assert "bf16" in g.precisions
    assert p.memory.unified_with_gpu and p.backends.mps.available and p.accelerator == "mps"
    assert p.cpu.flags["neon"] and p.cpu.flags["bf16"] and p.cpu.physical_cores == 8
    assert p.cpu.l2_cache_bytes == 16 * 2**20 + 4 * 2**20
    assert "sudo" in g.unavailable["temperature_c"]
    # desktop OS reserve: max(1.5 GiB, 10 %)
    assert p.memory.os_reserve_bytes == int(1.6 * GIB)


def test_laptop_rtx3060_on_battery(profiles):
    p = profiles["laptop-rtx3060-battery"]
    (g,) = p.gpus
    assert g.name == "NVIDIA GeForce RTX 3060 Laptop GPU" and g.vram_total_bytes == 6 * GIB
    assert g.compute_capability == "8.6" and g.cuda_version == "12.2"
    assert g.throttle_reasons == ["gpu_idle", "sw_power_cap"]
    assert g.power_limit_watts is None and g.unavailable["power_limit_watts"] == "not supported"
    pw = p.power
    assert pw.on_ac is False and pw.battery_percent == 64.0 and pw.battery_seconds_left == 5400
    # RAPL counter wrapped: (4e6 - 262140e6 + 262143.33e6) uJ over the 0.2 s window
    assert pw.cpu_package_watts == pytest.approx(36.6, abs=0.1)
    assert pw.cpu_tdp_watts == 45.0 and pw.throttling is True
    assert pw.cooling_verdict == "marginal"
    assert any("throttle events since boot: 15" in e for e in pw.cooling_evidence)


def test_desktop_rtx4090(profiles):
    p = profiles["desktop-rtx4090"]
    (g,) = p.gpus
    assert g.vram_total_bytes == 25757220864 and g.pci_bus_id == "00000000:01:00.0"
    assert (g.pcie_gen, g.pcie_gen_max, g.pcie_width) == (1, 4, 16)
    assert g.power_limit_watts == 450 and g.temperature_slowdown_c == 87 and g.clock_sm_max_mhz == 3120
    assert g.mig_mode is None and "no MIG" in g.unavailable["mig_mode"]
    assert g.nvlink_peers == [] and g.throttle_reasons == ["gpu_idle"]
    assert "bf16" in g.precisions and "fp8" in g.precisions
    assert p.cpu.physical_cores == 16 and p.cpu.logical_cores == 32
    assert p.cpu.base_clock_mhz == 4500 and p.cpu.boost_clock_mhz == 5881
    assert p.cpu.l3_cache_bytes == 64 << 20  # 32 MiB per CCD x 2
    work, cache = p.storage
    assert (work.device, work.kind) == ("nvme0n1", "nvme")
    assert (cache.device, cache.kind, cache.path) == ("sda", "hdd", "/mnt/data/hf")
    assert "no permission" in p.power.unavailable["cpu_package_watts"]
    assert p.power.cpu_tdp_watts == 170 and p.power.cooling_verdict == "adequate"
    assert p.memory.swap_kind == "nvme"  # /swap.img on the NVMe root


def test_two_rtx4090_without_nvlink(profiles):
    p = profiles["2x-rtx4090"]
    assert [g.index for g in p.gpus] == [0, 1] and all(g.nvlink_peers == [] for g in p.gpus)
    assert all(g.pcie_width == 8 for g in p.gpus)
    # 170 W CPU + 2 x 450 W + 100 W rest
    assert p.power.estimated_system_tdp_watts == 1170


def test_8x_h100_nvlink_through_nvswitch(profiles):
    p = profiles["8x-h100-sxm"]
    assert len(p.gpus) == 8
    for g in p.gpus:
        assert g.nvlink_peers == [i for i in range(8) if i != g.index]
        assert g.compute_capability == "9.0" and g.mig_mode is False
    assert len(p.cpu.numa_nodes) == 2 and p.cpu.numa_nodes[1].cpus[0] == 56
    assert p.cpu.flags["amx_bf16"] and p.backends.cpu_amx
    # two packages: (70 + 68) J over 0.2 s
    assert p.power.cpu_package_watts == pytest.approx(690.0)
    work = p.storage[0]
    assert work.device == "md0 (nvme1n1+nvme2n1)" and work.kind == "nvme"
    assert p.memory.swap_kind == "none"


def test_a100_mig_slice_in_a_container(profiles):
    p = profiles["a100-mig-container"]
    (g,) = p.gpus
    assert g.mig_mode is True and g.mig_profile == "1g.10gb"
    assert g.uuid.startswith("MIG-") and g.vram_total_bytes == 10468982784
    assert p.os.in_container
    assert p.memory.cgroup_limit_bytes == 32 * GIB
    assert p.memory.available_bytes == 30 * GIB  # limit minus memory.current
    assert p.cpu.cgroup_cpu_quota == 4.0 and p.cpu.usable_cores == 4.0
    assert p.storage[0].device == "overlay"


def test_container_with_4gib_limit(profiles):
    p = profiles["container-4gib"]
    m = p.memory
    assert m.cgroup_limit_bytes == 4 * GIB and m.total_bytes == 64 * GIB
    # in a cgroup: reserve max(256 MiB, 5 % of the limit)
    assert m.os_reserve_bytes == 256 << 20 and m.usable_bytes == 4 * GIB - (256 << 20)
    assert m.available_bytes == 4 * GIB - 314572800
    assert p.cpu.usable_cores == 2.0
    cache = p.storage[1]
    assert cache.path == "/cache/hf" and cache.kind == "nvme" and cache.device == "nvme0n1"


def test_amd_mi300x_from_sysfs(profiles):
    p = profiles["amd-mi300x"]
    (g,) = p.gpus
    assert g.vendor == "amd" and g.name == "AMD Instinct MI300X" and g.architecture == "gfx942"
    assert g.vram_total_bytes == 206141652992 and g.vram_free_bytes == 206141652992 - 298844160
    assert g.pci_bus_id == "0000:0c:00.0" and (g.pcie_gen, g.pcie_width) == (5, 16)
    assert g.temperature_c == 41 and g.power_draw_watts == 132 and g.power_limit_watts == 750
    assert (g.clock_sm_mhz, g.clock_sm_max_mhz, g.clock_mem_mhz) == (500, 2100, 1300)
    assert g.rocm_version == "6.2.0" and p.backends.rocm.available and p.accelerator == "rocm"
    assert not g.unified_memory


def test_intel_arc_a770_skips_the_igpu(profiles):
    p = profiles["intel-arc-a770"]
    (g,) = p.gpus
    assert g.vendor == "intel" and g.name == "Intel Arc A770" and g.vram_total_bytes == 16 * GIB
    assert g.pcie_gen == 1 and g.power_limit_watts == 190 and g.clock_sm_max_mhz == 2400
    assert p.backends.xpu.available and p.accelerator == "xpu"


def test_gpu_catalog_fills_datasheet_fields(profiles):
    g = profiles["desktop-rtx4090"].gpus[0]
    if "catalog_id" in g.unavailable and "unavailable" in g.unavailable["catalog_id"]:
        pytest.skip("GPU catalog not installed")
    assert g.catalog_id == "rtx-4090" and g.tdp_watts and g.memory_bandwidth_gbps
    assert g.peak_tflops.get("bf16", 0) > 100
    mig = profiles["a100-mig-container"].gpus[0]
    board = profiles["8x-h100-sxm"].gpus[0]
    assert mig.catalog_id and mig.peak_tflops["bf16"] < 60  # 1/7 of an A100's 312
    assert board.catalog_id and board.peak_tflops["bf16"] > 900
