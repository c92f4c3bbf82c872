"""Shared sysfs readers for DRM GPUs (AMD amdgpu, Intel i915/xe): cards, PCIe link, hwmon.

Kernel ABI: Documentation/ABI/testing/sysfs-bus-pci (current_link_speed/width),
Documentation/hwmon/sysfs-interface.rst (temp*_input in milli-degC, power*_average/_input/_cap
in micro-watts), Documentation/gpu/amdgpu/driver-misc.rst (mem_info_vram_*, pp_dpm_*).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from trainfit.hardware.sources import Sources, read_int, read_text

# PCIe transfer rate (GT/s) -> generation
_GTS_TO_GEN = {"2.5": 1, "5.0": 2, "5": 2, "8.0": 3, "8": 3, "16.0": 4, "16": 4, "32.0": 5,
               "32": 5, "64.0": 6, "64": 6}


@dataclass(frozen=True)
class DrmCard:
    card: str  # "card0"
    device_dir: str  # "/sys/class/drm/card0/device"
    vendor_id: str  # "0x1002"
    device_id: str  # "0x74a1"
    pci_bus_id: str | None  # "0000:c1:00.0"
    driver: str | None  # "amdgpu", "i915", "xe"


def list_cards(src: Sources, vendor_id: str) -> list[DrmCard]:
    """GPU cards of one PCI vendor (connectors like card0-DP-1 and render nodes skipped)."""
    try:
        names = src.fs.listdir("/sys/class/drm")
    except OSError:
        return []
    cards = []
    for name in names:
        if not re.fullmatch(r"card\d+", name):
            continue
        dev = f"/sys/class/drm/{name}/device"
        if (read_text(src.fs, f"{dev}/vendor") or "").lower() != vendor_id:
            continue
        real = src.fs.realpath(dev)
        bus = posixpath.basename(real)
        driver = posixpath.basename(src.fs.realpath(f"{dev}/driver")) if src.fs.exists(f"{dev}/driver") else None
        cards.append(DrmCard(name, dev, vendor_id, (read_text(src.fs, f"{dev}/device") or "").lower(),
                             bus if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d", bus) else None,
                             driver))
    return sorted(cards, key=lambda c: int(c.card[4:]))


def pcie_link(src: Sources, dev: str) -> tuple[dict[str, int | None], dict[str, str]]:
    """pcie_gen / pcie_width (current and max) from PCI sysfs."""
    values: dict[str, int | None] = {}
    reasons: dict[str, str] = {}
    for field, name, conv in (("pcie_gen", "current_link_speed", _gen), ("pcie_width", "current_link_width", _int),
                              ("pcie_gen_max", "max_link_speed", _gen), ("pcie_width_max", "max_link_width", _int)):
        text = read_text(src.fs, f"{dev}/{name}")
        values[field] = conv(text) if text else None
        if values[field] is None:
            reasons[field] = f"{name} not readable in sysfs" if text is None else f"{name}={text!r} not understood"
    return values, reasons


def _gen(text: str) -> int | None:
    match = re.match(r"([\d.]+)\s*GT/s", text)
    return _GTS_TO_GEN.get(match.group(1)) if match else None


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def hwmon(src: Sources, dev: str) -> tuple[dict[str, float | None], dict[str, str]]:
    """temperature_c, temperature_slowdown_c, power_draw_watts, power_limit_watts from hwmon."""
    values: dict[str, float | None] = {k: None for k in ("temperature_c", "temperature_slowdown_c",
                                                         "power_draw_watts", "power_limit_watts")}
    try:
        dirs = [d for d in src.fs.listdir(f"{dev}/hwmon") if d.startswith("hwmon")]
    except PermissionError:
        return values, {k: f"no permission: {dev}/hwmon" for k in values}
    except OSError:
        return values, {k: "no hwmon for this GPU in sysfs" for k in values}
    reasons: dict[str, str] = {}
    base = f"{dev}/hwmon/{dirs[0]}" if dirs else ""
    for field, files, scale in (("temperature_c", ("temp1_input",), 1e-3),
                                ("temperature_slowdown_c", ("temp1_crit", "temp2_crit"), 1e-3),
                                ("power_draw_watts", ("power1_average", "power1_input"), 1e-6),
                                ("power_limit_watts", ("power1_cap",), 1e-6)):
        for name in files:
            raw = read_int(src.fs, f"{base}/{name}") if base else None
            if raw is not None:
                values[field] = round(raw * scale, 1)
                break
        else:
            reasons[field] = f"hwmon has no {' / '.join(files)}"
    return values, reasons
