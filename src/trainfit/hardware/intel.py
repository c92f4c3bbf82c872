"""Intel GPUs (Arc, Data Center GPU Max/Flex): torch.xpu when torch is already loaded, else
the i915 / xe DRM sysfs files.

Importing torch costs 1-2 s, so the profiler never imports it for this: torch.xpu is asked only
when torch is already in the process (e.g. during training). sysfs gives the device id (the
name comes from the PCI id table here, then the GPU catalog), the PCIe link and hwmon.
"""

from __future__ import annotations

from typing import Any

from trainfit.core.machines.profile import GpuInfo
from trainfit.hardware.drm import DrmCard, hwmon, list_cards, pcie_link
from trainfit.hardware.gpu_common import failed_gpu, make_gpu
from trainfit.hardware.sources import Sources, read_int

INTEL_VENDOR = "0x8086"
# Discrete and data-centre parts (pci.ids, https://pci-ids.ucw.cz/read/PC/8086). Integrated GPUs
# (UHD / Iris Xe) are not listed: they are skipped as training devices.
DEVICE_NAMES = {
    "0x56a0": "Intel Arc A770", "0x56a1": "Intel Arc A750", "0x56a2": "Intel Arc A580",
    "0x56a5": "Intel Arc A380", "0x56a6": "Intel Arc A310", "0xe20b": "Intel Arc B580",
    "0xe20c": "Intel Arc B570", "0x56c0": "Intel Data Center GPU Flex 170",
    "0x56c1": "Intel Data Center GPU Flex 140", "0x0bd5": "Intel Data Center GPU Max 1550",
    "0x0bda": "Intel Data Center GPU Max 1100", "0x7d55": "Intel Arc Graphics (Meteor Lake)",
    "0x7dd5": "Intel Arc Graphics (Meteor Lake)", "0x64a0": "Intel Arc 140V (Lunar Lake)",
}
# These are integrated in the CPU package and share system RAM.
_INTEGRATED = {"0x7d55", "0x7dd5", "0x64a0"}


def _sysfs_gpu(src: Sources, card: DrmCard, index: int) -> GpuInfo:
    dev = card.device_dir
    link, reasons = pcie_link(src, dev)
    sensors, sensor_reasons = hwmon(src, dev)
    reasons.update(sensor_reasons)
    # The intel-i915-dkms driver (Arc/Flex) exposes local memory; the upstream driver does not.
    total = read_int(src.fs, f"/sys/class/drm/{card.card}/lmem_total_bytes")
    avail = read_int(src.fs, f"/sys/class/drm/{card.card}/lmem_avail_bytes")
    no_lmem = f"{card.driver or 'the driver'} exposes no local-memory size in sysfs (torch.xpu not loaded)"
    if total is None:
        reasons["vram_total_bytes"] = no_lmem
    if avail is None:
        reasons["vram_free_bytes"] = no_lmem
    cur = read_int(src.fs, f"/sys/class/drm/{card.card}/gt_act_freq_mhz")
    top = read_int(src.fs, f"/sys/class/drm/{card.card}/gt_max_freq_mhz")
    if cur is None:
        reasons["clock_sm_mhz"] = "gt_act_freq_mhz not readable"
    if top is None:
        reasons["clock_sm_max_mhz"] = "gt_max_freq_mhz not readable"
    reasons.update({"mig_mode": "NVIDIA only", "driver_version": f"{card.driver} is in-kernel (see os.release)",
                    "throttle_reasons": "needs Level Zero Sysman / xpu-smi",
                    "uuid": "not exposed in sysfs"})
    return make_gpu(
        index=index, vendor="intel", name=DEVICE_NAMES.get(card.device_id, f"Intel GPU {card.device_id}"),
        unified_memory=card.device_id in _INTEGRATED, reasons=reasons,
        default_reason=f"not exposed by {card.driver or 'the driver'} in sysfs", pci_bus_id=card.pci_bus_id,
        vram_total_bytes=total, vram_free_bytes=avail, clock_sm_mhz=float(cur) if cur is not None else None,
        clock_sm_max_mhz=float(top) if top is not None else None, **link, **sensors,
    )


def _torch_gpus(torch: Any) -> list[GpuInfo]:
    gpus = []
    for i in range(torch.xpu.device_count()):
        try:
            props = torch.xpu.get_device_properties(i)
        except Exception as exc:  # one device the runtime cannot describe keeps its place in the list
            gpus.append(failed_gpu(index=i, vendor="intel", name=f"Intel GPU {i}", exc=exc, what=f"torch.xpu device {i}"))
            continue
        reasons = {"mig_mode": "NVIDIA only"}
        try:
            free, total = (int(v) for v in torch.xpu.mem_get_info(i))
        except Exception as exc:  # memory unknown (None with the reason), never 0
            free = total = None
            reasons["vram_total_bytes"] = reasons["vram_free_bytes"] = (
                f"torch.xpu.mem_get_info failed: {type(exc).__name__}: {exc}")
        gpus.append(make_gpu(
            index=i, vendor="intel", name=str(props.name), unified_memory=False,
            reasons=reasons, default_reason="not reported by torch.xpu",
            vram_total_bytes=total, vram_free_bytes=free,
            driver_version=str(getattr(props, "driver_version", "")) or None,
        ))
    return gpus


def probe_intel_gpus(src: Sources) -> tuple[list[GpuInfo], dict[str, str]]:
    torch = src.torch()
    if torch is not None and hasattr(torch, "xpu"):
        try:
            if torch.xpu.is_available():
                return _torch_gpus(torch), {}
        except Exception:
            pass  # an XPU runtime problem: sysfs below still names the cards
    cards = [c for c in list_cards(src, INTEL_VENDOR)
             if c.device_id in DEVICE_NAMES or (c.driver == "xe")]
    if not cards:
        return [], {"intel": "no Intel Arc / Data Center GPU in /sys/class/drm"}
    gpus = []
    for i, card in enumerate(cards):
        try:
            gpus.append(_sysfs_gpu(src, card, i))
        except Exception as exc:  # one card's odd sysfs answer must not cost the other cards
            gpus.append(failed_gpu(index=i, vendor="intel", name=DEVICE_NAMES.get(card.device_id, f"Intel GPU {i}"),
                                   exc=exc, what=card.device_dir))
    return gpus, {}
