"""GpuSpec: one entry of the GPU catalog (data file `data/gpus.yaml`, a source per figure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# GPU vendors and number formats (the hardware profile uses the same names).
Vendor = Literal["nvidia", "amd", "intel", "apple"]
Precision = Literal["fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp4"]

GpuClass = Literal["consumer", "laptop", "workstation", "datacenter", "apple", "integrated"]


@dataclass(frozen=True)
class GpuSpec:
    id: str  # catalog key, lower-case with dashes: "rtx-4090", "h100-sxm", "m2-16gb"
    name: str  # marketing name: "NVIDIA GeForce RTX 4090"
    vendor: Vendor
    gpu_class: GpuClass
    architecture: str  # "ada", "hopper", "cdna3", "rdna3", "xe-hpg", "apple-m2"
    compute_capability: str | None  # NVIDIA only
    matrix_unit: str | None  # "tensor-core-4", "matrix-core-3", "xmx-1", None for none
    vram_bytes: int
    unified_memory: bool  # Apple / APU: the VRAM figure is system RAM
    memory_bandwidth_gbps: float
    peak_tflops: dict[str, float]  # dense (no sparsity) by precision: fp32, tf32, fp16, bf16, int8, fp8
    tdp_watts: float
    interconnect: str | None  # "nvlink-4", "pcie-5", "infinity-fabric", None
    interconnect_gbps: float | None  # per-GPU bidirectional bandwidth of that link
    pcie_gen: int | None
    aliases: list[str] = field(default_factory=list)  # other names the detector may report
    sources: dict[str, str] = field(default_factory=dict)  # figure -> URL or document
    # Memory total the driver reports (nvidia-smi / NVML), when it is below vram_bytes: ECC on
    # GDDR parts takes 1/16, the driver reserves a little on HBM parts. None: vram_bytes.
    driver_total_bytes: int | None = None
    # Part of that total the driver keeps for itself (nvidia-smi -q "FB Memory Usage: Reserved",
    # NVML v2 `reserved`): no process can allocate it. None: not recorded for this model.
    driver_reserved_bytes: int | None = None

    @property
    def usable_vram_bytes(self) -> int:
        """What a live probe of this GPU reads as its total (NVML): what nvidia-smi shows."""
        return self.driver_total_bytes or self.vram_bytes

    @property
    def precisions(self) -> list[Precision]:
        return [p for p in ("fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp4") if p in self.peak_tflops]  # type: ignore[misc]
