"""Terminal rendering of a Plan: one table per mode, its reasons and warnings (plan, analyze)."""

from __future__ import annotations

GIB = 1 << 30
_ICON = {"conservative": "🟢", "balanced": "🟡", "extreme": "🔴"}


def _hours(h: float | None) -> str:
    from trainfit.core.durations import hours_text

    if h is None:
        return "- (give --examples or --dataset-tokens)"
    return hours_text(h)


def speed_text(s, sp) -> str:
    """The speed row: per optimizer step for training, per batch for inference."""
    from trainfit.core.durations import duration_text

    per = (f"per batch of {s.micro_batch} x {s.seq_len} tokens" if s.method == "inference"
           else "per optimizer step")
    return (f"{duration_text(sp.step_seconds)} {per}, {sp.tokens_per_second:,.0f} tokens/s, "
            f"MFU {sp.mfu:.0%}, bottleneck {sp.bottleneck}")


def host_ram_text(mp, plan) -> str:
    """The host's RAM the setting holds (loading, CPU offload) against the machine planned for."""
    what = "offloaded states" if mp.setup.offload != "none" else "the model while it loads"
    return (f"{mp.host_ram_bytes / GIB:.2f} GiB ({what}) of the host's {plan.host_ram_usable_bytes / GIB:.1f} GiB "
            "usable")


def memory_text(mp) -> str:
    """The memory row: the need the fit verdict compares (as estimate's verdict line), and when it
    fits only because the caching allocator frees its cache near the limit, that too."""
    budget = mp.memory_budget_bytes or 0
    text = (f"{mp.memory_used_bytes / GIB:.2f} GiB per device = {mp.memory_used_bytes / budget:.0%} of this mode's "
            f"{budget / GIB:.2f} GiB ({mp.targets.memory_share:.0%} of usable)")
    if any(d.fits_under_pressure for d in mp.memory.devices):
        text += "; fits under memory pressure"
    return text


def setting_line(s) -> str:
    if s.method == "inference":
        return ", ".join([f"inference, {s.precision}" + (f", {s.quant} weights" if s.quant != "none" else ""),
                          f"batch {s.micro_batch}" + (f" x {s.num_gpus} GPUs" if s.num_gpus > 1 else ""),
                          f"context {s.seq_len}", f"attn {s.attention}"])
    parts = [s.method + (f"+{s.quant}" if s.quant != "none" and s.method != "qlora" else ""), s.precision,
             f"micro-batch {s.micro_batch} x accum {s.grad_accum}" + (f" x {s.num_gpus} GPUs" if s.num_gpus > 1 else ""),
             f"seq {s.seq_len}", f"{s.optimizer}", f"attn {s.attention}"]
    if s.grad_checkpointing != "none":
        parts.append("grad checkpointing")
    if s.zero_stage:
        parts.append(f"ZeRO-{s.zero_stage}" + (f" hybrid ({s.gpus_per_node} GPUs per shard group)"
                                               if s.hybrid_shard else ""))
    if s.offload != "none":
        parts.append(f"offload {s.offload}")
    if s.lora is not None:
        parts.append(f"LoRA r{s.lora.rank}")
    return ", ".join(parts)


def data_rows(dp) -> list[tuple[str, str]]:
    """The data I/O plan in a few table rows (core.plan.data_io.DataPlan)."""
    how = "stream" if dp.streaming else "download first" if dp.download_first else "read in place"
    cache = "RAM (keep_in_memory)" if dp.keep_in_memory else dp.cache_on + (f" {dp.cache_dir}" if dp.cache_dir else "")
    feed = f"{dp.num_workers} workers" + (f" x prefetch {dp.prefetch_factor}" if dp.prefetch_factor else "")
    parts = [how, f"cache {cache}", feed]
    if dp.packing is not None:
        parts.append(f"packing {'on' if dp.packing else 'off'}" +
                     (f" (padding {dp.padding_waste:.0%} without)" if dp.padding_waste is not None else ""))
    rows = [("data", ", ".join(parts)), ("input", dp.reasons.get("bottleneck", ""))]
    if dp.source == "hub":
        rows.insert(1, ("source", dp.reasons.get("source", "")))
    if "budget" in dp.reasons:
        rows.append(("tokens", dp.reasons["budget"]))
    return rows


def render_plan(plan, out, *, files: dict[str, list[str]] | None = None) -> None:
    from rich import box
    from rich.table import Table

    for mp in plan.modes:
        title = f"{_ICON.get(mp.mode, '')} {mp.mode.upper()}  {mp.model_id}"
        if mp.pretrain:
            title += f" ({mp.pretrain['params'] / 1e6:.0f}M parameters, {mp.pretrain['tokens'] / 1e6:,.0f}M tokens)"
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
        table.add_column("what", style="bold", no_wrap=True)
        table.add_column("value")
        if not mp.fits:
            table.add_row("setting", "[red]nothing fits this mode's memory budget[/]")
        else:
            s, sp, pw, run = mp.setup, mp.speed, mp.power, mp.run
            table.add_row("setting", setting_line(s))
            table.add_row("memory", memory_text(mp))
            table.add_row("speed", speed_text(s, sp))
            if mp.host_ram_bytes is not None and plan.host_ram_usable_bytes and s.device not in ("cpu", "mps"):
                table.add_row("host RAM", host_ram_text(mp, plan))  # where the memory row is not that RAM
            if s.method != "inference":  # a serving plan has a batch time, no run
                table.add_row("run time", _hours(run.hours) + (f" ({run.steps:,} steps)" if run.steps else ""))
            draw = f"{pw.total_watts:.0f} W"
            if pw.gpu_count and pw.gpu_limit_watts_each:
                draw += f" ({pw.gpu_count} x {pw.gpu_watts_each:.0f} W GPU = {pw.gpu_watts_each / pw.gpu_limit_watts_each:.0%} of TDP)"
            table.add_row("power", draw)
            if run.energy_kwh is not None:
                cost = f"{run.energy_kwh:.2f} kWh, electricity {run.electricity_cost:.2f}"
                if run.rental_usd is not None:
                    cost += f"; rental ${run.rental_usd:.2f}"
                if getattr(run, "rental_expected_usd", None) is not None:  # plan --flavor ID --spot
                    cost += f", expected incl. re-done work ${run.rental_expected_usd:.2f}"
                table.add_row("energy / cost", cost)
            if mp.data_io is not None:
                for what, text in data_rows(mp.data_io):
                    table.add_row(what, text)
        out.print(table)
        for r in mp.reasons:
            out.print(f"   [dim]because[/] {r}")
        for w in mp.warnings:
            out.print(f"   [yellow]⚠[/] {w}")
        for f in (files or {}).get(mp.mode, []):
            out.print(f"   wrote {f}")
        out.print("")
    for note in plan.notes:
        out.print(f"note: {note}")
