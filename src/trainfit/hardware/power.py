"""Power and thermals: battery / AC, CPU package power (RAPL), thermal zones, throttle
counters, and the verdicts built on them (cooling adequacy, PSU headroom).

`read_power` does the I/O (run by the profiler in parallel with the other probes);
`assess_power` combines it with the GPUs' NVML clock-event reasons and TDPs.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from trainfit.core.run.power import assumed_cpu_tdp_watts
from trainfit.core.machines.profile import CpuInfo, GpuInfo, PowerInfo, ThermalZone
from trainfit.hardware.sources import Sources, read_int, read_text

RAPL_WINDOW_SECONDS = 0.2
_RAPL = "/sys/class/powercap"
# Clock-event reasons that mean the GPU is held back by heat or power, not by being idle.
GPU_THROTTLE_NAMES = {"hw_thermal", "sw_thermal", "hw_slowdown", "hw_power_brake", "sw_power_cap"}
GPU_HEAT_NAMES = {"hw_thermal", "sw_thermal"}


@dataclass
class PowerReadings:
    on_ac: bool | None = None
    battery_present: bool = False
    battery_percent: float | None = None
    battery_seconds_left: float | None = None
    cpu_package_watts: float | None = None
    cpu_tdp_watts: float | None = None
    thermal_zones: list[ThermalZone] = field(default_factory=list)
    cpu_throttle_events: int | None = None
    reasons: dict[str, str] = field(default_factory=dict)


def read_battery(src: Sources, r: PowerReadings) -> None:
    try:
        bat = src.psutil.sensors_battery()
    except Exception as exc:  # psutil raises on some broken ACPI tables
        bat, r.reasons["battery_percent"] = None, f"battery read failed: {exc}"
    ac_online = None
    try:
        supplies = src.fs.listdir("/sys/class/power_supply")
    except OSError:
        supplies = []
    for name in supplies:
        kind = read_text(src.fs, f"/sys/class/power_supply/{name}/type")
        if kind == "Mains":
            online = read_int(src.fs, f"/sys/class/power_supply/{name}/online")
            ac_online = bool(online) if online is not None else ac_online
    if bat is None:
        r.battery_present = False
        r.on_ac = True if ac_online is None else ac_online
        r.reasons.setdefault("battery_percent", "no battery (desktop or server)")
        r.reasons["battery_seconds_left"] = "no battery (desktop or server)"
        return
    r.battery_present = True
    r.battery_percent = float(bat.percent)
    r.on_ac = bat.power_plugged if bat.power_plugged is not None else ac_online
    if r.on_ac is None:
        r.reasons["on_ac"] = "the OS does not say whether AC is plugged in"
    secs = bat.secsleft
    # psutil sentinels: POWER_TIME_UNLIMITED (-2) when charging, POWER_TIME_UNKNOWN (-1)
    if isinstance(secs, (int, float)) and secs >= 0 and not r.on_ac:
        r.battery_seconds_left = float(secs)
    else:
        r.reasons["battery_seconds_left"] = "on AC power" if r.on_ac else "the OS gives no estimate"


def _rapl(src: Sources, r: PowerReadings, window_s: float) -> None:
    try:
        zones = [z for z in src.fs.listdir(_RAPL) if re.fullmatch(r"intel-rapl:\d+", z)]
    except OSError:
        zones = []
    packages = [z for z in zones if (read_text(src.fs, f"{_RAPL}/{z}/name") or "").startswith("package")]
    if not packages:
        why = "no RAPL powercap interface (not an Intel/AMD Zen CPU, or a virtual machine)"
        r.reasons["cpu_package_watts"] = r.reasons["cpu_tdp_watts"] = why
        return
    limits = [read_int(src.fs, f"{_RAPL}/{z}/constraint_0_power_limit_uw") for z in packages]
    if all(v for v in limits):
        # constraint_0 is the long-term limit (PL1), which the vendor sets to the TDP
        r.cpu_tdp_watts = sum(limits) / 1e6  # type: ignore[arg-type]
    else:
        r.reasons["cpu_tdp_watts"] = "RAPL long-term power limit not readable"
    try:
        first = [int(src.fs.read(f"{_RAPL}/{z}/energy_uj")) for z in packages]
        t0 = time.perf_counter()
        src.sleep(window_s)
        second = [int(src.fs.read(f"{_RAPL}/{z}/energy_uj")) for z in packages]
        elapsed = max(time.perf_counter() - t0, window_s)
    except PermissionError:
        r.reasons["cpu_package_watts"] = "no permission: RAPL energy_uj is root-only (2020 PLATYPUS mitigation)"
        return
    except (OSError, ValueError) as exc:
        r.reasons["cpu_package_watts"] = f"RAPL energy_uj unreadable: {exc}"
        return
    total_uj = 0
    for z, a, b in zip(packages, first, second):
        delta = b - a
        if delta < 0:  # the counter wrapped around max_energy_range_uj
            delta += read_int(src.fs, f"{_RAPL}/{z}/max_energy_range_uj") or 0
        total_uj += max(0, delta)
    r.cpu_package_watts = round(total_uj / 1e6 / elapsed, 1)


def _thermal(src: Sources, r: PowerReadings) -> None:
    try:
        names = [z for z in src.fs.listdir("/sys/class/thermal") if z.startswith("thermal_zone")]
    except OSError:
        names = []
    for z in names:
        base = f"/sys/class/thermal/{z}"
        temp = read_int(src.fs, f"{base}/temp")
        if temp is None:
            continue
        critical = None
        for i in range(16):
            kind = read_text(src.fs, f"{base}/trip_point_{i}_type")
            if kind is None:
                break
            if kind == "critical":
                crit = read_int(src.fs, f"{base}/trip_point_{i}_temp")
                critical = crit / 1000 if crit else None
        r.thermal_zones.append(ThermalZone(read_text(src.fs, f"{base}/type") or z, temp / 1000, critical))
    try:
        sensors = src.psutil.sensors_temperatures() if hasattr(src.psutil, "sensors_temperatures") else {}
    except Exception:
        sensors = {}
    for chip, entries in (sensors or {}).items():
        if chip in ("acpitz",):  # the same sensor as thermal_zone*
            continue
        for e in entries:
            r.thermal_zones.append(ThermalZone(f"{chip}/{e.label or 'temp'}", float(e.current),
                                               float(e.critical) if e.critical else None))
    counts = []
    try:
        cpus = [c for c in src.fs.listdir("/sys/devices/system/cpu") if re.fullmatch(r"cpu\d+", c)]
    except OSError:
        cpus = []
    for c in cpus:
        for kind in ("core_throttle_count", "package_throttle_count"):
            value = read_int(src.fs, f"/sys/devices/system/cpu/{c}/thermal_throttle/{kind}")
            if value is not None:
                counts.append(value)
    r.cpu_throttle_events = sum(counts) if counts else None


def read_power(src: Sources, window_s: float = RAPL_WINDOW_SECONDS) -> PowerReadings:
    r = PowerReadings()
    read_battery(src, r)
    if src.platform.system == "Linux":
        _rapl(src, r, window_s)
        _thermal(src, r)
    else:
        why = f"not readable on {src.platform.system} without elevated tools (powermetrics)"
        r.reasons["cpu_package_watts"] = r.reasons["cpu_tdp_watts"] = why
    return r


def _boards(gpus: list[GpuInfo]) -> list[GpuInfo]:
    """One entry per physical board (MIG slices share their board's power)."""
    seen, out = set(), []
    for g in gpus:
        key = g.pci_bus_id or f"#{g.index}"
        if key not in seen:
            seen.add(key)
            out.append(g)
    return out


def assess_power(r: PowerReadings, gpus: list[GpuInfo], cpu: CpuInfo, psu_watts: float | None) -> PowerInfo:
    reasons = dict(r.reasons)
    evidence: list[str] = []
    throttle: list[str] = []
    boards = _boards(gpus)

    # System TDP estimate: CPU + GPUs + the rest (board, RAM, disks, fans).
    apple = any(g.vendor == "apple" for g in boards)
    if r.cpu_tdp_watts is not None:
        cpu_w = r.cpu_tdp_watts
    elif apple and any(g.tdp_watts for g in boards):
        # The catalog's Apple figure is the whole machine's maximum wall power (CPU, GPU, SSD),
        # as in core.machines.hardware_spec: adding a CPU and a rest-of-system figure would count them twice.
        cpu_w = 0.0
        evidence.append("Apple silicon: CPU and the rest of the machine are inside the chip's power figure")
    else:
        cpu_w, cores = assumed_cpu_tdp_watts(cpu.physical_cores, cpu.logical_cores)
        evidence.append(f"CPU TDP unknown: assumed {cpu_w:.0f} W ({cores} cores x 10 W)")
    gpu_w = 0.0
    for g in boards:
        w = g.tdp_watts or g.power_limit_watts
        if w is None and g.vendor != "apple":
            evidence.append(f"GPU {g.index} TDP unknown: assumed 250 W")
            w = 250.0
        gpu_w += w or 0.0  # Apple: the GPU is inside the SoC figure
    rest = 0.0 if apple and cpu_w == 0.0 else 20.0 if r.battery_present else (100.0 if len(boards) > 1 else 50.0)
    system_w = cpu_w + gpu_w + rest

    # Throttling: the GPUs' clock-event reasons now, the CPU's counters since boot, zone temps.
    hot_gpu = False
    for g in gpus:
        active = sorted(set(g.throttle_reasons) & GPU_THROTTLE_NAMES)
        if active:
            throttle.append(f"GPU {g.index} clock events: {', '.join(active)}")
            hot_gpu |= bool(set(active) & GPU_HEAT_NAMES)
        if g.temperature_c is not None and g.temperature_slowdown_c is not None:
            margin = g.temperature_slowdown_c - g.temperature_c
            evidence.append(f"GPU {g.index} at {g.temperature_c:.0f} C, slowdown at {g.temperature_slowdown_c:.0f} C")
            hot_gpu |= margin < 5
    near_critical = [z for z in r.thermal_zones if z.critical_c and z.temperature_c >= z.critical_c - 10]
    for z in near_critical:
        throttle.append(f"{z.name} at {z.temperature_c:.0f} C, within 10 C of critical {z.critical_c:.0f} C")
    if r.cpu_throttle_events:
        # counted since boot: evidence about the cooling, not proof of throttling right now
        evidence.append(f"CPU thermal throttle events since boot: {r.cpu_throttle_events}")
    sensors_seen = bool(r.thermal_zones) or r.cpu_throttle_events is not None or any(
        g.temperature_c is not None or "throttle_reasons" not in g.unavailable for g in gpus)
    throttling: bool | None = bool(throttle) if sensors_seen else None
    if throttling is None:
        reasons["throttling"] = "no thermal sensor, throttle counter or GPU clock-event reason readable"

    hottest = max((z.temperature_c for z in r.thermal_zones), default=None)
    if hottest is not None:
        evidence.append(f"hottest sensor {hottest:.0f} C at the time of profiling")
    if hot_gpu or near_critical:
        verdict = "inadequate"
    elif r.cpu_throttle_events or (hottest is not None and hottest >= 80) or r.battery_present or any(
            set(g.throttle_reasons) & GPU_THROTTLE_NAMES for g in gpus):
        verdict = "marginal"
        if r.battery_present:
            evidence.append("laptop chassis: sustained training load usually reaches the thermal limit")
    elif sensors_seen:
        verdict = "adequate"
    else:
        verdict = "unknown"
        evidence.append("no temperature sensor readable (virtual machine or container)")

    if psu_watts is not None:
        headroom = psu_watts - system_w
    else:
        headroom = None
        # PSUs are most efficient and safe around 50-80 % load: size at 1.4 x the estimate
        evidence.append(f"PSU not stated: a {system_w * 1.4:.0f} W or larger supply is advisable")
    return PowerInfo(
        on_ac=r.on_ac, battery_percent=r.battery_percent, battery_seconds_left=r.battery_seconds_left,
        cpu_package_watts=r.cpu_package_watts, cpu_tdp_watts=r.cpu_tdp_watts,
        estimated_system_tdp_watts=round(system_w, 1), psu_watts=psu_watts,
        psu_headroom_watts=round(headroom, 1) if headroom is not None else None,
        psu_is_estimate=psu_watts is None, throttling=throttling, throttle_evidence=throttle,
        thermal_zones=r.thermal_zones, cooling_verdict=verdict, cooling_evidence=evidence,  # type: ignore[arg-type]
        unavailable=reasons,
    )


def power_unavailable(reason: str, gpus: list[GpuInfo], cpu: CpuInfo, psu_watts: float | None) -> PowerInfo:
    r = PowerReadings()
    for key in ("on_ac", "battery_percent", "battery_seconds_left", "cpu_package_watts", "cpu_tdp_watts"):
        r.reasons[key] = reason
    return assess_power(r, gpus, cpu, psu_watts)
