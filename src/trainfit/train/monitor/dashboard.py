"""The live terminal dashboard: a rich `Live` panel on stderr, redrawn twice a second from a Monitor.

    memory    ▂▃▃▄▅▅▆▆▇▇  1.21 GiB now, 1.30 GiB max (torch allocated) · predicted peak 1.50 GiB
              ████████████████████████░░░░┃░░░  81 % of predicted
    speed     12,345 tokens/s · 48.2 samples/s · 0.166 s/step
    progress  step 120 / 1,000 · loss 2.3456 (step 120) · ETA 2 min 26 s · elapsed 20 s
    GPU 0     71 °C (slows at 87 °C) · 250 / 450 W · 98 % busy · 1,980 MHz · throttle: sw_power_cap
    CPU       65 °C · 45 W · 34 % busy · RAM 12.1 / 64.0 GiB · AC power
    events    12:02:01 memory_leak: process memory (RSS) read at step ends rises 4 MiB per step ...

It reads the Monitor's history (no second sampler) and is only shown on a terminal (the
monitoring.dashboard setting: auto / on / off). Sizes are binary units (GiB = 2^30 bytes).
"""

from __future__ import annotations

import time
from typing import Any

from trainfit.hardware.sample_types import Sample
from trainfit.train.monitor.live import Monitor
from trainfit.train.monitor.units import duration_text, size_text

SPARK = "▁▂▃▄▅▆▇█"
# Clock-event reasons that hold the GPU back for heat or power (the others are informational).
HOT_REASONS = {"hw_thermal", "sw_thermal", "hw_slowdown", "hw_power_brake", "sw_power_cap"}


def training_memory(sample: Sample) -> tuple[int | None, str]:
    """The memory the training uses, as the memory model predicts it: torch's CUDA allocator
    (the largest GPU of this process) when torch uses CUDA, else the process RSS."""
    allocated = [g.allocated_bytes for g in sample.gpus if g.allocated_bytes is not None]
    if allocated:
        return max(allocated), "torch allocated"
    return sample.host.process_rss_bytes, "process RSS"


def sparkline(values: list[float], top: float) -> str:
    if top <= 0:
        return ""
    out = []
    for v in values:
        level = min(max(v / top, 0.0), 1.0)
        out.append(SPARK[min(int(level * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)])
    return "".join(out)


class Dashboard:
    """A rich Live display of `monitor` (start() / stop(); render() builds one frame).

    console: a rich Console on stderr by default; pass the progress bar's console so that rich
    draws both live displays as one. The frame is rebuilt at most `refresh_per_second` times a
    second however often rich asks for it.
    """

    def __init__(self, monitor: Monitor, *, console: Any = None, refresh_per_second: float = 2.0,
                 title: str = "trainfit monitor", points: int = 48, events: int = 3) -> None:
        self.monitor = monitor
        self.console = console
        self.refresh_per_second = refresh_per_second
        self.title = title
        self.points = points
        self.n_events = events
        self._live: Any = None
        self._cached: Any = None
        self._cached_at = 0.0

    # -- lifetime -----------------------------------------------------------------------------
    def start(self) -> "Dashboard":
        from rich.live import Live

        if self.console is None:
            from trainfit.terminal import console

            self.console = console(stderr=True)
        # stdout is not redirected: `--json` output on a pipe must stay on stdout.
        self._live = Live(get_renderable=self._frame, console=self.console,
                          refresh_per_second=self.refresh_per_second, transient=False, redirect_stdout=False,
                          redirect_stderr=True)
        self._live.start(refresh=True)
        return self

    def stop(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            self._cached = None  # the last frame shows the final state
            live.stop()

    def _frame(self) -> Any:
        """The frame rich draws: rebuilt and laid out at most refresh_per_second times a second
        (under a progress bar rich asks ten times a second), as ready-made segments."""
        now = time.monotonic()
        if self._cached is None or now - self._cached_at >= 1.0 / self.refresh_per_second:
            from rich.segment import Segment, Segments

            frame = self.render()
            try:
                lines = self.console.render_lines(frame, self.console.options, pad=False)
            except Exception:
                self._cached = frame
            else:
                segments: list[Any] = []
                for i, line in enumerate(lines):
                    if i:
                        segments.append(Segment.line())
                    segments.extend(line)
                self._cached = Segments(segments)
            self._cached_at = now
        return self._cached

    # -- one frame ----------------------------------------------------------------------------
    def render(self) -> Any:
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        try:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold", no_wrap=True)
            grid.add_column()
            for label, value in self._rows():
                grid.add_row(label, value)
        except Exception as exc:  # a display bug must not take the training down
            return Text(f"dashboard error: {type(exc).__name__}: {exc}")
        return Panel(grid, title=self.title, title_align="left", border_style="dim", expand=False)

    def _rows(self) -> list[tuple[str, Any]]:
        from rich.text import Text

        mon = self.monitor
        samples = mon.samples()[-self.points:]
        latest = samples[-1] if samples else None
        st = mon.status()
        rows: list[tuple[str, Any]] = list(self._memory_rows(samples))
        rows.append(("speed", Text(" · ".join(filter(None, [
            f"{st['tokens_per_second']:,.0f} tokens/s" if st.get("tokens_per_second") else "tokens/s -",
            f"{st['samples_per_second']:,.1f} samples/s" if st.get("samples_per_second") else None,
            f"{st['seconds_per_step']:.3g} s/step" if st.get("seconds_per_step") else None,
        ])))))
        total = st.get("total_steps")
        progress = [f"step {st['step']:,}" + (f" / {total:,}" if total else "")]
        if st.get("loss") is not None:
            progress.append(f"loss {st['loss']:.4f}" + (f" (step {st['loss_step']})" if st.get("loss_step") else ""))
        eta = st.get("eta_seconds")
        progress.append(f"ETA {duration_text(eta)}" if eta is not None else "ETA -")
        if st.get("elapsed_seconds") is not None:
            progress.append(f"elapsed {duration_text(st['elapsed_seconds'])}")
        rows.append(("progress", Text(" · ".join(progress))))
        if latest is not None:
            for g in latest.gpus:
                rows.append((f"GPU {g.index}", self._gpu_text(g)))
            rows.append(("CPU", self._host_text(latest)))
        else:
            rows.append(("machine", Text("waiting for the first sample", style="dim")))
        events = [e for e in mon.events()][-self.n_events:]
        if events:
            text = Text()
            for i, e in enumerate(events):
                if i:
                    text.append("\n")
                style = "yellow" if e.get("event") in ("memory_leak", "monitor_subscriber_error", "monitor_error") \
                    else ""
                stamp = time.strftime("%H:%M:%S", time.localtime(e.get("time", 0)))
                text.append(f"{stamp} {e.get('event')}: ", style="bold " + style if style else "bold")
                reason = str(e.get("reason", ""))
                text.append(reason if len(reason) <= 160 else reason[:157] + "...", style=style)
            rows.append(("events", text))
        return rows

    def _memory_rows(self, samples: list[Sample]) -> list[tuple[str, Any]]:
        from rich.text import Text

        readings = [(v, kind) for v, kind in (training_memory(s) for s in samples) if v is not None]
        predicted = self.monitor.predicted_peak_bytes
        if not readings:
            why = "no memory reading yet" if not samples else "memory not readable"
            return [("memory", Text(why + (f" · predicted peak {size_text(predicted)}" if predicted else ""),
                                    style="dim"))]
        values = [v for v, _ in readings]
        now, kind = readings[-1]
        high = max(values)
        top = max(high, predicted or 0) or 1
        over = predicted is not None and high > predicted
        line = Text()
        line.append(sparkline(values, top), style="red" if over else "cyan")
        line.append(f"  {size_text(now)} now, {size_text(high)} max ({kind})")
        if predicted:
            line.append(f" · predicted peak {size_text(predicted)}", style="bold")
        rows: list[tuple[str, Any]] = [("memory", line)]
        if predicted:
            width = 40
            filled = min(int(round(now / top * width)), width)
            mark = min(int(round(predicted / top * width)), width - 1)
            bar = Text()
            for i in range(width):
                if i == mark:
                    bar.append("┃", style="bold magenta")
                elif i < filled:
                    bar.append("█", style="red" if i > mark else "green")
                else:
                    bar.append("░", style="dim")
            share = now / predicted
            bar.append(f"  {share * 100:.0f} % of predicted", style="red bold" if share > 1 else "")
            rows.append(("", bar))
        return rows

    @staticmethod
    def _gpu_text(g: Any) -> Any:
        from rich.text import Text

        t = Text()
        parts: list[tuple[str, str]] = []
        if g.temperature_c is not None:
            hot = g.slowdown_temperature_c is not None and g.temperature_c >= g.slowdown_temperature_c - 5
            parts.append((f"{g.temperature_c:.0f} °C" + (f" (slows at {g.slowdown_temperature_c:.0f} °C)"
                                                          if g.slowdown_temperature_c is not None else ""),
                          "red bold" if hot else ""))
        if g.power_watts is not None:
            parts.append((f"{g.power_watts:.0f}" + (f" / {g.power_limit_watts:.0f}" if g.power_limit_watts else "")
                          + " W", ""))
        if g.utilization_percent is not None:
            parts.append((f"{g.utilization_percent:.0f} % busy", ""))
        if g.sm_clock_mhz is not None:
            parts.append((f"{g.sm_clock_mhz:,.0f} MHz", ""))
        if g.memory_used_bytes is not None and g.memory_total_bytes:
            parts.append((f"{size_text(g.memory_used_bytes)} / {size_text(g.memory_total_bytes)} used", ""))
        hot = [r for r in g.throttle_reasons if r in HOT_REASONS]
        if hot:
            parts.append(("throttle: " + ", ".join(hot), "red bold"))
        elif g.throttle_reasons:
            parts.append(("clock events: " + ", ".join(g.throttle_reasons), "dim"))
        for i, (text, style) in enumerate(parts):
            if i:
                t.append(" · ")
            t.append(text, style=style)
        return t if parts else Text("no reading", style="dim")

    @staticmethod
    def _host_text(s: Sample) -> Any:
        from rich.text import Text

        h = s.host
        t = Text()
        parts: list[tuple[str, str]] = []
        if h.cpu_temperature_c is not None:
            parts.append((f"{h.cpu_temperature_c:.0f} °C", "red bold" if h.cpu_temperature_c >= 90 else ""))
        if h.cpu_package_watts is not None:
            parts.append((f"{h.cpu_package_watts:.0f} W", ""))
        if h.cpu_percent is not None:
            parts.append((f"{h.cpu_percent:.0f} % busy", ""))
        if h.ram_used_bytes is not None and h.ram_total_bytes:
            share = h.ram_used_bytes / h.ram_total_bytes
            parts.append((f"RAM {size_text(h.ram_used_bytes)} / {size_text(h.ram_total_bytes)}",
                          "red bold" if share > 0.9 else ""))
        if h.swap_used_bytes:
            parts.append((f"swap {size_text(h.swap_used_bytes)}", "yellow"))
        if h.cpu_throttle_events:
            parts.append((f"{h.cpu_throttle_events:,} throttle events since boot", "dim"))
        if h.on_ac is False:
            battery = f"ON BATTERY {h.battery_percent:.0f} %" if h.battery_percent is not None else "ON BATTERY"
            if h.battery_seconds_left is not None:
                battery += f" ({duration_text(h.battery_seconds_left)} left)"
            parts.append((battery, "red bold" if (h.battery_percent or 100) < 20 else "yellow"))
        elif h.battery_percent is not None:
            parts.append((f"AC power, battery {h.battery_percent:.0f} %", ""))
        for i, (text, style) in enumerate(parts):
            if i:
                t.append(" · ")
            t.append(text, style=style)
        return t if parts else Text("no reading", style="dim")
