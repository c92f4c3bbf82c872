"""What a device can sustain: peak FLOP/s by precision, an efficiency curve, memory and link bandwidth.

One `DeviceRates` describes one training device (a GPU, or the whole CPU). It is built from a
HardwareProfile (catalog figures, or the profile's *measured* matmul / bandwidth numbers when
`trainfit profile --benchmark` was run) and is the only thing the step-time model reads.

Efficiency: the fraction of peak that large GEMMs reach in real training stacks. Small hidden
sizes and small micro-batches reach less (thin matrices under-fill the tensor cores / vector
units and are bound by weight reads), modelled as h/(h+h0) * t/(t+t0) on top of a ceiling per
architecture. The ceilings are set so that published end-to-end throughputs are reproduced
(tests/speed/test_published.py cites each one; bench/published_speed.py checks the whole model
against the cited runs of bench/data/published_speed.yaml); the CPU constants are calibrated on
a measured machine by bench/step_time_accuracy.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from trainfit.core.machines.gpu_spec import GpuSpec
from trainfit.core.machines.profile import HardwareProfile

GB = 1e9

# Ceiling of matmul efficiency (achieved / dense catalog peak) of a real PyTorch training step
# with large matrices. Anchors: A100 57 % MFU (PyTorch FSDP blog, 2024-03), H100 40-46 % MFU
# (MosaicML LLM Foundry tables), T4 reaches ~40 % of its 65 TFLOPS fp16 peak at 70 W. Ampere
# 0.66 -> 0.70: with 0.66 the 33 counted A100 rows of bench/data/published_speed.yaml (LLM
# Foundry, torchtitan, torchtune, Answer.AI, Qwen) were predicted a median 10 % too slow; the FSDP
# blog anchor stays within +5 %.
ARCH_CEILING = {
    "hopper": 0.56,
    "blackwell": 0.50,
    "ampere": 0.70,
    "ada": 0.55,
    "turing": 0.42,
    "volta": 0.50,
    "cdna3": 0.40,
    "cdna2": 0.40,
    "rdna3": 0.35,
}
DEFAULT_GPU_CEILING = 0.40
# GeForce desktop cards (catalog gpu_class "consumer") reach a larger share of their catalog
# peak than the data-centre parts above: published whole-step runs imply 0.59-0.68 of the dense
# bf16 peak on 2x RTX 4090 and 0.68-0.73 on 2x RTX 3090 capped at 280 W (Answer.AI fsdp_qlora
# benchmarks; bench/results/published_speed.md, column "implied util."), above ARCH_CEILING's
# 0.55 / 0.66, which left every such row 20-45 % too slow. Workstation boards (RTX 6000 Ada at
# 300 W) do not show it and keep ARCH_CEILING.
CONSUMER_CEILING = {"ada": 0.72, "ampere": 0.75}
# Fused attention kernels (flash / SDPA) reach a smaller share of peak than large GEMMs, most of
# all on Hopper, where PyTorch's SDPA runs FlashAttention-2 (not the Hopper-specific FA3): FA2
# forward+backward reaches ~0.6 of A100 peak at long sequences and ~335 of 989 TFLOP/s (0.34) on
# H100 (Dao 2023, arXiv 2307.08691 §4.1). As a share of the GEMM ceiling: ampere 0.9 (0.63 of
# peak), hopper 0.6 (0.34); others keep 0.9 (no published figure). Shorter sequences reach less
# (half-way at ATTENTION_HALF_SEQ). Checked against the long-sequence rows (16k-65k tokens) of
# bench/data/published_speed.yaml, where this is most of the step.
ATTENTION_SHARE_OF_CEILING = {"hopper": 0.60, "blackwell": 0.60, "ampere": 0.90}
DEFAULT_ATTENTION_SHARE = 0.90
ATTENTION_HALF_SEQ = 256.0
# Per-kernel host overhead of eager PyTorch (launch + dispatcher), seconds.
GPU_OP_OVERHEAD_SECONDS = 12e-6

# Efficiency curve shape on GPUs: hidden size and tokens per micro-batch at which half of the
# ceiling is reached.
GPU_HALF_HIDDEN = 200.0
GPU_HALF_TOKENS = 96.0
# Fraction of the HBM/GDDR peak that streaming kernels reach.
GPU_MEMORY_EFFICIENCY = 0.75
# PCIe payload bandwidth per direction per generation, x16 (GB/s): 8/16/32 GT/s with 128b/130b.
PCIE_GBPS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
PCIE_EFFICIENCY = 0.8
# Host (CPU) DRAM bandwidth assumed for optimizer offload when the host is not profiled:
# a desktop / workstation reaches ~50 GB/s in STREAM. Data-centre GPUs sit in two-socket servers
# with 8 memory channels per socket (an 8x A100-SXM4-80GB MLPerf system: 2x EPYC 7713, 16x DDR4-2933
# = 375 GB/s peak; https://raw.githubusercontent.com/mlcommons/training_results_v1.0/master/Inspur/
# systems/nf5488a5_pytorch.json, read 2026-11-23): ~2/3 of that sustained. With 50 GB/s, torchtune's Llama 3.1 70B full fine-tune with CPU offload on 8x A100
# (1,568 tokens/s) was predicted at a quarter of its speed (bench/results/published_speed.md).
DEFAULT_HOST_BANDWIDTH_GBPS = 50.0
DATACENTER_HOST_BANDWIDTH_GBPS = 250.0

# CPU fp32 GEMM curve of torch on the reference machine (AMD EPYC Zen 4, 2 cores, torch 2.13
# CPU): 60 matmul shapes of 64..1024 rows x 64..16384 columns reach 0.8 of the profile's numpy
# peak, 64-row / 64-wide ones ~0.75 of that. Training steps on a CPU are costed term by term in
# core/speed/cpu.py (see bench/results/step_time_accuracy.md); these serve the inference path.
CPU_CEILING = 0.80
CPU_HALF_HIDDEN = 16.0
CPU_HALF_TOKENS = 20.0
CPU_MEMORY_EFFICIENCY = 0.55
CPU_OP_OVERHEAD_SECONDS = 40e-6
# Peak FLOPs per cycle per core when nothing was measured (fp32 FMA lanes x 2).
CPU_FLOPS_PER_CYCLE = {"avx512": 64.0, "avx2": 32.0, "neon": 16.0, "none": 8.0}

LinkKind = Literal["nvlink", "pcie-p2p", "pcie-host", "none"]


@dataclass(frozen=True)
class DeviceRates:
    kind: Literal["gpu", "cpu"]
    name: str
    architecture: str
    count: int  # devices training in data parallel (1 for the CPU)
    peak_flops: dict[str, float]  # FLOP/s by precision ("fp32", "fp16", "bf16", ...)
    measured: bool  # peak_flops come from a matmul benchmark on this machine
    ceiling: float  # efficiency reached by large matrices
    half_hidden: float
    half_tokens: float
    memory_bandwidth_bytes_per_s: float
    memory_efficiency: float
    op_overhead_seconds: float
    link_kind: LinkKind
    link_bytes_per_s: float  # per direction, per device, usable for collectives
    pcie_bytes_per_s: float  # host <-> device, per direction (0 for the CPU)
    host_bandwidth_bytes_per_s: float  # CPU DRAM, for offloaded optimizer steps
    tdp_watts: float | None
    notes: list[str] = field(default_factory=list)
    cache_bytes: float = 0.0  # CPU last-level cache (0: unknown / not used), for the CPU step model
    # Several nodes (core/machines/multinode_spec.py): the network one node pushes to the others, usable
    # bytes/s per direction (line rate x NETWORK_EFFICIENCY), shared by the node's GPUs; 0 on one node.
    nodes: int = 1
    network_bytes_per_s: float = 0.0
    network_label: str = ""  # "ib-ndr (assumed)"
    # CPU: seconds per element of a training-mode dropout (profile benchmark); None where unmeasured.
    dropout_seconds_per_element: float | None = None
    # CPU: torch's fp32 training-matmul rate at the benchmark's shape (FLOP/s; hardware.benchmark.
    # cpu_training_gemm_gflops) and the cost of a fresh page per byte; None where unmeasured.
    training_gemm_flops: float | None = None
    training_gemm_narrow_flops: float | None = None  # the same, 256 wide (sets the thin-matrix fall-off)
    first_touch_seconds_per_byte: float | None = None
    # The machine these rates were read from (None for catalog rates): terms that depend on what fits
    # in memory (a paged optimizer's states evicted to RAM) run the memory model on it.
    profile: HardwareProfile | None = field(default=None, compare=False, repr=False)

    def matmul_efficiency(self, hidden: int, tokens: int) -> float:
        """Fraction of peak reached by the GEMMs of a model of width `hidden` on `tokens` rows."""
        h_term = hidden / (hidden + self.half_hidden)
        t_term = tokens / (tokens + self.half_tokens)
        return self.ceiling * h_term * t_term

    def attention_efficiency(self, seq_len: int) -> float:
        """Fraction of peak reached by fused (flash / SDPA) attention kernels over `seq_len` tokens."""
        share = ATTENTION_SHARE_OF_CEILING.get(self.architecture, DEFAULT_ATTENTION_SHARE)
        return self.ceiling * share * seq_len / (seq_len + ATTENTION_HALF_SEQ)

    def flops_for(self, precision: str) -> tuple[float, str]:
        """Peak FLOP/s for a compute precision, falling back to fp32 when it is not supported."""
        if precision in self.peak_flops:
            return self.peak_flops[precision], precision
        return self.peak_flops.get("fp32", min(self.peak_flops.values())), "fp32"


def compute_precision(precision_mode: str, method: str) -> str:
    """Precision the matmuls run in for a TrainingSetup.precision value."""
    if precision_mode.startswith("bf16"):
        return "bf16"
    if precision_mode.startswith("fp16"):
        return "fp16"
    return "fp32"


def _catalog_spec(catalog_id: str | None) -> GpuSpec | None:
    """The GPU catalog entry for an id, or None when the catalog does not know it."""
    if not catalog_id:
        return None
    try:
        from trainfit.core.machines.gpu_catalog import get_gpu
    except ImportError:
        return None
    try:
        return get_gpu(catalog_id)
    except Exception:  # an unknown id only loses the link figure, never the estimate
        return None


def _build_gpu_rates(
    *,
    name: str,
    architecture: str,
    count: int,
    peak_tflops: dict[str, float],
    measured: bool,
    bandwidth_gbps: float | None,
    pcie_gen: int | None,
    pcie_width: int | None,
    interconnect: str | None,
    interconnect_gbps: float | None,
    host_bandwidth_gbps: float | None,
    tdp_watts: float | None,
    notes: list[str],
    gpu_class: str | None = None,
) -> DeviceRates:
    if not peak_tflops:
        raise ValueError(f"GPU {name} has no peak FLOP/s figure")
    arch = (architecture or "unknown").lower()
    ceiling = ARCH_CEILING.get(arch, DEFAULT_GPU_CEILING)
    if gpu_class == "consumer":
        ceiling = CONSUMER_CEILING.get(arch, ceiling)
    if measured:
        ceiling = 0.85
    if bandwidth_gbps is None:
        bandwidth_gbps = 300.0
        notes.append("GPU memory bandwidth unknown: assumed 300 GB/s")
    pcie = PCIE_GBPS.get(pcie_gen or 4, 31.5) * (pcie_width or 16) / 16 * PCIE_EFFICIENCY * GB
    if count > 1 and (interconnect or "").startswith(("nvlink", "infinity")):
        # Catalog figures are bidirectional per GPU; a ring collective uses one direction.
        link = (interconnect_gbps or 300.0) / 2 * 0.7 * GB
        link_kind: LinkKind = "nvlink"
    elif count > 1:
        link = pcie * 0.75  # P2P over the PCIe switch or bounced through host memory
        link_kind = "pcie-p2p"
    else:
        link, link_kind = 0.0, "none"
    return DeviceRates(
        kind="gpu",
        name=name,
        architecture=arch,
        count=max(1, count),
        peak_flops={k: v * 1e12 for k, v in peak_tflops.items()},
        measured=measured,
        ceiling=ceiling,
        half_hidden=GPU_HALF_HIDDEN,
        half_tokens=GPU_HALF_TOKENS,
        memory_bandwidth_bytes_per_s=bandwidth_gbps * GB,
        memory_efficiency=GPU_MEMORY_EFFICIENCY,
        op_overhead_seconds=GPU_OP_OVERHEAD_SECONDS,
        link_kind=link_kind,
        link_bytes_per_s=link,
        pcie_bytes_per_s=pcie,
        host_bandwidth_bytes_per_s=(host_bandwidth_gbps or (
            DATACENTER_HOST_BANDWIDTH_GBPS if gpu_class == "datacenter" else DEFAULT_HOST_BANDWIDTH_GBPS)) * GB,
        tdp_watts=tdp_watts,
        notes=notes,
    )


def gpu_spec_rates(spec: GpuSpec, count: int = 1, host_bandwidth_gbps: float | None = None) -> DeviceRates:
    """Rates of `count` identical catalog GPUs (cloud flavors, hardware named by catalog id)."""
    return _build_gpu_rates(
        name=spec.name,
        architecture=spec.architecture,
        count=count,
        peak_tflops=dict(spec.peak_tflops),
        measured=False,
        bandwidth_gbps=spec.memory_bandwidth_gbps,
        pcie_gen=spec.pcie_gen,
        pcie_width=16,
        interconnect=spec.interconnect,
        interconnect_gbps=spec.interconnect_gbps,
        host_bandwidth_gbps=host_bandwidth_gbps,
        tdp_watts=spec.tdp_watts,
        notes=[],
        gpu_class=spec.gpu_class,
    )


def gpu_rates(profile: HardwareProfile) -> DeviceRates:
    """Rates of the profile's first GPU (data-parallel peers are assumed identical)."""
    gpu = profile.gpus[0]
    notes: list[str] = []
    bench = profile.benchmark
    measured = bool(bench and bench.gpu_tflops)
    if measured:
        notes.append("GPU matmul rate measured by trainfit profile --benchmark")
    spec = _catalog_spec(gpu.catalog_id)
    interconnect = spec.interconnect if spec else None
    if gpu.nvlink_peers and not (interconnect or "").startswith("nvlink"):
        interconnect = "nvlink"
    rates = _build_gpu_rates(
        name=gpu.name,
        architecture=gpu.architecture or (spec.architecture if spec else "unknown"),
        count=profile.gpu_count,
        peak_tflops=dict(bench.gpu_tflops) if measured else dict(gpu.peak_tflops),  # type: ignore[union-attr]
        measured=measured,
        bandwidth_gbps=(bench.gpu_bandwidth_gbps if bench and bench.gpu_bandwidth_gbps else None)
        or gpu.memory_bandwidth_gbps,
        pcie_gen=gpu.pcie_gen_max or gpu.pcie_gen,
        pcie_width=gpu.pcie_width_max or gpu.pcie_width,
        interconnect=interconnect,
        interconnect_gbps=spec.interconnect_gbps if spec else None,
        host_bandwidth_gbps=bench.memory_bandwidth_gbps if bench else None,
        tdp_watts=gpu.power_limit_watts or gpu.tdp_watts,
        notes=notes,
        gpu_class=spec.gpu_class if spec else None,
    )
    return with_network(rates, profile)


def with_network(rates: DeviceRates, profile: HardwareProfile) -> DeviceRates:
    """`rates` with the profile's inter-node network (unchanged on one node)."""
    import dataclasses

    n = profile.nodes
    if profile.node_count <= 1 or not n.network_gbps:
        return rates
    from trainfit.core.machines.network_catalog import usable_node_bandwidth_gbps

    label = f"{n.network}{' (assumed)' if n.network_assumed else ''}"
    return dataclasses.replace(rates, nodes=profile.node_count,
                               network_bytes_per_s=usable_node_bandwidth_gbps(n.network_gbps) * GB,
                               network_label=label)


def _cpu_isa(profile: HardwareProfile) -> str:
    flags = profile.cpu.flags
    if flags.get("avx512f"):
        return "avx512"
    if flags.get("avx2"):
        return "avx2"
    if flags.get("neon") or profile.cpu.architecture in ("aarch64", "arm64"):
        return "neon"
    return "none"


CPU_EMULATED_BF16_SHARE = 0.02  # bf16 / fp32 training-matmul rate without bf16 instructions (see cpu_rates)


def cpu_rates(profile: HardwareProfile, threads: float | None = None) -> DeviceRates:
    """Rates of the CPU: measured matmul GFLOP/s and bandwidth when benchmarked, else estimated."""
    notes: list[str] = []
    cores = threads or profile.cpu.usable_cores or profile.cpu.logical_cores
    bench = profile.benchmark
    peak: dict[str, float] = {}
    measured = False
    if bench and bench.cpu_fp32_gflops:
        measured = True
        peak["fp32"] = bench.cpu_fp32_gflops * 1e9
        if bench.cpu_bf16_gflops:
            peak["bf16"] = bench.cpu_bf16_gflops * 1e9
        when = f" on {bench.measured_at[:10]}" if bench.measured_at else ""
        notes.append(f"CPU matmul rate measured on this machine{when}" + (
            " (kept in trainfit's cache; `profile --benchmark` measures again)" if bench.scope == "cpu" else ""))
    else:
        clock_mhz = profile.cpu.boost_clock_mhz or profile.cpu.base_clock_mhz or 2500.0
        per_core = CPU_FLOPS_PER_CYCLE[_cpu_isa(profile)] * clock_mhz * 1e6
        # Real GEMMs reach about 70 % of the FMA peak (turbo limits, memory stalls).
        peak["fp32"] = per_core * cores * 0.7
        notes.append("CPU matmul rate estimated from cores x clock x vector width (run --benchmark to measure)")
    if "bf16" not in peak:
        has_bf16 = profile.cpu.flags.get("avx512_bf16") or profile.cpu.flags.get("amx_bf16")
        # Native bf16 dot products double the fp32 rate. Without them a bf16 training matmul
        # (autocast forward + backward) takes an emulated path: measured 2.6-3.6 GFLOP/s against
        # ~150 fp32 on an AVX2 EPYC (hardware.benchmark.cpu_autocast_bf16_gflops), about 0.02x.
        peak["bf16"] = peak["fp32"] * (2.0 if has_bf16 else CPU_EMULATED_BF16_SHARE)
    peak.setdefault("fp16", peak["fp32"] * 0.5)
    if bench and bench.memory_bandwidth_gbps:
        bandwidth = bench.memory_bandwidth_gbps
    else:
        bandwidth = 8.0 * cores  # ~8 GB/s per core of a memory-bound stream, when unmeasured
        notes.append("memory bandwidth estimated at 8 GB/s per core (run --benchmark to measure)")
    return DeviceRates(
        kind="cpu",
        name=profile.cpu.model or "CPU",
        architecture=_cpu_isa(profile),
        count=1,
        peak_flops=peak,
        measured=measured,
        ceiling=CPU_CEILING,
        half_hidden=CPU_HALF_HIDDEN,
        half_tokens=CPU_HALF_TOKENS,
        memory_bandwidth_bytes_per_s=bandwidth * GB,
        memory_efficiency=CPU_MEMORY_EFFICIENCY,
        op_overhead_seconds=CPU_OP_OVERHEAD_SECONDS,
        link_kind="none",
        link_bytes_per_s=0.0,
        pcie_bytes_per_s=0.0,
        host_bandwidth_bytes_per_s=bandwidth * GB,
        tdp_watts=profile.power.cpu_tdp_watts,
        notes=notes,
        cache_bytes=float(profile.cpu.l3_cache_bytes or profile.cpu.l2_cache_bytes or 0),
        dropout_seconds_per_element=(bench.cpu_dropout_ns_per_element * 1e-9
                                     if bench and bench.cpu_dropout_ns_per_element else None),
        training_gemm_flops=(bench.cpu_fp32_training_gflops * 1e9
                             if bench and bench.cpu_fp32_training_gflops else None),
        training_gemm_narrow_flops=(bench.cpu_fp32_training_narrow_gflops * 1e9
                                    if bench and bench.cpu_fp32_training_narrow_gflops else None),
        first_touch_seconds_per_byte=(bench.cpu_first_touch_ns_per_page * 1e-9 / 4096
                                      if bench and bench.cpu_first_touch_ns_per_page is not None else None),
    )


def device_rates(profile: HardwareProfile, device: str) -> DeviceRates:
    """Rates for the device a setup trains on ('cpu' uses the CPU even when GPUs exist)."""
    if device == "cpu" or not profile.gpus:
        return cpu_rates(profile)
    return replace(gpu_rates(profile), profile=profile)


def _when(bench) -> str:
    return f"{bench.measured_at.replace('T', ' ')[:16]} UTC" if bench.measured_at else "at an unknown time"


def rates_source(profile: HardwareProfile, device: str) -> dict:
    """Which rates the predictions for `device` ("cpu", "cuda", ...) on `profile` use, where they
    come from and when they were measured: {"source", "measured_at", "cached", "reliable", the
    figures, "text" (one line), "warning" (a measurement taken under load, else None)}."""
    bench = profile.benchmark
    out: dict = {"device": device, "source": "datasheet", "measured_at": None, "cached": False, "reliable": None,
                 "warning": None}
    if device == "cpu" or not profile.gpus:
        r = cpu_rates(profile)
        figures = {"cpu_fp32_gflops": round(r.peak_flops["fp32"] / 1e9, 1),
                   "cpu_bf16_gflops": round(r.peak_flops["bf16"] / 1e9, 1),
                   "memory_bandwidth_gbps": round(r.memory_bandwidth_bytes_per_s / GB, 1)}
        numbers = (f"fp32 {figures['cpu_fp32_gflops']:,.0f} GFLOP/s, bf16 {figures['cpu_bf16_gflops']:,.0f} GFLOP/s, "
                   f"RAM {figures['memory_bandwidth_gbps']:.1f} GB/s")
        if r.training_gemm_flops:
            figures["cpu_fp32_training_gflops"] = round(r.training_gemm_flops / 1e9, 1)
            numbers += f", torch fp32 training matmul {figures['cpu_fp32_training_gflops']:,.0f} GFLOP/s"
        if not r.measured or bench is None:
            text = f"CPU rates estimated from cores x clock x vector width, not measured: {numbers}"
            return {**out, **figures, "text": text}
        check = bench.load_check
        out.update(figures, source="measured", measured_at=bench.measured_at, cached=bench.cached,
                   reliable=None if check is None else check.reliable)
        kept = ", kept in trainfit's cache" if bench.cached else ""
        if check is not None and not check.reliable and bench.cached:
            kept = ", reused while the machine stays busy"
        text = f"CPU rates measured on this machine {_when(bench)}{kept}: {numbers}"
        if check is not None and not check.reliable:
            out["warning"] = (f"the CPU rates were measured under load ({check.reason}): step times and run times "
                              "may be too slow; run `trainfit profile --benchmark` when the machine is quiet")
            text += " (measured under load: not this machine's quiet rates)"
        elif check is None:
            text += " (load not checked)"
        return {**out, "text": text}
    gpu = profile.gpus[0]
    if bench is not None and bench.gpu_tflops:
        tflops = ", ".join(f"{k} {v:,.0f} TFLOP/s" for k, v in bench.gpu_tflops.items())
        out.update(source="measured", measured_at=bench.measured_at, reliable=True, gpu_tflops=dict(bench.gpu_tflops))
        return {**out, "text": f"GPU rates measured on this machine {_when(bench)} (profile --benchmark): {tflops}"}
    tflops = ", ".join(f"{k} {v:,.0f} TFLOP/s" for k, v in gpu.peak_tflops.items())
    out["gpu_tflops"] = dict(gpu.peak_tflops)
    return {**out, "text": f"GPU rates: {gpu.name} datasheet peaks ({tflops or 'unknown'}), not measured"}
