"""From a HardwareProfile to what `trainfit analyze` says: a performance score for LLM training
with its reasoning, warnings, and suggestions derived from the profile. Pure (no probing).

Score (0-10) = memory points (0-5) + compute points (0-5) - penalties.
- memory: what a training run can hold, log scale from 2 GiB (0) to 640 GiB (5, an 8x80 GB node);
  GPUs' VRAM summed, Apple unified memory as usable RAM, CPU-only: usable RAM at half weight
  (CPU training is compute-bound long before it is memory-bound).
- compute: dense bf16/fp16 peak over all GPUs (catalog figures, or measured with --benchmark),
  log scale from 0.1 TFLOP/s (0) to 8000 TFLOP/s (5, 8x H100 SXM at 989 each).
  CPU-only: measured GFLOP/s with --benchmark, else usable cores x clock x SIMD FLOP/cycle x 0.5.
- penalties: on battery (-1), active throttling (-1), cooling marginal (-0.5).
Both ends are the range trainfit plans for: a 2-core VM scores about 1, an HGX H100 node 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainfit.core.machines.profile import HardwareProfile

GIB = 1 << 30
_LABELS = [(8.0, "Excellent for LLM training"), (6.0, "Good: full fine-tuning of small models, LoRA of mid-size"),
           (4.0, "Fair: LoRA / QLoRA of 7B-class models"), (2.0, "Limited: QLoRA or small models"),
           (0.0, "Minimal: tiny models and experiments")]


@dataclass(frozen=True)
class Analysis:
    score: float
    label: str
    reasoning: list[str]
    warnings: list[str]
    suggestions: list[str]
    notes: list[str] = field(default_factory=list)
    # What the memory points were scored on: summed VRAM, the GPU's share of unified memory (the
    # capacity `estimate` and `plan` use), or half the usable RAM without a GPU. 0 when unknown.
    memory_bytes: int = 0


def _log_points(value: float, lo: float, hi: float, top: float = 5.0) -> float:
    if value <= lo:
        return 0.0
    return min(top, top * math.log2(value / lo) / math.log2(hi / lo))


def training_memory_bytes(p: HardwareProfile) -> tuple[int, str]:
    """Bytes a training run can hold, and why. Unknown sizes count 0 and say so (never "0 GiB").

    Unified memory (Apple): the GPU's share, from the same rule `estimate` and `plan` use as the
    device capacity (core.memory.overheads.gpu_capacity), not the RAM left after the OS reserve.
    """
    from trainfit.core.memory.overheads import gpu_capacity

    if p.gpus and not p.gpus[0].unified_memory:
        known = [g for g in p.gpus if g.vram_total_bytes is not None]
        total = sum(g.vram_total_bytes or 0 for g in known)
        why = f"{len(p.gpus)} GPU(s) with {total / GIB:.1f} GiB VRAM in total"
        if len(known) < len(p.gpus):
            unknown = [g for g in p.gpus if g.vram_total_bytes is None]
            why = (f"{len(p.gpus)} GPU(s), {total / GIB:.1f} GiB VRAM known; VRAM unknown for GPU "
                   + ", ".join(f"{g.index} ({g.unavailable.get('vram_total_bytes', 'no reason')})" for g in unknown)
                   + ": not counted")
        return total, why
    if p.gpus:
        cap = gpu_capacity(p)
        if cap is None:
            return 0, f"unified memory size unknown ({p.memory.unavailable.get('total_bytes', 'no reason')}): not counted"
        return cap, f"{cap / GIB:.1f} GiB of unified memory usable by the GPU"
    if p.memory.usable_bytes is None:
        return 0, f"CPU only: RAM size unknown ({p.memory.unavailable.get('usable_bytes', 'no reason')}): not counted"
    return p.memory.usable_bytes // 2, (f"CPU only: {p.memory.usable_bytes / GIB:.1f} GiB usable RAM, "
                                        "counted at half weight")


def _cpu_tflops(p: HardwareProfile) -> tuple[float, str]:
    b = p.benchmark
    if b is not None and (b.cpu_bf16_gflops or b.cpu_fp32_gflops):
        g = max(b.cpu_bf16_gflops or 0, b.cpu_fp32_gflops or 0)
        return g / 1000, f"CPU measured {g:.0f} GFLOP/s (matmul)"
    f = p.cpu.flags
    # FP32 FLOP per cycle per core with two FMA pipes: AVX-512 64, AVX2 32, NEON 16, else 8
    per_cycle = 64 if f.get("avx512f") else 32 if f.get("avx2") else 16 if f.get("neon") else 8
    # all-core load runs near the base clock; SMT siblings share one core's FMA units
    ghz = (p.cpu.base_clock_mhz or p.cpu.boost_clock_mhz or 2500) / 1000
    cores = min(p.cpu.usable_cores, p.cpu.physical_cores or p.cpu.usable_cores)
    tflops = cores * ghz * per_cycle * 0.5 / 1000  # 0.5: sustained vs peak
    return tflops, (f"CPU estimated {tflops * 1000:.0f} GFLOP/s = {cores:g} cores x {ghz:.1f} GHz x "
                    f"{per_cycle} FLOP/cycle x 0.5 (run --benchmark to measure)")


def _gpu_tflops(p: HardwareProfile) -> tuple[float | None, str]:
    b = p.benchmark
    if b is not None and b.gpu_tflops:
        best = max(b.gpu_tflops.get("bf16", 0), b.gpu_tflops.get("fp16", 0), b.gpu_tflops.get("fp32", 0))
        return best * len(p.gpus), f"GPU measured {best:.0f} TFLOP/s per GPU (matmul)"
    peaks = [max(g.peak_tflops.get("bf16", 0), g.peak_tflops.get("fp16", 0), g.peak_tflops.get("fp32", 0))
             for g in p.gpus]
    if not any(peaks):
        return None, "GPU peak TFLOP/s unknown (not in the GPU catalog)"
    return sum(peaks), f"GPU dense 16-bit peak {sum(peaks):.0f} TFLOP/s in total (catalog)"


def analyze_profile(p: HardwareProfile, *, owned: bool = True) -> Analysis:
    """`owned`: the profile describes a machine the user has (live or saved), not a catalog name,
    so suggestions that need the machine (benchmark it, measure its network) apply."""
    reasoning: list[str] = []
    mem_bytes, mem_why = training_memory_bytes(p)
    mem_pts = _log_points(mem_bytes / GIB, 2, 640)
    reasoning.append(f"memory {mem_pts:.1f}/5: {mem_why}")
    tflops, why = _gpu_tflops(p) if p.gpus else (None, "")
    if tflops is None:
        if why:
            reasoning.append(why)
        tflops, why = _cpu_tflops(p)
    comp_pts = _log_points(tflops, 0.1, 8000)
    reasoning.append(f"compute {comp_pts:.1f}/5: {why}")
    penalty = 0.0
    if p.power.on_ac is False:
        penalty += 1.0
        reasoning.append("-1 on battery: clocks and power limits drop")
    if p.power.throttling:
        penalty += 1.0
        reasoning.append("-1 throttling now: " + "; ".join(p.power.throttle_evidence[:2]))
    elif p.power.cooling_verdict == "marginal":
        penalty += 0.5
        reasoning.append("-0.5 cooling marginal for sustained load")
    score = round(max(0.0, min(10.0, mem_pts + comp_pts - penalty)), 1)
    label = next(text for floor, text in _LABELS if score >= floor)
    return Analysis(score, label, reasoning, warnings(p), suggestions(p, owned=owned), memory_bytes=mem_bytes)


def warnings(p: HardwareProfile) -> list[str]:
    out: list[str] = []
    pw, mem = p.power, p.memory
    if pw.on_ac is False:
        left = f", about {pw.battery_seconds_left / 60:.0f} min left" if pw.battery_seconds_left else ""
        out.append(f"On battery ({pw.battery_percent:.0f} %{left}): plug in before training")
    if pw.throttling:
        out.extend(f"Throttling: {e}" for e in pw.throttle_evidence)
    if pw.cooling_verdict == "inadequate":
        out.append("Cooling looks inadequate: " + "; ".join(pw.cooling_evidence[:2]))
    if pw.psu_headroom_watts is not None and pw.psu_watts and pw.psu_headroom_watts < 0.1 * pw.psu_watts:
        out.append(f"PSU headroom {pw.psu_headroom_watts:.0f} W on a {pw.psu_watts:.0f} W supply: full load may "
                   "trip it; cap GPU power (nvidia-smi -pl)")
    if mem.usable_bytes is None:
        out.append(f"RAM size unknown ({mem.unavailable.get('usable_bytes', 'no reason')}): what fits in RAM "
                   "(CPU training, offload, model loading) cannot be checked")
    for g in p.gpus:
        if g.vram_total_bytes is None and not g.unified_memory:
            out.append(f"GPU {g.index} memory unknown ({g.unavailable.get('vram_total_bytes', 'no reason')}): "
                       "estimate and plan give no fit verdict for it")
    if mem.total_bytes and mem.usable_bytes is not None and mem.usable_bytes < 16 * GIB:
        out.append(f"Little RAM: {mem.usable_bytes / GIB:.1f} GiB usable (binary GiB) limits model loading "
                   "and CPU offload")
    if mem.cgroup_limit_bytes:
        out.append(f"Container memory limit {mem.cgroup_limit_bytes / GIB:.1f} GiB binds before the host's "
                   f"{mem.total_bytes / GIB:.0f} GiB")
    if p.cpu.cgroup_cpu_quota is not None:
        out.append(f"Container CPU quota {p.cpu.cgroup_cpu_quota:g} cores of {p.cpu.logical_cores}: "
                   "set dataloader workers and torch threads to match")
    vram = max((g.vram_total_bytes or 0 for g in p.gpus if not g.unified_memory), default=0)
    if vram and mem.usable_bytes is not None and mem.usable_bytes < vram:
        out.append("Usable RAM is below one GPU's VRAM: loading full checkpoints may need low_cpu_mem_usage")
    if mem.swap_kind == "hdd":
        out.append("Swap is on a spinning disk: spilling to it stalls training")
    for s in p.storage:
        if s.free_bytes is not None and s.free_bytes < 50 * GIB:
            out.append(f"{s.role} dir {s.path}: only {s.free_bytes / GIB:.0f} GiB free for checkpoints/models")
        if s.kind in ("hdd", "network"):
            out.append(f"{s.role} dir {s.path} is on {s.kind} storage: model loads and checkpoints will be slow")
    for g in p.gpus:
        if g.pcie_width and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
            out.append(f"GPU {g.index} runs PCIe x{g.pcie_width} of x{g.pcie_width_max}: host transfers are slower")
        if g.mig_profile:
            out.append(f"GPU {g.index} is a MIG slice ({g.mig_profile}): a fraction of the board's compute")
    for vendor in ("nvidia",):
        why = p.unavailable.get(vendor, "")
        if "mismatch" in why or "lost" in why or "timed out" in why:
            out.append(f"NVIDIA GPU unusable: {why}")
    return out


def suggestions(p: HardwareProfile, *, owned: bool = True) -> list[str]:
    out: list[str] = []
    g0 = p.gpus[0] if p.gpus else None
    if g0 and "bf16" in g0.precisions:
        out.append("Use bf16 mixed precision (supported by the GPU; no loss scaling needed)")
    elif g0 and "fp16" in g0.precisions:
        out.append("Use fp16 mixed precision with loss scaling (no bf16 on this GPU)")
    elif not g0 and p.backends.cpu_bf16:
        out.append("The CPU has bf16 instructions (AVX512-BF16/AMX/FEAT_BF16): bf16 autocast on CPU is worth it")
    vram = g0.vram_total_bytes if g0 else None  # None: unknown, no size-based advice
    if g0 and vram is not None and not g0.unified_memory and vram < 12 * GIB:
        out.append("Under 12 GiB VRAM: LoRA/QLoRA with gradient checkpointing for 1B+ models")
    elif g0 and vram is not None and vram < 40 * GIB:
        out.append("Gradient checkpointing lets larger models or longer sequences fit")
    if len(p.gpus) > 1:
        if all(g.nvlink_peers for g in p.gpus):
            out.append("GPUs are linked all-to-all (NVLink): FSDP / ZeRO-3 sharding scales well")
        else:
            out.append("No NVLink between GPUs: prefer DDP or ZeRO-2 with gradient accumulation over ZeRO-3")
    if not p.gpus:
        out.append(f"CPU training: set torch threads to {max(1, int(p.cpu.usable_cores))} (usable cores) "
                   "and keep models small or use LoRA")
    if g0 and g0.vendor == "apple":
        out.append("Apple GPU: train on the mps device; unified memory is shared with the OS, keep headroom")
    if owned and any(s.kind in ("hdd", "network", "unknown") for s in p.storage):
        out.append("Pre-tokenize the dataset onto a local SSD/NVMe; NVMe is recommended for streaming")
    if owned and p.network.download_mbps is None:
        out.append("Download models and datasets before training (bandwidth not measured; set "
                   "TRAINFIT_BANDWIDTH_URL to measure)")
    if owned and p.benchmark is None:
        out.append("Run `trainfit analyze --benchmark` to replace datasheet figures with measured ones")
    elif owned and p.benchmark.scope == "cpu" and p.gpus:
        out.append("Run `trainfit analyze --benchmark` to measure the GPUs too (the CPU rates are measured)")
    return out
