"""The amdsmi path of the AMD probe, with a fake amdsmi module (ROCm 6.x units)."""

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from trainfit.core.machines.profile import missing_reasons
from trainfit.hardware.amd import probe_amd_gpus
from trainfit.hardware.fakes import load_fixture

FIXTURE = Path(__file__).parent / "fixtures" / "amd-mi300x.yaml"
GIB_IN_MIB = 1024


def _fake_amdsmi(*, vram_fails=False, init_fails=False):
    calls = []

    def init():
        calls.append("init")
        if init_fails:
            raise OSError("libamd_smi.so: version mismatch")

    def vram(handle):
        if vram_fails:
            raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
        return {"vram_total": 192 * GIB_IN_MIB, "vram_used": 2 * GIB_IN_MIB}  # MiB

    module = SimpleNamespace(
        amdsmi_init=init,
        amdsmi_shut_down=lambda: calls.append("shutdown"),
        amdsmi_get_processor_handles=lambda: ["h0"],
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"},
        amdsmi_get_gpu_vram_usage=vram,
        amdsmi_get_power_info=lambda h: {"average_socket_power": 180, "power_limit": 750_000_000},  # W, uW
        amdsmi_get_gpu_device_uuid=lambda h: "uuid-0",
        amdsmi_get_gpu_device_bdf=lambda h: "0000:0c:00.0",
    )
    return module, calls


def _sources(module):
    return dataclasses.replace(load_fixture(FIXTURE), amdsmi=lambda: module)


def test_amdsmi_values_and_units():
    module, calls = _fake_amdsmi()
    gpus, reasons = probe_amd_gpus(_sources(module))
    (gpu,) = gpus
    assert gpu.name == "AMD Instinct MI300X" and gpu.architecture == "gfx942"
    assert gpu.vram_total_bytes == 192 << 30 and gpu.vram_free_bytes == 190 << 30
    assert gpu.power_limit_watts == 750.0 and gpu.power_draw_watts == 180.0
    assert gpu.pci_bus_id == "0000:0c:00.0" and gpu.uuid == "uuid-0"
    assert calls == ["init", "shutdown"]  # the library is always released
    assert missing_reasons(gpu) == []


def test_a_failing_call_names_its_error():
    module, _ = _fake_amdsmi(vram_fails=True)
    (gpu,), _ = probe_amd_gpus(_sources(module))
    assert gpu.vram_total_bytes is None
    assert "AMDSMI_STATUS_NOT_SUPPORTED" in gpu.unavailable["vram_total_bytes"]


def test_library_mismatch_falls_back_to_sysfs():
    module, _ = _fake_amdsmi(init_fails=True)
    gpus, _ = probe_amd_gpus(_sources(module))
    assert len(gpus) >= 1 and gpus[0].vram_total_bytes  # read from the DRM sysfs files instead
