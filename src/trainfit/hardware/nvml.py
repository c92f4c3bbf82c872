"""NVIDIA GPUs through NVML (nvidia-ml-py, module `pynvml`), imported lazily.

One gateway to the library (the nvitop habit): every call goes through `_call`, which turns an
NVML error into a reason ("not supported", "no permission", ...), so an unsupported field on a
laptop, WSL or a MIG slice is a value, not a crash. Never touches CUDA: NVML does not create a
CUDA context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainfit.core.profile import GpuInfo
from trainfit.hardware.gpu_common import make_gpu
from trainfit.hardware.sources import Sources

# Constants from nvml.h (kept here so a fake NVML needs only the functions).
TEMPERATURE_GPU = 0
THRESHOLD_SLOWDOWN = 1
CLOCK_SM = 1
CLOCK_MEM = 2
MAX_NVLINKS = 18
NVLINK_DEVICE_SWITCH = 2

# nvmlClocksEventReason* bits (nvml.h; the older "ThrottleReason" names have the same values).
CLOCK_EVENT_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal",
    0x80: "hw_power_brake", 0x100: "display_clock_setting",
}

# nvmlReturn_t codes -> the reason a user can act on.
ERROR_REASONS = {
    2: "invalid argument",
    3: "not supported",
    4: "no permission",
    6: "not found",
    9: "NVIDIA driver not loaded",
    10: "NVML call timed out",
    12: "NVML library not found (no NVIDIA driver, or a container without the NVIDIA runtime)",
    13: "not provided by this driver's NVML",
    15: "GPU is lost (fell off the bus; see dmesg for an Xid)",
    18: "Driver/library version mismatch (driver upgraded without a reboot?)",
}


def nvml_reason(exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if isinstance(code, int) and code in ERROR_REASONS:
        return ERROR_REASONS[code]
    return f"NVML error: {exc}"


def decode_clock_events(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit]


def precisions_for_cc(cc: str | None) -> list[str]:
    """Precisions with hardware support by compute capability (CUDA C Programming Guide, tensor
    core tables): fp16 from Pascal 6.0, int8 dp4a from 6.1, tf32/bf16 from Ampere 8.0, fp8 from
    Ada/Hopper 8.9, fp4 from Blackwell 10.0."""
    if not cc:
        return []
    try:
        major, minor = (int(x) for x in cc.split(".")[:2])
    except ValueError:
        return []
    v = major * 10 + minor
    table = [("fp32", 0), ("tf32", 80), ("fp16", 60), ("bf16", 80), ("int8", 61), ("fp8", 89), ("fp4", 100)]
    return [p for p, need in table if v >= need]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Reader:
    """Calls NVML functions by name; records the reason for each field it could not read."""

    def __init__(self, nv: Any):
        self.nv = nv

    def call(self, fn: str, *args: Any) -> tuple[Any, str | None]:
        func: Callable[..., Any] | None = getattr(self.nv, fn, None)
        if func is None:
            return None, "not provided by this nvidia-ml-py"
        try:
            return func(*args), None
        except Exception as exc:  # NVMLError and its subclasses; anything else is a reason too
            return None, nvml_reason(exc)


def _version(nv: Any) -> tuple[str | None, str | None, dict[str, str]]:
    r = _Reader(nv)
    reasons = {}
    driver, why = r.call("nvmlSystemGetDriverVersion")
    if why:
        reasons["driver_version"] = why
    cuda, why = r.call("nvmlSystemGetCudaDriverVersion_v2")
    if cuda is None:
        cuda, why = r.call("nvmlSystemGetCudaDriverVersion")
    if why:
        reasons["cuda_version"] = why
    # 12040 -> "12.4"
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
    return (_text(driver) if driver is not None else None), cuda_text, reasons


def _board_fields(r: _Reader, h: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Fields of the physical board (also reported for its MIG slices)."""
    values: dict[str, Any] = {}
    reasons: dict[str, str] = {}

    def put(field: str, fn: str, *args: Any, convert: Callable[[Any], Any] = lambda v: v) -> None:
        value, why = r.call(fn, h, *args)
        values[field] = convert(value) if value is not None else None
        if why:
            reasons[field] = why

    put("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", convert=lambda mw: mw / 1000)
    put("power_draw_watts", "nvmlDeviceGetPowerUsage", convert=lambda mw: mw / 1000)
    put("temperature_c", "nvmlDeviceGetTemperature", TEMPERATURE_GPU, convert=float)
    put("temperature_slowdown_c", "nvmlDeviceGetTemperatureThreshold", THRESHOLD_SLOWDOWN, convert=float)
    put("clock_sm_mhz", "nvmlDeviceGetClockInfo", CLOCK_SM, convert=float)
    put("clock_sm_max_mhz", "nvmlDeviceGetMaxClockInfo", CLOCK_SM, convert=float)
    put("clock_mem_mhz", "nvmlDeviceGetClockInfo", CLOCK_MEM, convert=float)
    put("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
    put("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
    put("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration")
    put("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")
    put("pci_bus_id", "nvmlDeviceGetPciInfo", convert=lambda info: _text(info.busId))
    put("compute_capability", "nvmlDeviceGetCudaComputeCapability", convert=lambda mm: f"{mm[0]}.{mm[1]}")
    mask, why = r.call("nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None and why and why.startswith("not provided"):  # drivers before 535 / old bindings
        mask, why = r.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    values["throttle_reasons"] = decode_clock_events(mask) if mask is not None else []
    if why:
        reasons["throttle_reasons"] = why
    mig, why = r.call("nvmlDeviceGetMigMode", h)
    values["mig_mode"] = bool(mig[0]) if mig is not None else None
    if why:
        reasons["mig_mode"] = why if why != "not supported" else "not supported (no MIG on this GPU)"
    return values, reasons


def _memory_fields(r: _Reader, h: Any, reasons: dict[str, str]) -> dict[str, Any]:
    info, why = r.call("nvmlDeviceGetMemoryInfo", h)
    if why:
        reasons["vram_total_bytes"] = reasons["vram_free_bytes"] = why
    uuid, why = r.call("nvmlDeviceGetUUID", h)
    if why:
        reasons["uuid"] = why
    return {"vram_total_bytes": int(info.total) if info else None,
            "vram_free_bytes": int(info.free) if info else None,
            "uuid": _text(uuid) if uuid is not None else None}


def _nvlink(r: _Reader, h: Any) -> tuple[set[str], bool]:
    """(bus ids of GPUs linked directly, whether any link goes to an NVSwitch)."""
    remote_ids: set[str] = set()
    switch = False
    for link in range(MAX_NVLINKS):
        state, why = r.call("nvmlDeviceGetNvLinkState", h, link)
        if why:
            break  # no NVLink, or past the last link
        if not state:
            continue
        kind, _ = r.call("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
        if kind == NVLINK_DEVICE_SWITCH:
            switch = True
            continue
        info, _ = r.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        if info is not None:
            remote_ids.add(_text(info.busId).lower())
    return remote_ids, switch


def _visible(gpus: list[GpuInfo], env: dict[str, str]) -> tuple[list[GpuInfo], str | None]:
    """Apply CUDA_VISIBLE_DEVICES (indices, GPU-/MIG- UUID prefixes); re-index in its order."""
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus, None
    chosen: list[GpuInfo] = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if item.lstrip("-").isdigit():
            if int(item) < 0:
                break  # CUDA stops at the first invalid entry
            match = [g for g in gpus if g.index == int(item) and g.mig_profile is None]
        else:
            match = [g for g in gpus if g.uuid and g.uuid.startswith(item)]
        if not match:
            break
        chosen.append(match[0])
    renumbered = [GpuInfo(**{**g.__dict__, "index": i}) for i, g in enumerate(chosen)]
    hidden = len(gpus) - len(chosen)
    return renumbered, (f"{hidden} NVIDIA GPU(s) hidden by CUDA_VISIBLE_DEVICES={spec!r}" if hidden else None)


def probe_nvidia_gpus(src: Sources) -> tuple[list[GpuInfo], dict[str, str]]:
    """All NVIDIA GPUs (MIG slices as separate entries) or ([], {"nvidia": reason})."""
    try:
        nv = src.nvml()
    except (ImportError, OSError) as exc:
        return [], {"nvidia": f"nvidia-ml-py not importable ({exc})"}
    try:
        nv.nvmlInit()
    except Exception as exc:
        return [], {"nvidia": nvml_reason(exc)}
    try:
        return _probe_initialised(src, nv)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass  # shutting down a library that misbehaved must not hide the results


def _probe_initialised(src: Sources, nv: Any) -> tuple[list[GpuInfo], dict[str, str]]:
    r = _Reader(nv)
    count, why = r.call("nvmlDeviceGetCount")
    if why:
        return [], {"nvidia": why}
    driver, cuda, version_reasons = _version(nv)
    boards: list[tuple[dict[str, Any], dict[str, str], Any, str]] = []
    for i in range(count or 0):
        h, why = r.call("nvmlDeviceGetHandleByIndex", i)
        if why:
            boards.append(({}, {"name": why}, None, f"NVIDIA GPU {i} ({why})"))
            continue
        values, reasons = _board_fields(r, h)
        name, why = r.call("nvmlDeviceGetName", h)
        boards.append((values, {**reasons, **version_reasons}, h, _text(name) if name else f"NVIDIA GPU {i}"))
    # NVLink peers: direct GPU links by bus id, plus all-to-all through NVSwitches.
    bus_to_index = {v.get("pci_bus_id", "").lower(): i for i, (v, _, _, _) in enumerate(boards) if v.get("pci_bus_id")}
    links = [(_nvlink(r, h) if h is not None else (set(), False)) for _, _, h, _ in boards]
    switched = {i for i, (_, sw) in enumerate(links) if sw}
    gpus: list[GpuInfo] = []
    for i, ((values, reasons, h, name), (remote, sw)) in enumerate(zip(boards, links)):
        peers = {bus_to_index[b] for b in remote if b in bus_to_index}
        if sw:
            peers |= switched
        values = {**values, "nvlink_peers": sorted(peers - {i}), "driver_version": driver,
                  "cuda_version": cuda, "precisions": precisions_for_cc(values.get("compute_capability"))}
        if h is None:
            gpus.append(make_gpu(index=len(gpus), vendor="nvidia", name=name, unified_memory=False,
                                 reasons=reasons, default_reason=reasons["name"], **values))
            continue
        slices = _mig_slices(r, h) if values.get("mig_mode") else []
        if not slices:
            mem_reasons = dict(reasons)
            values.update(_memory_fields(r, h, mem_reasons))
            gpus.append(make_gpu(index=len(gpus), vendor="nvidia", name=name, unified_memory=False,
                                 reasons=mem_reasons, default_reason="not reported by NVML", **values))
        for mig_handle, mig_name in slices:
            mem_reasons = dict(reasons)
            mig_values = {**values, **_memory_fields(r, mig_handle, mem_reasons)}
            mig_values["mig_profile"] = mig_name.rsplit("MIG", 1)[-1].strip() if "MIG" in mig_name else mig_name
            # utilisation and clock events are per physical GPU; peers over NVLink do not
            # apply to a slice
            mig_values["nvlink_peers"] = []
            gpus.append(make_gpu(index=len(gpus), vendor="nvidia", name=mig_name, unified_memory=False,
                                 reasons=mem_reasons, default_reason="not reported by NVML", **mig_values))
    visible, note = _visible(gpus, src.env)
    return visible, ({"nvidia_hidden": note} if note else {})


def _mig_slices(r: _Reader, h: Any) -> list[tuple[Any, str]]:
    limit, why = r.call("nvmlDeviceGetMaxMigDeviceCount", h)
    found = []
    for j in range(limit or 0):
        mh, why = r.call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
        if why:
            continue  # empty slot
        name, _ = r.call("nvmlDeviceGetName", mh)
        found.append((mh, _text(name) if name else f"MIG slice {j}"))
    return found
