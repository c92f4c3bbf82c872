"""Building GpuInfo records from what a vendor probe could read, and catalog enrichment.

Every vendor probe reads a different subset of the fields; `make_gpu` fills the rest with
None plus a reason, so no field is ever unknown without saying why.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from trainfit.core.machines.profile import GpuInfo

_LIST_FIELDS = {"precisions": [], "peak_tflops": {}, "nvlink_peers": [], "throttle_reasons": []}
# None means "does not apply" for these (profile._NONE_IS_MEANINGFUL); a reason only when given.
_DOES_NOT_APPLY = {"catalog_id", "mig_profile", "rocm_version", "cuda_version", "compute_capability"}
# Filled from the GPU catalog, not by the probes.
CATALOG_FIELDS = ("architecture", "matrix_unit", "memory_bandwidth_gbps", "tdp_watts")


def make_gpu(
    *, index: int, vendor: str, name: str, unified_memory: bool, reasons: dict[str, str],
    default_reason: str, **values: Any,
) -> GpuInfo:
    """GpuInfo from the values read; any other field is None with reasons[field] or the default.

    A value given as None must have its reason in `reasons` (or takes the default reason).
    """
    kwargs: dict[str, Any] = {"index": index, "vendor": vendor, "name": name,
                              "unified_memory": unified_memory}
    unavailable: dict[str, str] = {}
    for f in dataclasses.fields(GpuInfo):
        if f.name in kwargs or f.name == "unavailable":
            continue
        if f.name in _LIST_FIELDS:
            kwargs[f.name] = values.get(f.name, type(_LIST_FIELDS[f.name])())
            if f.name in reasons:  # an empty list that could not be read, not "none"
                unavailable[f.name] = reasons[f.name]
            continue
        value = values.get(f.name)
        kwargs[f.name] = value
        if value is None and f.name in _DOES_NOT_APPLY:
            continue  # cuda_version on an AMD GPU, mig_profile on a whole board: no reason needed
        if value is None:
            if f.name in CATALOG_FIELDS and f.name not in reasons:
                unavailable[f.name] = "not matched in the GPU catalog"
            else:
                unavailable[f.name] = reasons.get(f.name, default_reason)
    unknown = set(values) - set(kwargs)
    if unknown:
        raise TypeError(f"unknown GpuInfo field(s): {', '.join(sorted(unknown))}")
    # reasons for fields that are None "by meaning" are still useful (e.g. catalog_id)
    for key, why in reasons.items():
        if key in kwargs and kwargs[key] is None:
            unavailable.setdefault(key, why)
    return GpuInfo(**kwargs, unavailable=unavailable)


def failed_gpu(*, index: int, vendor: str, name: str, exc: BaseException, what: str) -> GpuInfo:
    """A GPU the probe saw but could not read (a driver or library answer it did not expect):
    kept in the list with every field unknown and the reason, so the other GPUs stay too."""
    why = f"reading {what} failed: {type(exc).__name__}: {exc}"
    gpu = make_gpu(index=index, vendor=vendor, name=name, unified_memory=False, reasons={}, default_reason=why)
    return dataclasses.replace(gpu, unavailable={**gpu.unavailable, "name": why})


def enrich_from_catalog(gpu: GpuInfo) -> GpuInfo:
    """Fill catalog_id, architecture, matrix unit, precisions, peak TFLOP/s, bandwidth and TDP
    from the GPU catalog (`trainfit.core.machines.gpu_catalog.find_gpu`). Probe values win over the
    catalog where both exist (a probe reads this board; the catalog knows the model)."""
    try:
        from trainfit.core.machines.gpu_catalog import find_gpu
    except ImportError:
        return _without_catalog(gpu, "GPU catalog unavailable")
    lookup_name = gpu.name.split(" (")[0]  # "Apple M2 Pro (19-core GPU)" -> "Apple M2 Pro"
    vram = gpu.vram_total_bytes
    if gpu.mig_profile:  # "NVIDIA A100-SXM4-80GB MIG 1g.10gb": look up the board
        lookup_name, vram = lookup_name.split(" MIG")[0], None
    try:
        spec = find_gpu(lookup_name, vram)
    except Exception as exc:  # a catalog bug must not break profiling
        return _without_catalog(gpu, f"GPU catalog lookup failed: {type(exc).__name__}: {exc}")
    if spec is None:
        return _without_catalog(gpu, f"'{lookup_name}' is not in the GPU catalog")
    try:
        return _with_catalog(gpu, spec)
    except Exception as exc:  # an odd probe value (e.g. a MIG size) keeps the GPU, without catalog figures
        return _without_catalog(gpu, f"GPU catalog figures not applied: {type(exc).__name__}: {exc}")


def _with_catalog(gpu: GpuInfo, spec: Any) -> GpuInfo:
    unavailable = dict(gpu.unavailable)
    updates: dict[str, Any] = {"catalog_id": spec.id}
    for name, value in (("architecture", spec.architecture), ("matrix_unit", spec.matrix_unit),
                        ("memory_bandwidth_gbps", spec.memory_bandwidth_gbps),
                        ("tdp_watts", spec.tdp_watts),
                        ("compute_capability", spec.compute_capability)):
        if getattr(gpu, name) is None and value is not None:
            updates[name] = value
            unavailable.pop(name, None)
        elif getattr(gpu, name) is None and name == "matrix_unit":
            unavailable[name] = "catalog: no matrix unit on this GPU"
    if not gpu.peak_tflops:
        share = mig_share(gpu.mig_profile, gpu.vram_total_bytes, spec.usable_vram_bytes)  # NVML vs NVML totals
        updates["peak_tflops"] = {k: round(v * share[0], 2) for k, v in spec.peak_tflops.items()}
        updates["precisions"] = list(spec.precisions)
        if gpu.mig_profile:
            updates["memory_bandwidth_gbps"] = round(spec.memory_bandwidth_gbps * share[1], 1)
    if gpu.vram_reserved_bytes is None and gpu.vram_total_bytes == spec.usable_vram_bytes:
        # a driver whose NVML has no v2 call but counts its share in the total, as the catalog's does
        from trainfit.core.machines.gpu_catalog import driver_reserved_bytes

        updates["vram_reserved_bytes"] = driver_reserved_bytes(spec)
        unavailable.pop("vram_reserved_bytes", None)
    unavailable.pop("catalog_id", None)
    return dataclasses.replace(gpu, **updates, unavailable=unavailable)


def mig_share(profile: str | None, slice_bytes: int | None, board_bytes: int) -> tuple[float, float]:
    """(compute share, memory-bandwidth share) of a MIG slice. A100/H100 split into 7 compute
    slices ("1g" = 1/7 of the SMs) and 8 memory slices; bandwidth follows the memory share
    (NVIDIA MIG User Guide, "Supported MIG Profiles")."""
    if not profile:
        return 1.0, 1.0
    match = re.match(r"(\d+)g\.", profile)
    compute = int(match.group(1)) / 7 if match else 1.0
    memory = min(1.0, slice_bytes / board_bytes) if slice_bytes and board_bytes else compute
    return min(1.0, compute), memory


def _without_catalog(gpu: GpuInfo, reason: str) -> GpuInfo:
    unavailable = dict(gpu.unavailable)
    unavailable["catalog_id"] = reason
    for name in CATALOG_FIELDS:
        if getattr(gpu, name) is None:
            unavailable[name] = reason
    return dataclasses.replace(gpu, unavailable=unavailable)
