"""The plots of `trainfit report`, rendered to PNG with matplotlib's Agg renderer (no display, no
pyplot: each plot is its own Figure, so nothing global is changed).

Five plots, each left out with its reason when its data is absent (never an empty chart):
  memory      memory over time against the predicted peak (horizontal lines)
  loss        loss by step, learning rate on a second axis
  throughput  tokens per second by step, with the median
  thermal     CPU and GPU temperatures and power over time; throttling and pauses shaded
  events      the run's events on a timeline, one row per kind
Memory is shown in GiB (2^30 bytes).
"""

from __future__ import annotations

import io
import math
import struct
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from trainfit.errors import require_extra
from trainfit.report.run_data import RunData
from trainfit.report.summary import finite, gpu_series, is_throttled, pause_spans

GIB = 2**30
PLOT_NAMES = ("memory", "loss", "throughput", "thermal", "events")
TITLES = {
    "memory": "Memory over time",
    "loss": "Loss and learning rate",
    "throughput": "Throughput",
    "thermal": "Temperature and power",
    "events": "Events",
}
_DPI = 100
_SHADES = {"gpu": ("tab:orange", 0.18, "GPU throttled"), "cpu": ("gold", 0.30, "CPU thermal throttling"),
           "battery": ("tab:cyan", 0.15, "on battery"), "pause": ("grey", 0.28, "training paused")}


@dataclass(frozen=True)
class Plot:
    name: str  # file stem, one of PLOT_NAMES
    title: str
    png: bytes
    alt: str  # what the plot shows, in words (the <img> alt text)
    width: int  # pixels
    height: int


class _Clock:
    """Seconds since the run's first record, in a unit that suits the run's length."""

    def __init__(self, t0: float | None, span: float | None):
        self.t0 = t0 or 0.0
        span = span or 0.0
        self.div, self.unit = (1.0, "s") if span < 180 else (60.0, "min") if span < 3 * 3600 else (3600.0, "h")

    def __call__(self, t: float) -> float:
        return (t - self.t0) / self.div

    @property
    def label(self) -> str:
        return f"time since the run's first record ({self.unit})"


def render_plots(run: RunData, summary: dict[str, Any]) -> tuple[list[Plot], dict[str, str]]:
    """The plots that have data, and name -> reason for those left out."""
    require_extra("matplotlib", "report")
    clock = _Clock(summary["started_at"], summary["elapsed_seconds"])
    makers: dict[str, Callable] = {"memory": _memory, "loss": _loss, "throughput": _throughput,
                                   "thermal": _thermal, "events": _events}
    plots, left_out = [], {}
    with warnings.catch_warnings():  # layout and glyph warnings are matplotlib's, nothing a user can act on
        warnings.filterwarnings("ignore", module=r"matplotlib(\.|$)")
        for name in PLOT_NAMES:
            made = makers[name](run, summary, clock)
            if isinstance(made, str):
                left_out[name] = made
                continue
            fig, alt = made
            png, width, height = _png(fig)
            plots.append(Plot(name, TITLES[name], png, alt, width, height))
    return plots, left_out


def _figure(height: float = 4.0):
    from matplotlib.figure import Figure

    return Figure(figsize=(10, height), dpi=_DPI, layout="constrained")


def _png(fig) -> tuple[bytes, int, int]:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    data = buf.getvalue()
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    return data, width, height


def _style(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def _line(ax, xs, ys, label: str, **kw) -> None:
    kw.setdefault("marker", "o" if len(xs) <= 60 else None)
    kw.setdefault("markersize", 3)
    ax.plot(xs, [math.nan if y is None else y for y in ys], label=label, linewidth=1.4, **kw)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def fmt_bytes(n: float | None) -> str | None:
    """Bytes for reading: GiB (2^30) from 0.1 GiB up, MiB (2^20) below; None stays None."""
    if n is None:
        return None
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def _gib(n: float | None) -> str:
    return fmt_bytes(n) or "unavailable"


# --------------------------------------------------------------------------------------------
def _outside_legend(ax) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=8)


def _memory(run: RunData, summary, clock: _Clock):
    # label, times, bytes, color, linestyle: one color per device, one line style per kind
    series: list[tuple[str, list[float], list[float | None], str, str]] = []
    st = run.steps
    for key, label, style in (("peak_rss_bytes", "process peak RSS (logged steps)", "-"),
                              ("cuda_max_allocated_bytes", "torch peak allocated (logged steps)", "--"),
                              ("cuda_max_reserved_bytes", "torch peak reserved (logged steps)", ":")):
        pts = [(t, v) for t, v in zip(st["time"], st[key]) if t is not None and v is not None]
        if finite(v for _, v in pts):
            series.append((label, [t for t, _ in pts], [v for _, v in pts], "C0", style))
    host = [(smp.time, smp.host.process_rss_bytes) for smp in run.samples if smp.host.process_rss_bytes is not None]
    if finite(v for _, v in host):
        series.append(("process RSS (samples)", [t for t, _ in host], [v for _, v in host], "C9", "-"))
    totals = {}
    for n, (idx, pts) in enumerate(sorted(gpu_series(run).items())):
        color = f"C{1 + n % 8}"
        for attr, label, style in (("memory_used_bytes", f"GPU {idx} used (driver)", "-"),
                                   ("allocated_bytes", f"GPU {idx} torch allocated", "--"),
                                   ("reserved_bytes", f"GPU {idx} torch reserved", ":")):
            vals = [(t, getattr(g, attr)) for t, g in pts if getattr(g, attr) is not None]
            if finite(v for _, v in vals):
                series.append((label, [t for t, _ in vals], [v for _, v in vals], color, style))
        total = finite(g.memory_total_bytes for _, g in pts)
        if total:
            totals[idx] = max(total)
    if not series:
        return ("no memory figures in metrics.jsonl: the logged steps carry no peak_rss_bytes or cuda_* keys and "
                "no machine sample carries process or GPU memory")
    fig = _figure()
    ax = fig.add_subplot()
    for label, ts, vs, color, style in series:
        _line(ax, [clock(t) for t in ts], [v / GIB for v in vs], label, color=color, linestyle=style)
    mem = summary["memory"]
    predicted = []
    if mem["predicted_total_bytes"]:
        ax.axhline(mem["predicted_total_bytes"] / GIB, color="tab:red", linestyle="--", linewidth=1.6,
                   label=f"predicted peak, total ({_gib(mem['predicted_total_bytes'])})")
        predicted.append(f"predicted peak {_gib(mem['predicted_total_bytes'])} (total)")
    if mem["predicted_tensor_peak_bytes"]:
        ax.axhline(mem["predicted_tensor_peak_bytes"] / GIB, color="tab:purple", linestyle=":", linewidth=1.6,
                   label=f"predicted tensor peak ({_gib(mem['predicted_tensor_peak_bytes'])})")
        predicted.append(f"predicted tensor peak {_gib(mem['predicted_tensor_peak_bytes'])}")
    highest = max(max(finite(vs)) for _, _, vs, _, _ in series)
    for total in sorted(set(totals.values())):
        if highest >= 0.4 * total:  # a capacity far above every line would flatten them all
            which = ", ".join(str(i) for i, t in totals.items() if t == total)
            ax.axhline(total / GIB, color="grey", linestyle="-.", linewidth=1,
                       label=f"GPU {which} capacity ({_gib(total)})")
    ax.set_ylim(bottom=0)
    _style(ax, "Memory over time", clock.label, "GiB (2^30 bytes)")
    _outside_legend(ax)
    highs = sorted(((max(finite(vs)), label) for label, _, vs, _, _ in series), reverse=True)
    alt = ("Memory over time, in GiB. Highest: " + "; ".join(f"{label} {_gib(v)}" for v, label in highs[:4]) + ". "
           + (_sentence("; ".join(predicted)) if predicted else
              "No predicted peak (" + summary["unavailable"].get("memory.predicted_total_bytes", "unavailable") + ")."))
    return fig, alt


def _loss(run: RunData, summary, clock: _Clock):
    st = run.steps
    pts = [(s, v) for s, v in zip(st["step"], st["loss"]) if v is not None]
    if not finite(v for _, v in pts):
        return "no logged step with a finite loss in metrics.jsonl"
    fig = _figure()
    ax = fig.add_subplot()
    _line(ax, [s for s, _ in pts], [v if math.isfinite(v) else None for _, v in pts], "loss", color="tab:blue")
    _style(ax, "Loss and learning rate", "optimizer step", "loss")
    handles, labels = ax.get_legend_handles_labels()
    lr = [(s, v) for s, v in zip(st["step"], st["learning_rate"]) if v is not None]
    if finite(v for _, v in lr):
        ax2 = ax.twinx()
        _line(ax2, [s for s, _ in lr], [v if math.isfinite(v) else None for _, v in lr], "learning rate",
              color="tab:green", linestyle="--", marker=None)
        ax2.set_ylabel("learning rate")
        ax2.set_ylim(bottom=0)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper right", fontsize=8)
    loss = summary["loss"]
    alt = (f"Training loss by optimizer step: {loss['first']:.4g} at step {pts[0][0]}, {loss['last']:.4g} at the "
           f"last logged step {pts[-1][0]}, lowest {loss['min']:.4g} at step {loss['min_step']}.")
    if summary["learning_rate_max"] is not None:
        alt += f" Learning rate on the right axis, at most {summary['learning_rate_max']:.3g}."
    if loss["non_finite_steps"]:
        alt += f" {loss['non_finite_steps']} step(s) with a non-finite loss are gaps."
    return fig, alt


def _throughput(run: RunData, summary, clock: _Clock):
    st = run.steps
    pts = [(s, v) for s, v in zip(st["step"], st["tokens_per_second"]) if v is not None and math.isfinite(v)]
    if not pts:
        return "no logged step with tokens_per_second in metrics.jsonl"
    fig = _figure()
    ax = fig.add_subplot()
    _line(ax, [s for s, _ in pts], [v for _, v in pts], "tokens/s", color="tab:blue")
    median = summary["throughput"]["tokens_per_second_median"]
    ax.axhline(median, color="tab:grey", linestyle="--", linewidth=1.2, label=f"median {median:,.0f} tokens/s")
    ax.set_ylim(bottom=0)
    _style(ax, "Throughput", "optimizer step", "tokens per second")
    ax.legend(loc="lower right", fontsize=8)
    vals = [v for _, v in pts]
    alt = (f"Tokens per second by optimizer step: median {median:,.0f}, from {min(vals):,.0f} to {max(vals):,.0f} "
           f"over {len(pts)} logged steps.")
    return fig, alt


def _thermal(run: RunData, summary, clock: _Clock):
    if not run.samples:
        return ("no machine samples in metrics.jsonl (written by the training monitor), so no temperature or power "
                "was recorded")
    samples = sorted(run.samples, key=lambda s: s.time)
    temps, power = [], []  # (label, [(time, value)], color)
    limits: dict[float, list[str]] = {}  # watts -> GPU indexes
    slowdown: dict[float, list[str]] = {}  # °C -> GPU indexes
    cpu_t = [(s.time, s.host.cpu_temperature_c) for s in samples if s.host.cpu_temperature_c is not None]
    if finite(v for _, v in cpu_t):
        temps.append(("CPU", cpu_t, "C0"))
    cpu_w = [(s.time, s.host.cpu_package_watts) for s in samples if s.host.cpu_package_watts is not None]
    if finite(v for _, v in cpu_w):
        power.append(("CPU package", cpu_w, "C0"))
    gpus = gpu_series(run)
    for n, (idx, pts) in enumerate(sorted(gpus.items())):
        color = f"C{1 + n % 8}"  # as in the memory plot
        t = [(tm, g.temperature_c) for tm, g in pts if g.temperature_c is not None]
        if finite(v for _, v in t):
            temps.append((f"GPU {idx}", t, color))
        w = [(tm, g.power_watts) for tm, g in pts if g.power_watts is not None]
        if finite(v for _, v in w):
            power.append((f"GPU {idx}", w, color))
        lim = finite(g.power_limit_watts for _, g in pts)
        if lim and w:
            limits.setdefault(max(lim), []).append(str(idx))
        slow = finite(g.slowdown_temperature_c for _, g in pts)
        if slow and t:
            slowdown.setdefault(min(slow), []).append(str(idx))
    if not temps and not power:
        why = [f"{k}: {v}" for k, v in run.unavailable.items()
               if k.endswith(("temperature_c", "watts"))][:3]
        return ("the machine samples carry no temperature or power reading"
                + (f" ({'; '.join(why)})" if why else ""))
    panels = [p for p in (("temperature", temps), ("power", power)) if p[1]]
    fig = _figure(3.2 * len(panels) + 0.6)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    shades = _shade_spans(run, samples)
    for ax, (kind, series) in zip(axes, panels):
        for label, pts, color in series:
            _line(ax, [clock(t) for t, _ in pts], [v for _, v in pts], label, color=color)
        if kind == "temperature":
            for c, idx in slowdown.items():
                ax.axhline(c, color="tab:red", linestyle=":", linewidth=1,
                           label=f"GPU {', '.join(idx)} slowdown ({c:.0f} °C)")
            _style(ax, "Temperature", "", "°C")
        else:
            for w, idx in limits.items():
                ax.axhline(w, color="tab:red", linestyle=":", linewidth=1,
                           label=f"GPU {', '.join(idx)} power limit ({w:.0f} W)")
            _style(ax, "Power", "", "watts")
        for key, spans in shades.items():
            color, alpha, label = _SHADES[key]
            _shade(ax, [(clock(a), clock(b)) for a, b in spans], color, alpha, label)
        _outside_legend(ax)
    axes[-1].set_xlabel(clock.label)
    th = summary["thermal"]
    parts = []
    if th["cpu_temperature_max_c"] is not None or th["cpu_package_watts_max"] is not None:
        parts.append("CPU up to " + ", ".join(x for x in (
            _deg(th["cpu_temperature_max_c"]), _watts(th["cpu_package_watts_max"])) if x))
    for g in th["gpus"]:
        if g["temperature_max_c"] is not None or g["power_max_watts"] is not None:
            parts.append(f"GPU {g['index']} up to " + ", ".join(x for x in (
                _deg(g["temperature_max_c"]), _watts(g["power_max_watts"])) if x))
    shaded = [f"{len(spans)} {_SHADES[k][2]} period(s)" for k, spans in shades.items() if spans]
    alt = ("Temperature and power over time. " + "; ".join(parts) + "."
           + (" Shaded: " + ", ".join(shaded) + "." if shaded else " No throttling or pause recorded."))
    return fig, alt


def _deg(v):
    return None if v is None else f"{v:.0f} °C"


def _watts(v):
    return None if v is None else f"{v:.0f} W"


def _shade_spans(run: RunData, samples) -> dict[str, list[tuple[float, float]]]:
    """Periods to shade: a GPU reporting a throttle reason, the CPU's thermal-throttle count rising,
    the machine on battery, a safety pause."""
    times = [s.time for s in samples]
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    step = sorted(gaps)[len(gaps) // 2] if gaps else 1.0
    gpu, cpu, battery = [], [], []
    for i, s in enumerate(samples):
        end = times[i + 1] if i + 1 < len(times) else s.time + step
        if any(is_throttled(g.throttle_reasons) for g in s.gpus):
            gpu.append((s.time, end))
        if s.host.on_ac is False:
            battery.append((s.time, end))
        prev = samples[i - 1].host.cpu_throttle_events if i else None
        now = s.host.cpu_throttle_events
        if prev is not None and now is not None and now > prev:
            cpu.append((times[i - 1], s.time))
    return {"gpu": _merge(gpu), "cpu": _merge(cpu), "battery": _merge(battery),
            "pause": [(a, b) for a, b, _ in pause_spans(run)]}


def _shade(ax, spans: list[tuple[float, float]], color: str, alpha: float, label: str) -> None:
    """Full-height bands over the x ranges `spans`, as one artist (a long run can have thousands)."""
    if not spans:
        return
    from matplotlib.collections import PolyCollection

    bands = PolyCollection([[(a, 0), (a, 1), (b, 1), (b, 0)] for a, b in spans], transform=ax.get_xaxis_transform(),
                           facecolor=color, alpha=alpha, linewidth=0, label=label)
    ax.add_collection(bands, autolim=False)


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _events(run: RunData, summary, clock: _Clock):
    if not run.events:
        return "no events in metrics.jsonl (no resume, checkpoint, recovery, pause or signal was recorded)"
    timed = [e for e in run.events if e.time is not None]
    if not timed:
        return f"the {len(run.events)} event(s) in metrics.jsonl carry no time, so they cannot be placed on a timeline"
    kinds = list(dict.fromkeys(e.kind for e in sorted(timed, key=lambda e: e.time)))
    fig = _figure(1.4 + 0.45 * min(len(kinds), 16))
    ax = fig.add_subplot()
    _shade(ax, [(clock(a), clock(b)) for a, b, _ in pause_spans(run)], "grey", 0.2, "training paused")
    colors = {"resume": "tab:blue", "restart": "tab:blue", "checkpoint": "tab:green", "oom_recovered": "tab:red",
              "memory_leak": "tab:red", "device_lost": "tab:red", "nonfinite_loss": "tab:red",
              "nonfinite_gradient": "tab:red",
              "thermal_stop": "tab:red", "battery_stop": "tab:red", "signal": "black"}
    for row, kind in enumerate(kinds):
        xs = [clock(e.time) for e in timed if e.kind == kind]
        color = colors.get(kind, "tab:orange" if ("pause" in kind or "thermal" in kind or "power" in kind)
                           else "tab:purple")
        ax.plot(xs, [row] * len(xs), linestyle="none", marker="D", markersize=7, color=color)
    # Kinds come from the file: shortened, and "$" escaped (matplotlib would read it as math).
    ax.set_yticks(range(len(kinds)), [(k if len(k) <= 32 else k[:31] + "…").replace("$", r"\$") for k in kinds])
    ax.set_ylim(-0.7, len(kinds) - 0.3)
    end = summary["elapsed_seconds"] or 0.0
    ax.set_xlim(-0.02 * end / clock.div - 0.01, end / clock.div * 1.02 + 0.01)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(f"Events ({len(timed)})", loc="left", fontsize=11)
    if pause_spans(run):
        _outside_legend(ax)
    ax.set_xlabel(clock.label)
    counts = summary["events"]
    alt = (f"{len(timed)} events on a timeline of the run: "
           + ", ".join(f"{k} ×{counts.get(k, 0)}" for k in kinds) + ".")
    if len(timed) < len(run.events):
        alt += f" {len(run.events) - len(timed)} event(s) without a time are only in the table."
    return fig, alt

