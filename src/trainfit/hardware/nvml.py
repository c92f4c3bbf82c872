"""NVIDIA GPUs through NVML (nvidia-ml-py, module `pynvml`), imported lazily.

One gateway to the library (the nvitop habit): every call goes through `_call`, which turns an
NVML error into a reason ("not supported", "no permission", ...), so an unsupported field on a
laptop, WSL or a MIG slice is a value, not a crash. Never touches CUDA: NVML does not create a
CUDA context.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from trainfit.core.machines.profile import GpuInfo
from trainfit.hardware.gpu_common import failed_gpu, make_gpu
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
    """A string NVML returned (str, or bytes from older bindings). Bytes that are not UTF-8 raise
    UnicodeDecodeError, any other type TypeError: the caller's guard turns either into a reason."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {type(value).__name__} {value!r}")


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__} {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def _bytes_count(value: Any) -> int:
    n = _int(value)
    if n < 0:
        raise ValueError(f"negative size {n}")
    return n


def device_count(value: Any) -> tuple[int | None, str | None]:
    """nvmlDeviceGetCount's answer as (count, note). A count of another type that still reads as a
    whole number ("2", 2.0) is used with a note; anything else gives (None, note) and the probe
    then asks for handles 0, 1, ... until NVML refuses one."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value, None
    got = f"nvmlDeviceGetCount returned {value!r} ({type(value).__name__}), not a count"
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value), f"{got}: read as {int(value)}"
    if isinstance(value, (str, bytes)) and value.strip().isdigit():
        return int(value), f"{got}: read as {int(value)}"
    return None, f"{got}: GPUs found by asking for handles 0, 1, ... until NVML refuses one"


class NvmlReader:
    """Calls NVML functions by name; records the reason for each field it could not read.

    Every field goes through `call` with its conversion inside the same guard, so one field that
    raises, or answers with a value of the wrong type, costs that field only: the rest of the
    GPU and the other GPUs are still read."""

    def __init__(self, nv: Any):
        self.nv = nv

    def call(self, fn: str, *args: Any, convert: Callable[[Any], Any] | None = None) -> tuple[Any, str | None]:
        func: Callable[..., Any] | None = getattr(self.nv, fn, None)
        if func is None:
            return None, "not provided by this nvidia-ml-py"
        try:
            value = func(*args)
        except Exception as exc:  # NVMLError and its subclasses; anything else is a reason too
            if isinstance(getattr(exc, "value", None), int):
                return None, nvml_reason(exc)
            return None, f"{fn} failed: {type(exc).__name__}: {exc}"
        if convert is None or value is None:
            return value, None
        try:
            return convert(value), None
        except Exception as exc:  # a driver/binding answer of an unexpected type or encoding
            return None, f"unexpected value from {fn}: {type(exc).__name__}: {exc}"


def _version(nv: Any) -> tuple[str | None, str | None, dict[str, str]]:
    r = NvmlReader(nv)
    reasons = {}
    driver, why = r.call("nvmlSystemGetDriverVersion", convert=_text)
    if why:
        reasons["driver_version"] = why
    # 12040 -> "12.4"
    as_text = lambda v: f"{_int(v) // 1000}.{_int(v) % 1000 // 10}"  # noqa: E731
    cuda, why = r.call("nvmlSystemGetCudaDriverVersion_v2", convert=as_text)
    if cuda is None:
        cuda, why = r.call("nvmlSystemGetCudaDriverVersion", convert=as_text)
    if why:
        reasons["cuda_version"] = why
    return driver, cuda, reasons


def _board_fields(r: NvmlReader, h: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Fields of the physical board (also reported for its MIG slices)."""
    values: dict[str, Any] = {}
    reasons: dict[str, str] = {}

    def put(field: str, fn: str, *args: Any, convert: Callable[[Any], Any] = lambda v: v) -> None:
        value, why = r.call(fn, h, *args, convert=convert)
        values[field] = value
        if why:
            reasons[field] = why

    watts = lambda mw: _number(mw) / 1000  # noqa: E731
    put("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", convert=watts)
    put("power_draw_watts", "nvmlDeviceGetPowerUsage", convert=watts)
    put("temperature_c", "nvmlDeviceGetTemperature", TEMPERATURE_GPU, convert=_number)
    put("temperature_slowdown_c", "nvmlDeviceGetTemperatureThreshold", THRESHOLD_SLOWDOWN, convert=_number)
    put("clock_sm_mhz", "nvmlDeviceGetClockInfo", CLOCK_SM, convert=_number)
    put("clock_sm_max_mhz", "nvmlDeviceGetMaxClockInfo", CLOCK_SM, convert=_number)
    put("clock_mem_mhz", "nvmlDeviceGetClockInfo", CLOCK_MEM, convert=_number)
    put("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", convert=_int)
    put("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", convert=_int)
    put("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", convert=_int)
    put("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", convert=_int)
    put("pci_bus_id", "nvmlDeviceGetPciInfo", convert=lambda info: _text(info.busId))
    put("compute_capability", "nvmlDeviceGetCudaComputeCapability",
        convert=lambda mm: f"{_int(mm[0])}.{_int(mm[1])}")
    mask, why = r.call("nvmlDeviceGetCurrentClocksEventReasons", h, convert=_int)
    if mask is None and why and why.startswith("not provided"):  # drivers before 535 / old bindings
        mask, why = r.call("nvmlDeviceGetCurrentClocksThrottleReasons", h, convert=_int)
    values["throttle_reasons"] = decode_clock_events(mask) if mask is not None else []
    if why:
        reasons["throttle_reasons"] = why
    mig, why = r.call("nvmlDeviceGetMigMode", h, convert=lambda m: bool(_int(m[0])))
    values["mig_mode"] = mig
    if why:
        reasons["mig_mode"] = why if why != "not supported" else "not supported (no MIG on this GPU)"
    return values, reasons


def _memory_fields(r: NvmlReader, h: Any, reasons: dict[str, str]) -> dict[str, Any]:
    """Total and free memory (None with the reason when NVML cannot say: never 0) and the UUID."""
    info, why = r.call("nvmlDeviceGetMemoryInfo", h)
    values: dict[str, Any] = {}
    for field, attr in (("vram_total_bytes", "total"), ("vram_free_bytes", "free")):
        if info is None:
            values[field] = None
            reasons[field] = why or "nvmlDeviceGetMemoryInfo returned nothing"
            continue
        try:
            values[field] = _bytes_count(getattr(info, attr))
        except Exception as exc:
            values[field] = None
            reasons[field] = f"unexpected value from nvmlDeviceGetMemoryInfo.{attr}: {type(exc).__name__}: {exc}"
    # Drivers since R510 count what they keep for themselves in the total and report it apart
    # (v2 `reserved`, nvidia-smi -q "Reserved"); older ones report the allocatable total.
    version = getattr(r.nv, "nvmlMemory_v2", None)
    if version is None:
        values["vram_reserved_bytes"], why = None, "nvmlDeviceGetMemoryInfo v2 not provided by this nvidia-ml-py"
    else:
        values["vram_reserved_bytes"], why = r.call("nvmlDeviceGetMemoryInfo", h, version,
                                                    convert=lambda m: _bytes_count(m.reserved))
    if why:
        reasons["vram_reserved_bytes"] = f"nvmlDeviceGetMemoryInfo v2: {why}"
    uuid, why = r.call("nvmlDeviceGetUUID", h, convert=_text)
    values["uuid"] = uuid
    if why:
        reasons["uuid"] = why
    return values


def _name(r: NvmlReader, h: Any, fallback: str) -> tuple[str, str | None]:
    """The GPU's name, or (fallback, reason). Bytes that are not UTF-8 are decoded with the bad
    bytes dropped (so the catalog can still match the readable part) and the raw value noted."""
    raw, why = r.call("nvmlDeviceGetName", h)
    if why:
        return fallback, why
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8"), None
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="ignore").strip()
            note = f"nvmlDeviceGetName returned bytes that are not UTF-8 ({raw!r}); undecodable bytes dropped"
            return (text or fallback), note
    if isinstance(raw, str) and raw.strip():
        return raw, None
    return fallback, f"nvmlDeviceGetName returned {raw!r} ({type(raw).__name__}), not a name"


def _nvlink(r: NvmlReader, h: Any) -> tuple[set[str], bool]:
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
        bus, _ = r.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link, convert=lambda info: _text(info.busId).lower())
        if bus is not None:
            remote_ids.add(bus)
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
    except FileNotFoundError as exc:  # no driver on this machine (hardware.live)
        return [], {"nvidia": str(exc)}
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


# Handles asked for when nvmlDeviceGetCount gave no usable count (more GPUs than any node has).
MAX_DEVICES_WITHOUT_COUNT = 64


def _probe_initialised(src: Sources, nv: Any) -> tuple[list[GpuInfo], dict[str, str]]:
    r = NvmlReader(nv)
    raw_count, why = r.call("nvmlDeviceGetCount")
    if why:
        return [], {"nvidia": why}
    count, count_note = device_count(raw_count)
    top: dict[str, str] = {"nvidia_count": count_note} if count_note else {}
    driver, cuda, version_reasons = _version(nv)
    boards: list[tuple[dict[str, Any], dict[str, str], Any, str]] = []
    for i in range(count if count is not None else MAX_DEVICES_WITHOUT_COUNT):
        h, why = r.call("nvmlDeviceGetHandleByIndex", i)
        if why and count is None:
            break  # past the last GPU
        if why:
            boards.append(({}, {"name": why}, None, f"NVIDIA GPU {i} ({why})"))
            continue
        try:
            values, reasons = _board_fields(r, h)
            name, name_note = _name(r, h, f"NVIDIA GPU {i}")
        except Exception as exc:  # a bug here must cost this GPU's fields, not every GPU
            values, reasons, name, name_note = {}, {}, f"NVIDIA GPU {i}", None
            reasons["name"] = f"reading GPU {i} failed: {type(exc).__name__}: {exc}"
        if name_note:
            reasons["name"] = name_note
        boards.append((values, {**reasons, **version_reasons}, h, name))
    # NVLink peers: direct GPU links by bus id, plus all-to-all through NVSwitches.
    bus_to_index = {v.get("pci_bus_id", "").lower(): i for i, (v, _, _, _) in enumerate(boards) if v.get("pci_bus_id")}
    links = [(_links_or_none(r, h) if h is not None else (set(), False)) for _, _, h, _ in boards]
    switched = {i for i, (_, sw) in enumerate(links) if sw}
    gpus: list[GpuInfo] = []
    for i, ((values, reasons, h, name), (remote, sw)) in enumerate(zip(boards, links)):
        peers = {bus_to_index[b] for b in remote if b in bus_to_index}
        if sw:
            peers |= switched
        values = {**values, "nvlink_peers": sorted(peers - {i}), "driver_version": driver,
                  "cuda_version": cuda, "precisions": precisions_for_cc(values.get("compute_capability"))}
        try:
            gpus.extend(_board_gpus(r, h, len(gpus), name, values, reasons))
        except Exception as exc:  # keep the other GPUs; this one says what went wrong
            gpus.append(failed_gpu(index=len(gpus), vendor="nvidia", name=name, exc=exc, what=f"GPU {i}"))
    visible, note = _visible(gpus, src.env)
    if note:
        top["nvidia_hidden"] = note
    return visible, top


def _links_or_none(r: NvmlReader, h: Any) -> tuple[set[str], bool]:
    try:
        return _nvlink(r, h)
    except Exception:  # NVLink topology is optional: without it the GPUs are still listed
        return set(), False


def _with_notes(gpu: GpuInfo, notes: dict[str, str]) -> GpuInfo:
    """Reasons about fields that do have a value (e.g. a name read from malformed bytes)."""
    if not notes:
        return gpu
    return dataclasses.replace(gpu, unavailable={**gpu.unavailable, **notes})


def _board_gpus(r: NvmlReader, h: Any, first_index: int, name: str, values: dict[str, Any],
                reasons: dict[str, str]) -> list[GpuInfo]:
    """The GpuInfo records of one board: itself, or one per MIG slice."""
    notes = {"name": reasons["name"]} if "name" in reasons else {}
    if h is None:
        return [make_gpu(index=first_index, vendor="nvidia", name=name, unified_memory=False,
                         reasons=reasons, default_reason=reasons["name"], **values)]
    slices = _mig_slices(r, h) if values.get("mig_mode") else []
    out: list[GpuInfo] = []
    if not slices:
        mem_reasons = dict(reasons)
        board = {**values, **_memory_fields(r, h, mem_reasons)}
        out.append(_with_notes(make_gpu(index=first_index, vendor="nvidia", name=name, unified_memory=False,
                                        reasons=mem_reasons, default_reason="not reported by NVML", **board),
                               notes))
    for mig_handle, mig_name in slices:
        mem_reasons = dict(reasons)
        mig_values = {**values, **_memory_fields(r, mig_handle, mem_reasons)}
        mig_values["mig_profile"] = mig_name.rsplit("MIG", 1)[-1].strip() if "MIG" in mig_name else mig_name
        # utilisation and clock events are per physical GPU; peers over NVLink do not
        # apply to a slice
        mig_values["nvlink_peers"] = []
        out.append(_with_notes(make_gpu(index=first_index + len(out), vendor="nvidia", name=mig_name,
                                        unified_memory=False, reasons=mem_reasons,
                                        default_reason="not reported by NVML", **mig_values), notes))
    return out


def _mig_slices(r: NvmlReader, h: Any) -> list[tuple[Any, str]]:
    limit, why = r.call("nvmlDeviceGetMaxMigDeviceCount", h, convert=_int)
    found = []
    for j in range(limit or 0):
        mh, why = r.call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
        if why:
            continue  # empty slot
        name, _ = _name(r, mh, f"MIG slice {j}")
        found.append((mh, name))
    return found
