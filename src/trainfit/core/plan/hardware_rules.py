"""What a device can run, as data in one place: precisions, attention kernels, optimizers,
quantisation, sharding — each with the reason a plan quotes.

Sources: PyTorch AMP docs (bf16 needs compute capability >= 8.0 on CUDA; fp16 autocast needs loss
scaling), the flash-attention README (FA2: Ampere, Ada, Hopper; FA3: Hopper), bitsandbytes'
install matrix (CUDA; ROCm and XPU backends are preview builds, no MPS/CPU training kernels),
DeepSpeed / FSDP docs (ZeRO needs NCCL/RCCL collectives: several GPUs; one GPU only with
offload), Apple's Metal docs (MPS: fp16 and fp32; bf16 from macOS 14 on M2 and later), oneDNN (CPU bf16
is fast only with AVX512-BF16 / AMX / Arm BF16; otherwise it is emulated, slower than fp32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainfit.core.machines.profile import GpuInfo, HardwareProfile

Half = Literal["bf16", "fp16"]

# GPU generations (catalog `architecture`) -> facts. `tensor`: matrix units that make 16-bit
# matmuls fast; `flash`: FlashAttention-2 kernels exist; `laptop_thermal`: sustained clocks drop.
_GPU_FAMILIES: dict[str, dict] = {
    "blackwell": {"label": "NVIDIA Blackwell (RTX 50 / B-series)", "bf16": True, "tensor": True, "flash": True,
                  "fp8": True},
    "hopper": {"label": "NVIDIA Hopper", "bf16": True, "tensor": True, "flash": True, "fp8": True},
    "ada": {"label": "NVIDIA Ada (RTX 40 / L4 / L40)", "bf16": True, "tensor": True, "flash": True, "fp8": True},
    "ampere": {"label": "NVIDIA Ampere (RTX 30 / A-series)", "bf16": True, "tensor": True, "flash": True},
    "turing": {"label": "NVIDIA Turing (RTX 20 / GTX 16 / T4)", "bf16": False, "tensor": True, "flash": False},
    "volta": {"label": "NVIDIA Volta (V100)", "bf16": False, "tensor": True, "flash": False},
    "pascal": {"label": "NVIDIA Pascal (GTX 10 / P100)", "bf16": False, "tensor": False, "flash": False},
    "cdna3": {"label": "AMD CDNA3 (MI300)", "bf16": True, "tensor": True, "flash": True},
    "cdna2": {"label": "AMD CDNA2 (MI200)", "bf16": True, "tensor": True, "flash": True},
    "cdna1": {"label": "AMD CDNA1 (MI100)", "bf16": True, "tensor": True, "flash": False},
    "rdna4": {"label": "AMD RDNA4", "bf16": True, "tensor": True, "flash": False},
    "rdna3": {"label": "AMD RDNA3", "bf16": True, "tensor": True, "flash": False},
    "rdna2": {"label": "AMD RDNA2", "bf16": False, "tensor": False, "flash": False},
    "xe-hpc": {"label": "Intel Data Center GPU Max", "bf16": True, "tensor": True, "flash": False},
    "xe-hpg": {"label": "Intel Arc (Alchemist)", "bf16": True, "tensor": True, "flash": False},
    "xe2-hpg": {"label": "Intel Arc (Battlemage)", "bf16": True, "tensor": True, "flash": False},
}
# Vendor -> device; which vendors have bitsandbytes training kernels that trainfit runs.
_DEVICE = {"nvidia": "cuda", "amd": "rocm", "apple": "mps", "intel": "xpu"}
_BNB_DEVICES = ("cuda",)


@dataclass(frozen=True)
class DeviceRules:
    """What one machine's training device can run, and why."""

    device: str  # cuda | rocm | mps | xpu | cpu
    label: str  # "NVIDIA Ampere (RTX 30 / A-series)", "CPU (AVX2, no bf16 instructions)"
    half: Half | None  # the 16-bit type it computes fast; None: stay in fp32
    precisions: tuple[str, ...]  # TrainingSetup.precision values it can train in
    attention: tuple[str, ...]  # attention kernels available
    optimizers: tuple[str, ...]
    quantization: bool  # bitsandbytes 4/8-bit weights (QLoRA)
    max_zero_stage: int  # 0 where no ZeRO / FSDP sharding is possible
    gpus: int
    laptop: bool = False
    reasons: dict[str, str] = field(default_factory=dict)  # decision -> reason


def half_type(profile: HardwareProfile, device: str | None = None) -> Half | None:
    """The one rule for "the fast 16-bit type here" (None: fp32 is the fast type)."""
    return rules_for(profile, device).half


def _is_laptop(gpu: GpuInfo) -> bool:
    """The GPU catalog's class (its name matching folds "Mobile" / "Max-Q" into laptop parts)."""
    if not gpu.catalog_id:
        return False
    from trainfit.core.machines.gpu_catalog import get_gpu

    return get_gpu(gpu.catalog_id).gpu_class == "laptop"


def rules_for(profile: HardwareProfile, device: str | None = None) -> DeviceRules:
    """Rules for the device a run uses on `profile` (default: its accelerator, else the CPU)."""
    device = device or profile.accelerator
    if device == "cpu" or not profile.gpus:
        return _cpu_rules(profile)
    return _gpu_rules(profile, device)


def _cpu_rules(p: HardwareProfile) -> DeviceRules:
    flags = p.cpu.flags
    measured = p.benchmark
    bench_bf16 = bool(measured and measured.cpu_bf16_gflops and measured.cpu_fp32_gflops
                      and measured.cpu_bf16_gflops > measured.cpu_fp32_gflops)
    native = p.backends.cpu_bf16 or bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))
    isa = "AMX" if flags.get("amx_bf16") else "AVX-512" if flags.get("avx512f") else \
        "AVX2" if flags.get("avx2") else "NEON" if flags.get("neon") else "no SIMD flags"
    reasons: dict[str, str] = {}
    if native or bench_bf16:
        half: Half | None = "bf16"
        why = "bf16 instructions (AVX512-BF16 / AMX / Arm BF16)" if native else \
            f"measured bf16 matmul {measured.cpu_bf16_gflops:.0f} > fp32 {measured.cpu_fp32_gflops:.0f} GFLOP/s"
        reasons["precision"] = f"bf16 autocast: {why}"
        precisions = ("fp32", "bf16-mixed", "bf16")
    else:
        half = None
        reasons["precision"] = f"fp32: the CPU ({isa}) has no bf16 instructions, so bf16 is emulated and slower"
        precisions = ("fp32", "bf16-mixed", "bf16")
    reasons["quantization"] = "no QLoRA / 8-bit optimizers: bitsandbytes training kernels need CUDA"
    reasons["sharding"] = "no ZeRO / FSDP on one CPU process (nothing to shard across)"
    reasons["attention"] = "sdpa (PyTorch's fused CPU kernel) or eager; no flash-attention on CPU"
    cores = p.cpu.physical_cores or int(p.cpu.usable_cores)
    reasons["threads"] = (f"torch threads = {min(cores, int(p.cpu.usable_cores) or cores)} physical cores "
                          "(SMT siblings share FMA units)")
    return DeviceRules(
        device="cpu", label=f"CPU ({isa}{', bf16' if half else ', no bf16 instructions'})", half=half,
        precisions=precisions, attention=("sdpa", "eager"),
        optimizers=("adamw", "sgd", "sgd-momentum", "adafactor"), quantization=False, max_zero_stage=0,
        gpus=0, reasons=reasons)


def _gpu_rules(p: HardwareProfile, device: str) -> DeviceRules:
    g = p.gpus[0]
    arch = (g.architecture or "").lower()
    fam = _GPU_FAMILIES.get(arch)
    if fam is None and arch.startswith("apple"):
        fam = {"label": f"Apple {arch[6:].upper()} GPU (unified memory)", "bf16": arch not in ("apple-m1",),
               "tensor": True, "flash": False}
    if fam is None:
        fam = {"label": g.name, "bf16": "bf16" in g.precisions, "tensor": "fp16" in g.peak_tflops,
               "flash": False}
    reasons: dict[str, str] = {}
    cc = f"compute capability {g.compute_capability}" if g.compute_capability else fam["label"]
    bf16 = fam["bf16"] and ("bf16" in g.precisions or not g.precisions)
    if device == "mps" and not bf16:
        half: Half | None = "fp16"
        reasons["precision"] = f"fp16: {fam['label']} has no bf16 in Metal"
        precisions: tuple[str, ...] = ("fp32", "fp16-mixed", "fp16")
    elif bf16:
        half = "bf16"
        reasons["precision"] = f"bf16: {cc} supports it (no loss scaling needed)"
        precisions = ("fp32", "bf16-mixed", "bf16", "fp16-mixed", "fp16")
    elif fam["tensor"]:
        half = "fp16"
        reasons["precision"] = f"fp16 with loss scaling: no bf16 on {cc}"
        precisions = ("fp32", "fp16-mixed", "fp16")
    else:
        half = None
        reasons["precision"] = f"fp32: {fam['label']} has no tensor cores, so 16-bit brings no speed"
        precisions = ("fp32", "fp16-mixed", "fp16")
    attention = ("sdpa", "eager")
    if fam.get("flash") and device in ("cuda", "rocm"):
        attention = ("flash", "sdpa", "eager")
        reasons["attention"] = f"flash-attention 2 available on {fam['label']}"
    else:
        reasons["attention"] = f"sdpa: no flash-attention kernels for {fam['label']}"
    quant = device in _BNB_DEVICES
    optimizers = ("adamw", "sgd", "sgd-momentum", "adafactor")
    if quant:
        optimizers += ("adamw-8bit", "paged-adamw-8bit", "lion")
        reasons["quantization"] = "bitsandbytes 4/8-bit kernels (QLoRA, 8-bit optimizers) run on CUDA"
    else:
        reasons["quantization"] = f"no QLoRA / 8-bit optimizers on {device}: bitsandbytes training kernels need CUDA"
    n = len(p.gpus)
    if device == "mps" or n == 1:
        max_zero = 0
        reasons["sharding"] = "one device: data parallelism and ZeRO/FSDP sharding need several GPUs"
    else:
        max_zero = 3
        linked = all(x.nvlink_peers for x in p.gpus)
        backend = "NCCL" if device == "cuda" else "RCCL" if device == "rocm" else "oneCCL"
        # The interconnect only: which sharding a plan chose, and why, is the plan's reason
        # (plan_reasons._sharding_reason), so this never argues for a stage the plan did not pick.
        reasons["sharding"] = (f"{n} GPUs, {backend}, " + ("NVLink all-to-all (fast parameter gathers)" if linked
                               else "PCIe only (gathers and reductions share the PCIe bus)"))
        if p.node_count > 1:
            inside = "NVLink" if linked else "PCIe"
            reasons["sharding"] = (f"{n} GPUs on {p.node_count} nodes, {backend}: {inside} inside a node, "
                                   f"{p.nodes.network} between nodes; ZeRO-3/FSDP full sharding gathers parameters "
                                   "over the network, hybrid sharding keeps that inside each node")
    laptop = _is_laptop(g)
    if laptop:
        reasons["thermal"] = f"{g.name} is a laptop GPU: sustained clocks fall with heat; keep long runs conservative"
    return DeviceRules(
        device=device, label=fam["label"], half=half, precisions=precisions, attention=attention,
        optimizers=optimizers, quantization=quant, max_zero_stage=max_zero, gpus=n, laptop=laptop, reasons=reasons)


def unsupported(rules: DeviceRules, setup) -> str | None:
    """Why `setup` cannot run on this device, or None when it can."""
    if setup.precision not in rules.precisions:
        return f"precision {setup.precision} does not run on {rules.label}"
    if setup.precision.startswith("fp16") and rules.device == "cpu":
        return "fp16 does not train on CPU"
    if setup.attention not in rules.attention:
        return f"attention {setup.attention} has no kernel on {rules.label}"
    if setup.optimizer not in rules.optimizers:
        return f"optimizer {setup.optimizer} needs CUDA + bitsandbytes"
    if setup.quant != "none" and not rules.quantization:
        return f"{setup.quant} weights need CUDA + bitsandbytes"
    if setup.zero_stage > rules.max_zero_stage and not (setup.offload != "none" and rules.gpus >= 1):
        return f"ZeRO-{setup.zero_stage} needs several GPUs"
    return None


def power_cap_hint(device: str, watts: int | None) -> str:
    """How the device's own tool caps its power (Apple has no per-GPU cap, only Low Power Mode).
    Used by the planner's warnings and by the thermal / battery policies of `trainfit train`."""
    if device == "mps":
        return "turn on Low Power Mode (`sudo pmset -a lowpowermode 1`)"
    if watts is None:
        return {"cuda": "cap its power with `sudo nvidia-smi -pl WATTS`",
                "rocm": "cap its power with `sudo rocm-smi --setpoweroverdrive WATTS`",
                "xpu": "cap its power limit (xpu-smi config)"}.get(device, "cap its power limit")
    return {"cuda": f"cap it with `sudo nvidia-smi -pl {watts}`",
            "rocm": f"cap it with `sudo rocm-smi --setpoweroverdrive {watts}`",
            "xpu": f"cap its power limit at {watts} W (xpu-smi config)"}.get(device, f"cap it at {watts} W")
