"""`--hardware SPEC`: a catalog name stands in for a live machine, so users plan for hardware they
are about to rent or buy, and tests use fixture machines.

Forms (case-insensitive):
    rtx-4090 | a100-80gb | m2-16gb     one GPU from the catalog (an id, or an alias such as "RTX 4090")
    2x rtx-4090 | 8xh100-sxm | 4 x l4   N identical GPUs in one machine (1..16)
    cpu | cpu-64gb                     no GPU: a generic x86-64 machine with that much RAM (GiB)
    path/to/profile.json               a profile saved by `trainfit profile --json`

Several identical machines (nodes) training together, each form optionally ending in
`over NETWORK` (an id or alias of the network catalog, data/networks.yaml: ib-ndr, ib-hdr,
roce-400, efa-p5, efa-p4d, 100gbe, 25gbe, 10gbe):
    2 nodes x 8x h100-sxm              N nodes of one catalog machine (also "2 node x ...", "2 nodes of ...")
    2x 8x h100-sxm                     the same, written as a count of counts
    2 nodes x node.json                N nodes like a saved profile
    node0.json,node1.json              one saved profile per node, joined with commas; the nodes must
                                       have the same GPUs (model, count, memory), else refused
    ... over 100gbe                    the network between the nodes (default: the GPU class's usual
                                       network, an assumption the plan states; core/machines/network_catalog.py)
A multi-node profile lists every node's GPUs (node 0 first) and describes one node's CPU, RAM and
disks; `profile.nodes` holds the node count and the network (kind, GB/s per node, source).

A synthesised profile is complete (`missing_reasons(profile) == []`): catalog figures for the GPUs,
a documented typical host for the GPU's class (below), and every live-only reading (temperature,
clocks, driver, disks, ...) None with the reason "catalog profile: not measured".
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from trainfit.core.machines.gpu_catalog import all_gpus, driver_reserved_bytes, get_gpu, host_hint
from trainfit.core.machines.gpu_spec import GpuSpec
from trainfit.core.machines.profile import (
    SCHEMA_VERSION, Backend, BackendsInfo, CpuInfo, GpuInfo, HardwareProfile, MemoryInfo,
    NetworkInfo, OsInfo, PowerInfo, os_reserve_bytes,
)  # fmt: skip
from trainfit.errors import BadInputError, close_matches

GIB = 1 << 30
NOT_MEASURED = "catalog profile: not measured"
MAX_GPUS_PER_MACHINE = 16  # DGX-2 / HGX-2 class nodes; larger counts are clusters, not one machine
DEFAULT_CPU_RAM_GIB = 32

FORMS = ("'rtx-4090', '2x rtx-4090', '8xh100-sxm', 'm2-16gb', 'cpu', 'cpu-64gb', "
         "a profile .json path, or several nodes: '2 nodes x 8x h100-sxm [over ib-ndr]', "
         "'a.json,b.json'")  # fmt: skip


@dataclass(frozen=True)
class HostTemplate:
    """The typical machine around a GPU class; every figure here is a documented assumption."""

    kind: str  # "datacenter", "workstation", "desktop", "hedt", "laptop", "apple", "cpu"
    physical_cores: int
    logical_cores: int
    ram_bytes: int
    headless: bool  # no display session: smaller OS reserve, nothing else on the GPU
    cpu_tdp_watts: float | None  # None: included in the SoC figure (Apple)
    rest_of_system_watts: float  # board, drives, fans, NICs (and NVSwitches in SXM nodes)
    gpu_reserve_bytes: int  # VRAM in use before training starts (driver, display, compositor)


# Share of unified memory one process may wire on Apple silicon: Metal's
# MTLDevice.recommendedMaxWorkingSetSize (https://developer.apple.com/documentation/metal/mtldevice/recommendedmaxworkingsetsize),
# which PyTorch's MPS allocator uses as its limit. Reported values (macOS 13-15): 16 GiB ->
# 10922.67 MiB = 2/3 (https://github.com/abetlen/llama-cpp-python/issues/687), 32 GiB -> 21845.34 MiB
# = 2/3 (https://github.com/ollama/ollama/issues/434), 64 GiB -> 49152 MiB = 3/4
# (https://github.com/ggml-org/llama.cpp/issues/1870), 96 GiB -> 73728 MiB = 3/4
# (https://github.com/ggml-org/llama.cpp/issues/3213). No report for 36/48 GiB was found: the smaller
# share is kept up to 36 GiB (an estimate should not claim memory the GPU may not get).
METAL_SMALL_SHARE, METAL_LARGE_SHARE = 2 / 3, 3 / 4
METAL_SMALL_SHARE_MAX_BYTES = 36 * GIB


def metal_working_set_bytes(ram_bytes: int | None) -> int | None:
    """What the GPU of an Apple silicon machine with `ram_bytes` of unified memory may use (the
    one rule for every command: catalog profiles, live profiles, estimate, plan, analyze).
    None when the RAM size is unknown."""
    if not ram_bytes:
        return None
    share = METAL_SMALL_SHARE if ram_bytes <= METAL_SMALL_SHARE_MAX_BYTES else METAL_LARGE_SHARE
    return int(ram_bytes * share)


def _pow2_gib(nbytes: float, floor_gib: int) -> int:
    """Round up to a power-of-two GiB size, as DIMM configurations are sold, at least floor_gib."""
    gib = max(float(floor_gib), nbytes / GIB)
    size = 1
    while size < gib:
        size *= 2
    return size * GIB


def host_template(spec: GpuSpec | None, count: int, ram_gib: int | None = None) -> HostTemplate:
    """The documented typical host for `count` GPUs of this spec (None: a CPU-only machine).

    RAM: twice the total VRAM, rounded up to a power of two (the usual "system RAM >= 2x GPU
    memory" rule for deep-learning machines, Puget Systems' hardware recommendations:
    https://www.pugetsystems.com/solutions/ai-and-hpc-workstations/machine-learning-ai/hardware-recommendations/).
    Cores: data-centre nodes get 12 vCPUs per GPU as cloud GPU instances do (AWS p4d.24xlarge
    96 vCPU / 8 A100, GCP a2-highgpu-1g 12 vCPU / 1 A100: https://cloud.google.com/compute/docs/gpus);
    desktops an 8-core / 16-thread CPU (Ryzen 7, Core i7 class), multi-GPU desktops and
    workstations a 16-core HEDT CPU, laptops an 8-core H-series CPU with 16 GiB RAM (32 GiB
    with more than 8 GiB of VRAM). Apple: the SoC's own cores and the configuration's memory.
    """
    if spec is None:
        ram = (ram_gib or DEFAULT_CPU_RAM_GIB) * GIB
        # Bigger RAM means a server-class box: scale the cores the way cloud CPU instances do.
        cores = 8 if ram <= 64 * GIB else 16 if ram <= 256 * GIB else 32
        return HostTemplate("cpu", cores, 2 * cores, ram, True, 125.0 if cores == 8 else 280.0,
                            60.0, 0)
    total_vram = spec.vram_bytes * count
    cls = spec.gpu_class
    if cls == "apple":
        hint = host_hint(spec.id)
        cores = hint.physical_cores if hint else 8
        # The catalog's Apple figure is the whole machine's maximum wall power (CPU, GPU, SSD).
        return HostTemplate("apple", cores, cores, spec.vram_bytes, False, None, 0.0, 0)
    if cls == "datacenter":
        logical = max(8, 12 * count)
        sockets = 2 if count >= 4 else 1  # 4- and 8-GPU HGX boards sit in dual-socket servers
        return HostTemplate("datacenter", logical // 2, logical, _pow2_gib(2 * total_vram, 64),
                            True, 350.0 * sockets, 200.0 + 0.25 * spec.tdp_watts * count,
                            GIB // 2)
    if cls in ("laptop", "integrated"):
        ram = 32 * GIB if spec.vram_bytes > 8 * GIB else 16 * GIB
        return HostTemplate("laptop", 8, 16, ram, False, 45.0, 30.0, GIB // 2)
    if cls == "workstation" or count > 1:
        kind = "workstation" if cls == "workstation" else "hedt"
        return HostTemplate(kind, 16, 32, _pow2_gib(2 * total_vram, 64), cls == "workstation",
                            350.0, 100.0, GIB // 2 if cls == "workstation" else GIB)
    return HostTemplate("desktop", 8, 16, _pow2_gib(2 * total_vram, 32), False, 125.0, 75.0, GIB)


# ---------------------------------------------------------------------------- parsing
_COUNT_RE = re.compile(r"^\s*([+-]?[0-9]+)\s*[x×*]\s*(.*)$", re.IGNORECASE)
_CPU_RE = re.compile(r"^cpu(?:-([0-9]+)\s*g(?:i)?b)?$", re.IGNORECASE)


def resolve_hardware(spec: str) -> HardwareProfile:
    """A complete HardwareProfile for a catalog spec or a saved profile file (see module doc).

    Raises BadInputError naming the valid forms and close matches for anything else.
    """
    text = (spec or "").strip()
    if not text:
        raise BadInputError("--hardware: empty", hint=f"use {FORMS}")
    is_path = text.lower().endswith(".json") or "/" in text or "\\" in text  # a file may be named in any script
    if not is_path and any(c.isdigit() and not c.isascii() for c in text):  # int() reads '٢' as 2; flags refuse it
        raise BadInputError(f"--hardware '{_shown(text)}': write counts and sizes in ASCII digits (0-9)",
                            hint=f"use {FORMS}")
    from trainfit.core.machines.multinode_spec import resolve_multinode

    multi = resolve_multinode(text, resolve_single=_resolve_single)
    if multi is not None:
        return multi
    return _resolve_single(text)


def _resolve_single(text: str) -> HardwareProfile:
    """One machine: a catalog spec or a saved profile file."""
    from trainfit.validate import path_kind

    if text.lower().endswith(".json") or "/" in text or "\\" in text or path_kind(text) == "file":
        return _load_profile_file(text)
    cpu = _CPU_RE.match(text)
    if cpu:
        ram_gib = int(cpu.group(1)) if cpu.group(1) else None
        if ram_gib is not None and not 1 <= ram_gib <= 65536:
            raise BadInputError(f"--hardware '{_shown(text)}': RAM must be 1..65536 GiB", hint=f"use {FORMS}")
        return _cpu_profile(text.lower(), ram_gib)
    count, name = 1, text
    match = _COUNT_RE.match(text)
    if match:
        count, name = int(match.group(1)), match.group(2).strip()
        if not 1 <= count <= MAX_GPUS_PER_MACHINE:
            raise BadInputError(
                f"--hardware '{_shown(text)}': GPU count must be 1..{MAX_GPUS_PER_MACHINE}",
                hint=f"use {FORMS}",
            )
    if not name:
        raise BadInputError(f"--hardware '{_shown(text)}': no GPU named", hint=f"use {FORMS}")
    try:
        gpu = get_gpu(name)
    except BadInputError as exc:
        near = close_matches(name.lower(), [g.id for g in all_gpus()], n=4)
        did = f"did you mean {', '.join(near)}? " if near else ""
        raise BadInputError(
            f"--hardware '{_shown(text)}': {exc.message}",
            hint=f"{did}valid forms: {FORMS}; list GPUs with: trainfit gpus",
        ) from None
    if count > 1 and gpu.gpu_class in ("apple", "laptop", "integrated"):
        raise BadInputError(
            f"--hardware '{_shown(text)}': {gpu.id} is a {gpu.gpu_class} GPU, one per machine",
            hint=f"use '{gpu.id}' without a count",
        )
    # Canonical spelling in the source, so a saved profile says exactly what it stands for.
    return _gpu_profile(f"{count}x {gpu.id}" if count > 1 else gpu.id, gpu, count)


def _load_profile_file(path_text: str) -> HardwareProfile:
    from trainfit.validate import read_text_file

    from trainfit.validate import path_kind

    path = Path(path_text).expanduser()
    if path_kind(path) == "none":
        raise BadInputError(f"--hardware: profile file {_shown(path_text)} not found", hint=f"use {FORMS}")
    raw = read_text_file(path, "--hardware profile")
    try:
        profile = HardwareProfile.from_json(raw)
    except ValueError as exc:
        raise BadInputError(
            f"--hardware: {path_text} is not a trainfit hardware profile: {exc}",
            hint="write one with: trainfit profile --json > profile.json",
        ) from None
    return dataclasses.replace(profile, source=f"file:{path_text}")


def _shown(text: str, limit: int = 60) -> str:
    """The spec as a message quotes it: a 300-byte --hardware is cut, not echoed whole."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------- synthesis
def _reasons(*names: str, reason: str = NOT_MEASURED) -> dict[str, str]:
    return {name: reason for name in names}


def _gpu_infos(spec: GpuSpec, count: int, host: HostTemplate) -> list[GpuInfo]:
    linked = count > 1 and bool(spec.interconnect) and not spec.interconnect.startswith("pcie")
    apple = spec.vendor == "apple"
    # What the driver reports as the total (ECC on GDDR data-centre parts keeps 1/16), as a live
    # NVML probe of the same GPU would read it.
    total = spec.usable_vram_bytes
    reserved = driver_reserved_bytes(spec)  # the driver's own share of that total (nvidia-smi -q "Reserved")
    if apple:
        free = metal_working_set_bytes(spec.vram_bytes) or 0  # Metal caps what one process may wire
    else:
        free = total - reserved - host.gpu_reserve_bytes
    pcie_known = spec.pcie_gen is not None
    width = 16 if pcie_known and host.kind != "laptop" else None
    unavailable = _reasons(
        "uuid", "pci_bus_id", "power_draw_watts", "temperature_c", "temperature_slowdown_c",
        "clock_sm_mhz", "clock_sm_max_mhz", "clock_mem_mhz", "mig_mode", "driver_version",
        "throttle_reasons",
    )
    unavailable["cuda_version"] = NOT_MEASURED if spec.vendor == "nvidia" else "not an NVIDIA GPU"
    unavailable["rocm_version"] = NOT_MEASURED if spec.vendor == "amd" else "not an AMD GPU"
    if spec.matrix_unit is None:
        unavailable["matrix_unit"] = "catalog: no matrix unit on this GPU"
    if not pcie_known:
        unavailable.update(_reasons("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max",
                                    reason="not a PCIe device (system-on-chip)"))
    elif width is None:
        unavailable.update(_reasons("pcie_width", "pcie_width_max",
                                    reason="catalog profile: laptop link width varies (x8 or x16)"))
    return [
        GpuInfo(
            index=i, vendor=spec.vendor, name=spec.name, catalog_id=spec.id, uuid=None,
            pci_bus_id=None, vram_total_bytes=total, vram_free_bytes=free, vram_reserved_bytes=reserved,
            unified_memory=spec.unified_memory, compute_capability=spec.compute_capability,
            architecture=spec.architecture, matrix_unit=spec.matrix_unit,
            precisions=list(spec.precisions), peak_tflops=dict(spec.peak_tflops),
            memory_bandwidth_gbps=spec.memory_bandwidth_gbps, tdp_watts=spec.tdp_watts,
            # The default power limit is the board power; a live probe reads the set one.
            power_limit_watts=spec.tdp_watts, power_draw_watts=None, temperature_c=None,
            temperature_slowdown_c=None, clock_sm_mhz=None, clock_sm_max_mhz=None,
            clock_mem_mhz=None, pcie_gen=spec.pcie_gen, pcie_width=width,
            pcie_gen_max=spec.pcie_gen, pcie_width_max=width,
            nvlink_peers=[j for j in range(count) if j != i] if linked else [],
            mig_mode=None, mig_profile=None, throttle_reasons=[], driver_version=None,
            cuda_version=None, rocm_version=None, unavailable=dict(unavailable),
        )
        for i in range(count)
    ]


def _profile(source: str, host: HostTemplate, gpus: list[GpuInfo], apple: bool) -> HardwareProfile:
    vendor = gpus[0].vendor if gpus else None
    flags = {"neon": True, "fma": True, "bf16": vendor == "apple" and gpus[0].architecture != "apple-m1"} \
        if apple else {"avx2": True, "fma": True}  # every x86-64 CPU sold with these GPUs has AVX2
    cpu = CpuInfo(
        architecture="arm64" if apple else "x86_64",
        model=None, vendor="Apple" if apple else None,
        physical_cores=host.physical_cores, logical_cores=host.logical_cores,
        usable_cores=float(host.logical_cores), cgroup_cpu_quota=None,
        base_clock_mhz=None, boost_clock_mhz=None, numa_nodes=[], l2_cache_bytes=None,
        l3_cache_bytes=None, flags=flags,
        unavailable={
            **_reasons("base_clock_mhz", "boost_clock_mhz", "l2_cache_bytes", "l3_cache_bytes",
                       "numa_nodes", "flags"),
            "model": f"catalog profile: typical {host.kind} host, model not known",
            **({} if apple else {"vendor": f"catalog profile: typical {host.kind} host"}),
        },
    )
    reserve = os_reserve_bytes(host.ram_bytes, desktop=not host.headless, in_cgroup=False)
    memory = MemoryInfo(
        total_bytes=host.ram_bytes, available_bytes=host.ram_bytes - reserve,
        cgroup_limit_bytes=None, usable_bytes=host.ram_bytes - reserve, os_reserve_bytes=reserve,
        swap_total_bytes=0, swap_free_bytes=0, swap_kind="unknown", unified_with_gpu=apple,
        unavailable=_reasons("available_bytes", "swap_total_bytes", "swap_free_bytes", "swap_kind",
                             reason="catalog profile: not measured (assumed fresh, no swap)"),
    )
    backend = {"nvidia": "cuda", "amd": "rocm", "apple": "mps", "intel": "xpu"}.get(vendor or "")
    def _backend(name: str) -> Backend:
        return Backend(True) if name == backend else Backend(False, reason=f"catalog profile: no {name} device")
    backends = BackendsInfo(
        cuda=_backend("cuda"), rocm=_backend("rocm"), mps=_backend("mps"), xpu=_backend("xpu"),
        opencl=Backend(False, reason=NOT_MEASURED), cpu=Backend(True),
        cpu_avx2=not apple, cpu_avx512=False, cpu_amx=False, cpu_neon=apple,
        cpu_bf16=bool(flags.get("bf16")),
    )
    gpu_watts = sum(g.tdp_watts or 0.0 for g in gpus)
    on_ac = None if host.kind in ("laptop", "apple") else True
    power = PowerInfo(
        on_ac=on_ac, battery_percent=None, battery_seconds_left=None, cpu_package_watts=None,
        cpu_tdp_watts=host.cpu_tdp_watts,
        estimated_system_tdp_watts=gpu_watts + (host.cpu_tdp_watts or 0.0) + host.rest_of_system_watts,
        psu_watts=None, psu_headroom_watts=None, psu_is_estimate=True, throttling=None,
        throttle_evidence=[], thermal_zones=[], cooling_verdict="unknown",
        cooling_evidence=[NOT_MEASURED],
        unavailable={
            **_reasons("battery_percent", "battery_seconds_left", "cpu_package_watts", "throttling",
                       "thermal_zones"),
            **({"on_ac": "catalog profile: laptop may run on battery"} if on_ac is None else {}),
            **({"cpu_tdp_watts": "Apple SoC: CPU power is part of the package figure"}
               if host.cpu_tdp_watts is None else {}),
        },
    )
    return HardwareProfile(
        schema_version=SCHEMA_VERSION, source=f"catalog:{source}",
        os=OsInfo(system="Darwin" if apple else "Linux", release="", hostname="",
                  python_version="", in_container=False, in_wsl=False,
                  unavailable=_reasons("release", "hostname", "python_version", "in_container")),
        cpu=cpu, memory=memory, gpus=gpus, backends=backends, storage=[],
        network=NetworkInfo(endpoint=None, download_mbps=None,
                            unavailable=_reasons("download_mbps")),
        power=power, benchmark=None, probe_seconds={},
        unavailable=_reasons("storage", "benchmark"),
    )


def _gpu_profile(text: str, spec: GpuSpec, count: int) -> HardwareProfile:
    host = host_template(spec, count)
    return _profile(text, host, _gpu_infos(spec, count, host), spec.vendor == "apple")


def _cpu_profile(text: str, ram_gib: int | None) -> HardwareProfile:
    return _profile(text, host_template(None, 0, ram_gib), [], False)
