"""Terminal rendering of a HardwareProfile (and of an Analysis), reusable by every command.

Sizes are binary units (GiB = 2^30 bytes) and say so; speeds MB/s and GB/s are decimal.
"""

from __future__ import annotations

from typing import Any

from trainfit.core.machines.profile import HardwareProfile

GIB = 1 << 30


def gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


def mib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / (1 << 20):.1f} MiB"


def _why(obj: Any, field: str) -> str:
    return f"unknown ({obj.unavailable.get(field, 'no reason')})"


def profile_lines(p: HardwareProfile) -> list[tuple[str, str]]:
    """(label, text) rows: the system summary every command can show."""
    c, m, pw = p.cpu, p.memory, p.power
    rows: list[tuple[str, str]] = [("Source", p.source)]
    rows.append(("OS", f"{p.os.system} {p.os.release}" + (" (container)" if p.os.in_container else "")
                 + (" (WSL)" if p.os.in_wsl else "")))
    clocks = (f", {c.base_clock_mhz / 1000:.1f}-{(c.boost_clock_mhz or c.base_clock_mhz) / 1000:.1f} GHz"
              if c.base_clock_mhz else (f", up to {c.boost_clock_mhz / 1000:.1f} GHz" if c.boost_clock_mhz else ""))
    flags = ", ".join(k for k, v in c.flags.items() if v) or "none"
    rows.append(("CPU", f"{c.model or _why(c, 'model')} ({c.architecture}), "
                        f"{c.physical_cores if c.physical_cores is not None else '?'} cores / {c.logical_cores} threads, "
                        f"usable {c.usable_cores:g}" + (f" (quota {c.cgroup_cpu_quota:g})" if c.cgroup_cpu_quota else "")
                 + clocks))
    rows.append(("CPU features", f"{flags}; NUMA nodes {len(c.numa_nodes)}; L2 {mib(c.l2_cache_bytes)}"
                                 f", L3 {mib(c.l3_cache_bytes)}"))
    limit = f", container limit {gib(m.cgroup_limit_bytes)}" if m.cgroup_limit_bytes else ""
    if m.total_bytes is None:
        rows.append(("RAM", _why(m, "total_bytes")))
    else:
        rows.append(("RAM", f"{gib(m.total_bytes)} total, {gib(m.available_bytes)} available{limit}; usable for "
                            f"training {gib(m.usable_bytes)} (OS reserve {gib(m.os_reserve_bytes)})"
                     + (", unified with the GPU" + _gpu_share(p) if m.unified_with_gpu else "")))
    if m.swap_total_bytes is None:
        rows.append(("Swap", _why(m, "swap_total_bytes")))
    else:
        rows.append(("Swap", f"{gib(m.swap_total_bytes)} ({m.swap_kind})" if m.swap_total_bytes else "none"))
    if not p.gpus:
        rows.append(("GPU", "none: " + "; ".join(f"{k}: {v}" for k, v in p.unavailable.items()
                                                 if k in ("nvidia", "amd", "intel", "apple"))))
    for g in p.gpus:
        vram = (f"{gib(g.vram_total_bytes)} VRAM" if g.vram_total_bytes is not None
                else f"VRAM {_why(g, 'vram_total_bytes')}")
        parts = [f"{g.name}", vram + (" (unified)" if g.unified_memory else "")]
        if g.vram_free_bytes is not None:
            parts.append(f"{gib(g.vram_free_bytes)} free")
        if g.compute_capability:
            parts.append(f"CC {g.compute_capability}")
        if g.architecture:
            parts.append(g.architecture + (f"/{g.matrix_unit}" if g.matrix_unit else ""))
        if g.precisions:
            parts.append("/".join(g.precisions))
        if g.peak_tflops:
            best = max(g.peak_tflops.get("bf16", 0), g.peak_tflops.get("fp16", 0))
            if best:
                parts.append(f"{best:g} TFLOP/s 16-bit peak")
        if g.pcie_gen_max:
            parts.append(f"PCIe {g.pcie_gen}/{g.pcie_gen_max} x{g.pcie_width}/{g.pcie_width_max} (now/max)")
        if g.nvlink_peers:
            parts.append(f"NVLink to {len(g.nvlink_peers)} GPU(s)")
        if g.mig_profile:
            parts.append(f"MIG {g.mig_profile}")
        if g.temperature_c is not None:
            parts.append(f"{g.temperature_c:.0f} C")
        if g.power_draw_watts is not None:
            cap_w = g.power_limit_watts or g.tdp_watts
            parts.append(f"{g.power_draw_watts:.0f}/{cap_w:.0f} W" if cap_w else f"{g.power_draw_watts:.0f} W (limit unknown)")
        rows.append((f"GPU {g.index}", ", ".join(parts)))
    for name in ("cuda", "rocm", "mps", "xpu"):
        b = getattr(p.backends, name)
        if b.available:
            rows.append(("Backend", f"{name} {b.version or ''}".strip()))
    for s in p.storage:
        speed = (f", {s.read_mbps:.0f} MB/s read, {s.write_mbps:.0f} MB/s write"
                 if s.read_mbps is not None and s.write_mbps is not None else "")
        if speed and s.measured_at:
            speed += f" (measured {s.measured_at[:16].replace('T', ' ')} UTC)"
        rows.append((f"Disk ({s.role})", f"{s.path}: {s.kind} ({s.device or '?'}), {gib(s.free_bytes)} free of "
                                         f"{gib(s.total_bytes)}{speed}"))
    net = p.network
    rows.append(("Network", f"{net.download_mbps:.1f} MB/s from {net.endpoint}" if net.download_mbps is not None
                 else _why(net, "download_mbps")))
    power = []
    if pw.on_ac is not None:
        power.append("on AC" if pw.on_ac else f"ON BATTERY {pw.battery_percent:.0f} %")
    if pw.cpu_package_watts is not None:
        power.append(f"CPU package {pw.cpu_package_watts:.0f} W now")
    power.append(f"system TDP about {pw.estimated_system_tdp_watts:.0f} W (estimate)")
    if pw.psu_watts:
        power.append(f"PSU {pw.psu_watts:.0f} W, headroom {pw.psu_headroom_watts:.0f} W")
    rows.append(("Power", ", ".join(power)))
    rows.append(("Cooling", f"{pw.cooling_verdict}" + (f" ({'; '.join(pw.cooling_evidence[:2])})"
                                                      if pw.cooling_evidence else "")))
    b = p.benchmark
    if b is not None:
        parts = []
        if b.memory_bandwidth_gbps is not None:
            parts.append(f"RAM {b.memory_bandwidth_gbps:.1f} GB/s")
        if b.cpu_fp32_gflops is not None:
            parts.append(f"CPU fp32 {b.cpu_fp32_gflops:.0f} GFLOP/s")
        if b.cpu_bf16_gflops is not None:
            parts.append(f"CPU bf16 {b.cpu_bf16_gflops:.0f} GFLOP/s")
        if b.cpu_fp32_training_gflops is not None:
            parts.append(f"torch fp32 training matmul {b.cpu_fp32_training_gflops:.0f} GFLOP/s")
        if b.cpu_first_touch_ns_per_page is not None:
            parts.append(f"fresh page {b.cpu_first_touch_ns_per_page / 1000:.1f} us")
        if b.cpu_dropout_ns_per_element is not None:
            parts.append(f"CPU dropout {b.cpu_dropout_ns_per_element:.1f} ns/element")
        for k, v in b.gpu_tflops.items():
            parts.append(f"GPU {k} {v:.0f} TFLOP/s")
        if b.gpu_bandwidth_gbps is not None:
            parts.append(f"GPU memory {b.gpu_bandwidth_gbps:.0f} GB/s")
        if b.disk_read_mbps is not None:
            parts.append(f"disk {b.disk_read_mbps:.0f}/{b.disk_write_mbps:.0f} MB/s read/write")
        when = f"measured {b.measured_at.replace('T', ' ')[:16]} UTC" if b.measured_at else "measured"
        flagged = b.load_check is not None and not b.load_check.reliable
        kept = "reused while the machine stays busy" if flagged else "kept in trainfit's cache"
        how = f"{when}, {kept}" if b.cached else f"{when} in {b.seconds:.1f} s"
        label = "CPU rates" if b.scope == "cpu" else "Benchmark"
        rows.append((label, ", ".join(parts) + f" ({how})" + _load_note(b)))
    return rows


def _load_note(b) -> str:
    """What ran beside the CPU measurement: quiet, or the reason its figures are not this machine's."""
    c = b.load_check
    if c is None:
        return "; load not checked (an older measurement)"
    tries = f", {c.attempts} tries" if c.attempts > 1 else ""
    if c.reliable:
        others = f"others used {c.other_cores:.2f} of {c.cores} cores" if c.other_cores is not None else "quiet"
        return f"; {others}{tries}, fp32 repeats within {c.fp32_spread or 0:.0%}"
    return (f"\n[yellow]MEASURED UNDER LOAD[/]{tries}: {c.reason}. Used for this command only, not kept as this "
            "machine's rates; run `trainfit profile --benchmark` when the machine is quiet")


def _gpu_share(p: HardwareProfile) -> str:
    """'; the GPU may use X GiB of it': the same figure estimate and plan use as the capacity."""
    from trainfit.core.memory.overheads import gpu_capacity

    cap = gpu_capacity(p) if p.gpus else None
    limit = "Metal working-set limit" if p.accelerator == "mps" else "GPU share of unified memory"
    return f"; the GPU may use {gib(cap)} of it ({limit})" if cap is not None else ""


def render_profile(p: HardwareProfile, console: Any, title: str = "Hardware profile") -> None:
    from rich.table import Table

    table = Table(title=f"{title} (sizes in binary units: GiB = 2^30 bytes)", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, text in profile_lines(p):
        table.add_row(label, text)
    console.print(table)
    if not p.probe_seconds:
        return
    total = sum(p.probe_seconds.values())
    slowest = max(p.probe_seconds.items(), key=lambda kv: kv[1], default=("", 0.0))
    console.print(f"[dim]probes: {len(p.probe_seconds)} in parallel, slowest {slowest[0]} {slowest[1]:.2f} s "
                  f"(sum {total:.2f} s)[/dim]")
