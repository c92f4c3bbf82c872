"""HardwareProfile: plain, typed, JSON-serialisable picture of a machine.

One way to say "unknown": a field is None and the object's `unavailable` dict maps the field
name to the reason ("no driver", "no permission: ...", "not supported", "timed out after 2.0 s").
A None field without a reason is a bug (tests check the invariant over every fixture machine).

Units are in the names: *_bytes, *_watts, *_mhz, *_c (degrees Celsius), *_mbps (MB/s, 10^6),
*_gbps (GB/s, 10^9), *_tflops / *_gflops (10^12 / 10^9 FLOP/s), *_seconds.

Bump SCHEMA_VERSION when a field changes meaning or is removed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from trainfit.core.machines.gpu_spec import Precision, Vendor  # noqa: F401 - re-exported: the profile's vocabulary
from trainfit.core.serde import SerdeError, from_jsonable, to_jsonable
from trainfit.validate import MAX_DOCUMENT_DEPTH, nested_deeper_than

SCHEMA_VERSION = 1
_GIB = 1 << 30

DiskKind = Literal["nvme", "ssd", "hdd", "network", "ram", "unknown"]
SwapKind = Literal["nvme", "ssd", "hdd", "zram", "network", "none", "unknown"]
CoolingVerdict = Literal["adequate", "marginal", "inadequate", "unknown"]


@dataclass(frozen=True)
class OsInfo:
    system: str  # "Linux", "Darwin", "Windows"
    release: str
    hostname: str
    python_version: str
    in_container: bool
    in_wsl: bool
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NumaNode:
    node_id: int
    cpus: list[int]
    memory_total_bytes: int | None


@dataclass(frozen=True)
class CpuInfo:
    architecture: str  # "x86_64", "aarch64", "arm64"
    model: str | None
    vendor: str | None  # "GenuineIntel", "AuthenticAMD", "Apple", ...
    physical_cores: int | None
    logical_cores: int
    usable_cores: float  # affinity set, further limited by a cgroup CPU quota (may be fractional)
    cgroup_cpu_quota: float | None  # cores allowed by cpu.max / cfs_quota, None when unlimited
    base_clock_mhz: float | None
    boost_clock_mhz: float | None
    numa_nodes: list[NumaNode]
    l2_cache_bytes: int | None  # total over cores
    l3_cache_bytes: int | None
    flags: dict[str, bool]  # avx2, avx512f, avx512_bf16, amx_bf16, amx_tile, neon, bf16, fma
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryInfo:
    # The sizes are None (with the reason in `unavailable`) when the memory probe failed: an
    # unknown size is never reported as 0 bytes.
    total_bytes: int | None  # physical RAM seen by the OS
    available_bytes: int | None
    cgroup_limit_bytes: int | None  # memory.max / memory.limit_in_bytes when in a container
    usable_bytes: int | None  # min(total, cgroup limit) minus os_reserve_bytes: what training may use
    os_reserve_bytes: int | None  # kept for the OS and other processes
    swap_total_bytes: int | None
    swap_free_bytes: int | None
    swap_kind: SwapKind
    unified_with_gpu: bool  # Apple silicon / APU: GPU memory is this RAM
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    vendor: Vendor
    name: str
    catalog_id: str | None  # key in the GPU catalog when matched
    uuid: str | None
    pci_bus_id: str | None
    vram_total_bytes: int | None
    vram_free_bytes: int | None
    unified_memory: bool
    compute_capability: str | None  # NVIDIA "9.0"
    architecture: str | None  # "hopper", "ada", "gfx942", "apple-m2", "xe-hpg"
    matrix_unit: str | None  # "tensor-core-4", "matrix-core-3", "xmx-1", "apple-amx"
    precisions: list[Precision]
    peak_tflops: dict[str, float]  # dense, by precision, from the catalog
    memory_bandwidth_gbps: float | None
    tdp_watts: float | None
    power_limit_watts: float | None
    power_draw_watts: float | None
    temperature_c: float | None
    temperature_slowdown_c: float | None
    clock_sm_mhz: float | None
    clock_sm_max_mhz: float | None
    clock_mem_mhz: float | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    nvlink_peers: list[int]  # indices of GPUs reachable over NVLink / Infinity Fabric
    mig_mode: bool | None
    mig_profile: str | None  # "1g.10gb" when this entry is a MIG slice
    throttle_reasons: list[str]  # active clock-event reasons ("hw_thermal", "sw_power_cap", ...)
    driver_version: str | None
    cuda_version: str | None
    rocm_version: str | None
    unavailable: dict[str, str] = field(default_factory=dict)
    # Part of vram_total_bytes the driver keeps for itself (NVML v2 `reserved`, nvidia-smi -q
    # "Reserved"): no process can allocate it, so capacity is total minus this.
    vram_reserved_bytes: int | None = None


@dataclass(frozen=True)
class Backend:
    available: bool
    version: str | None = None
    reason: str | None = None  # why not available


@dataclass(frozen=True)
class BackendsInfo:
    cuda: Backend
    rocm: Backend
    mps: Backend
    xpu: Backend
    opencl: Backend
    cpu: Backend
    cpu_avx2: bool
    cpu_avx512: bool
    cpu_amx: bool
    cpu_neon: bool
    cpu_bf16: bool


@dataclass(frozen=True)
class StorageInfo:
    role: str  # "work", "cache"
    path: str
    device: str | None  # "nvme0n1", "sda", "overlay"
    kind: DiskKind
    kind_reason: str  # how the kind was decided, or why it is unreliable
    total_bytes: int | None
    free_bytes: int | None
    read_mbps: float | None  # measured sequential, MB/s
    write_mbps: float | None
    unavailable: dict[str, str] = field(default_factory=dict)
    measured_at: str | None = None  # when read/write were measured (UTC, ISO 8601); may be earlier than the profile


@dataclass(frozen=True)
class NetworkInfo:
    endpoint: str | None
    download_mbps: float | None
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ThermalZone:
    name: str
    temperature_c: float
    critical_c: float | None


@dataclass(frozen=True)
class PowerInfo:
    on_ac: bool | None
    battery_percent: float | None
    battery_seconds_left: float | None
    cpu_package_watts: float | None  # measured from RAPL over a short window
    cpu_tdp_watts: float | None
    estimated_system_tdp_watts: float  # CPU + GPUs + rest of system, an estimate
    psu_watts: float | None  # as stated by the user (--psu-watts)
    psu_headroom_watts: float | None
    psu_is_estimate: bool  # True when the PSU size was not stated
    throttling: bool | None
    throttle_evidence: list[str]
    thermal_zones: list[ThermalZone]
    cooling_verdict: CoolingVerdict
    cooling_evidence: list[str]
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MeasurementLoad:
    """What else ran on the measuring CPUs while the CPU rates were measured (hardware.cpu_load).

    reliable=False: other work (or the spread of the repeated timings) made the figures a measure
    of the sharing, not of the machine; they are used for the command that measured them, never
    kept as this machine's rates (hardware.cpu_measure)."""

    reliable: bool
    reason: str | None  # why not reliable; None when reliable
    cores: int  # the CPUs the measurement ran on (process affinity)
    other_cores: float | None  # cores other processes used on them, averaged over the measurement
    steal_cores: float | None  # cores the hypervisor gave to other guests (VMs)
    load_average_1m_before: float | None
    load_average_1m_after: float | None
    fp32_spread: float | None  # 1 - median / best of the repeated fp32 matmul timings
    attempts: int  # measurements taken (a busy one is repeated, the least disturbed kept)
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchmarkInfo:
    memory_bandwidth_gbps: float | None
    cpu_fp32_gflops: float | None
    cpu_bf16_gflops: float | None
    gpu_tflops: dict[str, float]  # measured matmul, by precision
    gpu_bandwidth_gbps: float | None
    disk_read_mbps: float | None
    disk_write_mbps: float | None
    seconds: float
    unavailable: dict[str, str] = field(default_factory=dict)
    measured_at: str | None = None  # UTC, ISO 8601
    scope: str = "full"  # "full": profile --benchmark; "cpu": the default CPU measurement (RAM, CPU matmuls)
    cached: bool = False  # read back from trainfit's cache (measured at measured_at)
    # A training-mode dropout's cost per element on the CPU (random-number bound; None: not measured).
    cpu_dropout_ns_per_element: float | None = None
    # The load seen while the CPU part was measured (None: measured by a trainfit that did not check).
    load_check: MeasurementLoad | None = None
    # torch's own fp32 training matmul (forward + both gradients of a 1024-wide linear over 512
    # tokens), the rate the CPU step model's GEMMs are anchored on (None: not measured).
    cpu_fp32_training_gflops: float | None = None
    # The same at 256 wide: how fast the rate falls for thin matrices on this CPU.
    cpu_fp32_training_narrow_gflops: float | None = None
    # Writing a freshly allocated (page-faulting) tensor beyond a reused one, per 4 KiB page.
    cpu_first_touch_ns_per_page: float | None = None


_ONE_NODE = "one node: no inter-node network"


@dataclass(frozen=True)
class NodesInfo:
    """How many identical machines (nodes) the profile stands for, and the network between them.

    With count > 1, `HardwareProfile.gpus` lists every node's GPUs (count x gpus_per_node, node 0
    first) while cpu / memory / storage / power describe ONE node (all nodes are identical).
    Saved profiles without this key load as one node.
    """

    count: int = 1
    network: str | None = None  # catalog id (core/machines/network_catalog.py): "ib-ndr", "100gbe", ...
    network_kind: str | None = None  # infiniband | roce | efa | ethernet
    network_gbps: float | None = None  # line rate per node, GB/s (10^9 bytes/s) per direction
    network_assumed: bool = False  # True: the GPU class's default, not stated by the user
    network_source: str | None = None  # where the figure comes from (URL + date)
    unavailable: dict[str, str] = field(default_factory=lambda: {
        "network": _ONE_NODE, "network_kind": _ONE_NODE, "network_gbps": _ONE_NODE, "network_source": _ONE_NODE})


@dataclass(frozen=True)
class HardwareProfile:
    schema_version: int
    source: str  # "live", "catalog:2x rtx-4090", "file:profile.json", "fixture:rtx3060-laptop"
    os: OsInfo
    cpu: CpuInfo
    memory: MemoryInfo
    gpus: list[GpuInfo]
    backends: BackendsInfo
    storage: list[StorageInfo]
    network: NetworkInfo
    power: PowerInfo
    benchmark: BenchmarkInfo | None
    probe_seconds: dict[str, float]  # wall time per probe
    unavailable: dict[str, str] = field(default_factory=dict)
    nodes: NodesInfo = field(default_factory=NodesInfo)  # machines training together (default: one)

    # ---- convenience views used by the estimators -------------------------------------
    @property
    def accelerator(self) -> str:
        """Device the training would run on: 'cuda', 'rocm', 'mps', 'xpu' or 'cpu'."""
        if not self.gpus:
            return "cpu"
        vendor = self.gpus[0].vendor
        return {"nvidia": "cuda", "amd": "rocm", "apple": "mps", "intel": "xpu"}[vendor]

    @property
    def gpu_count(self) -> int:
        """GPUs of every node together (the data-parallel world size on GPUs)."""
        return len(self.gpus)

    @property
    def node_count(self) -> int:
        return max(1, self.nodes.count)

    @property
    def gpus_per_node(self) -> int:
        return len(self.gpus) // self.node_count

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(to_jsonable(self), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "HardwareProfile":
        """Parse a saved profile. Raises ValueError naming the bad key."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        except RecursionError:
            raise ValueError("nested too deeply to be a profile") from None
        except ValueError:  # Python reads no integer of more than 4,300 digits
            raise ValueError("holds an integer with more than 4,300 digits; no machine has that much of anything") from None
        if nested_deeper_than(data, MAX_DOCUMENT_DEPTH):
            raise ValueError(f"nested more than {MAX_DOCUMENT_DEPTH} levels deep; a profile is not")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> "HardwareProfile":
        if not isinstance(data, dict):
            raise ValueError("a hardware profile must be a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {version!r} is not supported (this trainfit reads {SCHEMA_VERSION})"
            )
        try:
            profile = from_jsonable(cls, data)
        except SerdeError as exc:
            raise ValueError(str(exc)) from None
        problems = value_problems(profile)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ValueError(problems[0] + more)
        return profile


# What a saved profile's numbers may be. Types are checked by serde; these are the values every
# estimate divides by or multiplies with, so a hand-edited 0, -5 or 1e30 would print nonsense.
MAX_PROFILE_BYTES = 1 << 50  # 1 PiB: far above any machine's RAM, GPU memory or disk
MAX_PROFILE_CORES = 1 << 20
MAX_PROFILE_RATE = 1e9  # TFLOPS, GB/s, MB/s, W: a million times any real device
# Zero here is not "unknown" (that is None) but a machine nothing could run on.
_POSITIVE = {"vram_total_bytes", "total_bytes", "logical_cores", "physical_cores", "usable_cores",
             "memory_bandwidth_gbps", "gpu_bandwidth_gbps", "cpu_fp32_gflops", "cpu_bf16_gflops",
             "peak_tflops", "gpu_tflops", "network_gbps", "count"}


def value_problems(obj: object, path: str = "") -> list[str]:
    """One message per number of a profile that no machine has: NaN or infinity anywhere, a
    negative size, count or rate, zero memory, cores or bandwidth, or sizes above 1 PiB."""
    import dataclasses
    import math

    problems: list[str] = []
    if not dataclasses.is_dataclass(obj):
        return problems
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        here = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(value):
            problems.extend(value_problems(value, here))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                problems.extend(value_problems(item, f"{here}[{i}]"))
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, (int, float)) and not isinstance(item, bool):
                    problems.extend(_number_problem(f.name, item, f"{here}.{key}", math))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            problems.extend(_number_problem(f.name, value, here, math))
    return problems


def _number_problem(name: str, value: float, where: str, math) -> list[str]:  # noqa: ANN001 - the module
    if not math.isfinite(value):
        return [f"{where}: must be a finite number, got {value}"]
    if name in _POSITIVE and value <= 0:
        return [f"{where}: must be more than 0, got {value:g}"]
    if name.endswith("_bytes") and not 0 <= value <= MAX_PROFILE_BYTES:
        return [f"{where}: must be from 0 to {MAX_PROFILE_BYTES:,} bytes (1 PiB), got {value:g}"]
    if name.endswith("_cores") and value > MAX_PROFILE_CORES:
        return [f"{where}: must be at most {MAX_PROFILE_CORES:,}, got {value:g}"]
    rate = name.endswith(("_tflops", "_gflops", "_gbps", "_mbps", "_watts", "_seconds", "_mhz"))
    if rate and not 0 <= value <= MAX_PROFILE_RATE:
        return [f"{where}: must be from 0 to {MAX_PROFILE_RATE:.0e}, got {value:g}"]
    return []


def os_reserve_bytes(total_bytes: int, *, desktop: bool, in_cgroup: bool) -> int:
    """RAM kept back for everything that is not the training process.

    - Desktop / laptop (a display session, or macOS / Windows): max(1.5 GiB, 10 % of RAM). An
      idle GNOME/KDE or macOS session with a browser and an editor holds 1.5-3 GiB, and the
      kernel's page cache and the compositor grow with RAM, hence the proportional part.
    - Headless server: max(1 GiB, 5 %): sshd, systemd and the page cache the data loader needs.
    - Inside a memory-limited cgroup the OS lives outside the limit, so only the container's
      other processes (shell, logging, dataloader workers' own overhead): max(256 MiB, 5 %).
    """
    if in_cgroup:
        return max(256 << 20, total_bytes // 20)
    if desktop:
        return max(int(1.5 * _GIB), total_bytes // 10)
    return max(_GIB, total_bytes // 20)


def missing_reasons(obj: object, path: str = "") -> list[str]:
    """Paths of fields that are None without a reason in the owning object's `unavailable`.

    Used by tests and by `trainfit profile` in debug mode: no probe may silently default.
    """
    import dataclasses

    problems: list[str] = []
    if not dataclasses.is_dataclass(obj):
        return problems
    reasons = getattr(obj, "unavailable", None)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        here = f"{path}.{f.name}" if path else f.name
        if value is None:
            # Fields that are None by meaning, not by failure.
            if f.name in _NONE_IS_MEANINGFUL:
                continue
            if reasons is None or f.name not in reasons:
                problems.append(here)
        elif dataclasses.is_dataclass(value):
            problems.extend(missing_reasons(value, here))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                problems.extend(missing_reasons(item, f"{here}[{i}]"))
    return problems


# None here means "does not apply" rather than "could not read".
_NONE_IS_MEANINGFUL = {
    "cgroup_limit_bytes",  # not in a memory-limited cgroup
    "cgroup_cpu_quota",  # no CPU quota
    "benchmark",  # --benchmark not asked
    "load_check",  # a measurement from before the load was checked
    "catalog_id",  # GPU not in the catalog (reason given in unavailable when looked up)
    "mig_profile",  # not a MIG slice
    "rocm_version",  # NVIDIA/Apple/Intel GPU
    "cuda_version",  # AMD/Apple/Intel GPU
    "compute_capability",  # non-NVIDIA
    "psu_watts",  # not stated
    "psu_headroom_watts",  # PSU not stated
    "version",  # Backend.version when unavailable
    "reason",  # Backend.reason when available
    "critical_c",
    "endpoint",  # no endpoint configured
}
