"""AMD GPUs: amdsmi when importable, else the amdgpu DRM sysfs files and hwmon.

amdsmi needs ROCm's libamd_smi.so of a matching version, so ImportError and OSError both mean
"fall back" (as Zeus does). The sysfs fallback works without any ROCm tools installed.
"""

from __future__ import annotations

import re
from typing import Any

from trainfit.core.machines.profile import GpuInfo
from trainfit.hardware.drm import DrmCard, hwmon, list_cards, pcie_link
from trainfit.hardware.gpu_common import failed_gpu, make_gpu
from trainfit.hardware.sources import Sources, read_int, read_text

AMD_VENDOR = "0x1002"
# PCI device ids -> product names (pci.ids, https://pci-ids.ucw.cz/read/PC/1002), used when
# the driver exposes no product_name.
DEVICE_NAMES = {
    "0x74a1": "AMD Instinct MI300X", "0x74a0": "AMD Instinct MI300A", "0x74a5": "AMD Instinct MI325X",
    "0x740f": "AMD Instinct MI210", "0x740c": "AMD Instinct MI250X/MI250", "0x738c": "AMD Instinct MI100",
    "0x744c": "AMD Radeon RX 7900 XTX", "0x7448": "AMD Radeon PRO W7900", "0x747e": "AMD Radeon RX 7800 XT",
    "0x73bf": "AMD Radeon RX 6900 XT", "0x73df": "AMD Radeon RX 6700 XT", "0x7550": "AMD Radeon RX 9070 XT",
}


def rocm_version(src: Sources) -> tuple[str | None, str | None]:
    text = read_text(src.fs, "/opt/rocm/.info/version")
    return (text.split("-")[0], None) if text else (None, "ROCm not installed (/opt/rocm/.info/version)")


def gfx_targets(src: Sources) -> dict[str, str]:
    """PCI bus id -> gfx target ("gfx942") from the KFD topology."""
    base = "/sys/class/kfd/kfd/topology/nodes"
    try:
        nodes = src.fs.listdir(base)
    except OSError:
        return {}
    found = {}
    for node in nodes:
        props = dict(line.split(None, 1) for line in (read_text(src.fs, f"{base}/{node}/properties") or "").splitlines()
                     if " " in line)
        version = int(props.get("gfx_target_version", "0"))
        if not version:
            continue  # a CPU node
        major, minor, step = version // 10000, version // 100 % 100, version % 100
        loc, domain = int(props.get("location_id", "0")), int(props.get("domain", "0"))
        bus = f"{domain:04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1f:02x}.{loc & 7}"
        found[bus] = f"gfx{major}{minor:x}{step:x}"
    return found


def _dpm(src: Sources, path: str) -> tuple[float | None, float | None]:
    """(current, max) MHz from a pp_dpm_* table ('1: 2100Mhz *')."""
    text = read_text(src.fs, path)
    if not text:
        return None, None
    levels = [(float(m.group(1)), "*" in line) for line in text.splitlines()
              if (m := re.search(r"(\d+)\s*Mhz", line, re.I))]
    current = next((mhz for mhz, star in levels if star), None)
    return current, max((mhz for mhz, _ in levels), default=None)


def _sysfs_gpu(src: Sources, card: DrmCard, index: int, rocm: tuple[str | None, str | None],
               targets: dict[str, str]) -> GpuInfo:
    dev = card.device_dir
    reasons: dict[str, str] = {}
    total = read_int(src.fs, f"{dev}/mem_info_vram_total")
    used = read_int(src.fs, f"{dev}/mem_info_vram_used")
    gtt = read_int(src.fs, f"{dev}/mem_info_gtt_total")
    if total is None:
        reasons["vram_total_bytes"] = reasons["vram_free_bytes"] = f"{dev}/mem_info_vram_total not readable"
    elif used is None:
        reasons["vram_free_bytes"] = f"{dev}/mem_info_vram_used not readable"
    name = read_text(src.fs, f"{dev}/product_name") or DEVICE_NAMES.get(card.device_id) or f"AMD GPU {card.device_id}"
    link, link_reasons = pcie_link(src, dev)
    sensors, sensor_reasons = hwmon(src, dev)
    sclk, sclk_max = _dpm(src, f"{dev}/pp_dpm_sclk")
    mclk, _ = _dpm(src, f"{dev}/pp_dpm_mclk")
    for field, value in (("clock_sm_mhz", sclk), ("clock_sm_max_mhz", sclk_max), ("clock_mem_mhz", mclk)):
        if value is None:
            reasons[field] = "pp_dpm_sclk/pp_dpm_mclk not readable"
    driver = read_text(src.fs, "/sys/module/amdgpu/version")
    # APUs report a small BIOS carve-out as VRAM and use system RAM through GTT
    unified = total is not None and total <= (2 << 30) and (gtt or 0) > total
    reasons.update(link_reasons)
    reasons.update(sensor_reasons)
    reasons.update({
        "uuid": "needs amdsmi", "throttle_reasons": "throttle status needs amdsmi (gpu_metrics)",
        "mig_mode": "NVIDIA only", "driver_version": "amdgpu is in-kernel (see os.release)",
        "architecture": "gfx target not in the KFD topology",
    })
    if rocm[1]:
        reasons["rocm_version"] = rocm[1]
    return make_gpu(
        index=index, vendor="amd", name=name, unified_memory=unified, reasons=reasons,
        default_reason="not exposed by amdgpu sysfs", pci_bus_id=card.pci_bus_id,
        vram_total_bytes=total, vram_free_bytes=(total - used) if total is not None and used is not None else None,
        architecture=targets.get(card.pci_bus_id or ""), clock_sm_mhz=sclk, clock_sm_max_mhz=sclk_max,
        clock_mem_mhz=mclk, driver_version=driver, rocm_version=rocm[0], **link, **sensors,
    )


def _amdsmi_gpus(src: Sources, smi: Any, rocm: tuple[str | None, str | None]) -> list[GpuInfo]:
    """GPUs through amdsmi; each call guarded since field names moved between ROCm releases, and
    each GPU guarded so one that answers unexpectedly does not cost the others."""
    smi.amdsmi_init()
    try:
        gpus = []
        for index, h in enumerate(smi.amdsmi_get_processor_handles()):
            try:
                gpus.append(_amdsmi_gpu(smi, h, index, rocm))
            except Exception as exc:
                gpus.append(failed_gpu(index=index, vendor="amd", name=f"AMD GPU {index}", exc=exc,
                                       what=f"GPU {index} through amdsmi"))
        return gpus
    finally:
        try:
            smi.amdsmi_shut_down()
        except Exception:
            pass


def _amdsmi_gpu(smi: Any, h: Any, index: int, rocm: tuple[str | None, str | None]) -> GpuInfo:
    reasons: dict[str, str] = {}

    def get(fn: str, *args: Any, want: type | None = None) -> Any:
        try:
            value = getattr(smi, fn)(h, *args)
        except Exception as exc:  # AmdSmiLibraryException and version drift
            reasons[fn] = f"{fn}: {type(exc).__name__}: {exc}"
            return None
        if want is not None and value is not None and not isinstance(value, want):
            reasons[fn] = f"{fn} returned {type(value).__name__}, expected {want.__name__}"
            return None
        return value

    asic = get("amdsmi_get_gpu_asic_info", want=dict) or {}
    vram = get("amdsmi_get_gpu_vram_usage", want=dict) or {}
    power = get("amdsmi_get_power_info", want=dict) or {}
    total = vram.get("vram_total")  # MiB in amdsmi
    used = vram.get("vram_used")
    draw = power.get("average_socket_power") or power.get("current_socket_power")
    cap = power.get("power_limit")
    gfx = asic.get("target_graphics_version")
    uuid, bdf = get("amdsmi_get_gpu_device_uuid", want=str), get("amdsmi_get_gpu_device_bdf", want=str)
    market = asic.get("market_name")
    # A call that raised names its error; one that answered without the field says so.
    field_reasons = {
        "vram_total_bytes": reasons.get("amdsmi_get_gpu_vram_usage", "amdsmi reported no vram_total"
                                        if total is None else f"amdsmi reported vram_total {total!r}"),
        "vram_free_bytes": reasons.get("amdsmi_get_gpu_vram_usage", "amdsmi reported no vram_used"
                                       if used is None else f"amdsmi reported vram_used {used!r}"),
        "power_draw_watts": reasons.get("amdsmi_get_power_info", "amdsmi reported no socket power"),
        "power_limit_watts": reasons.get("amdsmi_get_power_info", "amdsmi reported no power_limit"),
        "architecture": reasons.get("amdsmi_get_gpu_asic_info", "amdsmi reported no gfx target"),
        "uuid": reasons.get("amdsmi_get_gpu_device_uuid", "amdsmi reported no uuid"),
        "pci_bus_id": reasons.get("amdsmi_get_gpu_device_bdf", "amdsmi reported no PCI address"),
        "mig_mode": "NVIDIA only", "rocm_version": rocm[1] or "",
    }
    return make_gpu(
        index=index, vendor="amd", name=market if isinstance(market, str) and market else "AMD GPU",
        unified_memory=False,
        reasons={k: v for k, v in field_reasons.items() if v}, default_reason="not read through amdsmi",
        uuid=uuid, pci_bus_id=bdf,
        vram_total_bytes=int(total) << 20 if _mib(total) else None,
        vram_free_bytes=(int(total) - int(used)) << 20 if _mib(total) and _mib(used) and used <= total else None,
        power_draw_watts=float(draw) if isinstance(draw, (int, float)) else None,
        # amdsmi reports the cap in microwatts in ROCm 6.x
        power_limit_watts=float(cap) / 1e6 if isinstance(cap, (int, float)) and cap > 1e5 else
        (float(cap) if isinstance(cap, (int, float)) else None),
        architecture=gfx if isinstance(gfx, str) and gfx.startswith("gfx") else None,
        rocm_version=rocm[0],
    )


def _mib(value: Any) -> bool:
    """A finite, non-negative MiB figure (amdsmi answers "N/A" strings on some boards)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            and value == value and value != float("inf"))


def probe_amd_gpus(src: Sources) -> tuple[list[GpuInfo], dict[str, str]]:
    rocm = rocm_version(src)
    try:
        smi = src.amdsmi()
    except (ImportError, OSError, AttributeError):
        smi = None
    if smi is not None:
        try:
            gpus = _amdsmi_gpus(src, smi, rocm)
            if gpus:
                return gpus, {}
        except Exception:
            pass  # library/driver mismatch: the sysfs fallback below still works
    cards = list_cards(src, AMD_VENDOR)
    if not cards:
        return [], {"amd": "no AMD GPU in /sys/class/drm"}
    targets = gfx_targets(src)
    gpus = []
    for i, card in enumerate(cards):
        try:
            gpus.append(_sysfs_gpu(src, card, i, rocm, targets))
        except Exception as exc:  # one card's odd sysfs answer must not cost the other cards
            gpus.append(failed_gpu(index=i, vendor="amd", name=DEVICE_NAMES.get(card.device_id, f"AMD GPU {i}"),
                                   exc=exc, what=f"{card.device_dir}"))
    return gpus, {}
