"""report.html: one self-contained page (the plots inlined as base64 PNG, the styles inline, no
script, no external resource), so it can be mailed, archived or opened offline. Also the summary
as (label, value) rows, which the CLI prints too."""

from __future__ import annotations

import base64
import html
import json
import time
from typing import Any

from trainfit.report.plots import TITLES, Plot, fmt_bytes
from trainfit.report.run_data import RunData

MAX_EVENT_ROWS = 5000  # a week-long run can checkpoint thousands of times; the page stays light

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto;
       max-width: 1060px; padding: 0 1em; color: #1d1d1f; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
td.time { white-space: nowrap; }
.meta { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { text-align: left; padding: 0.25em 0.8em 0.25em 0; vertical-align: top; border-bottom: 1px solid #eee; }
th { font-weight: 600; }
figure { margin: 1.2em 0; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #e4e4e4; }
figcaption { font-size: 0.88em; color: #444; margin-top: 0.3em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.note { color: #7a4b00; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


_gib = fmt_bytes


def _duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d} (h:mm:ss)"


def _clock(t: float | None) -> str:
    return "—" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _join(*parts: str | None, sep: str = ", ") -> str | None:
    kept = [p for p in parts if p]
    return sep.join(kept) if kept else None


def _f(value: Any, pattern: str) -> str | None:
    """pattern.format(value), or None when the value is None."""
    return None if value is None else pattern.format(value)


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary as (label, value) rows; a figure that is unavailable says so (GiB = 2^30 bytes)."""
    rows: list[tuple[str, str | None]] = []
    na = summary["unavailable"]
    run = _join(summary["method"], summary["model"], _f(summary["device"], "on {}"), sep=" ")
    rows.append(("run", run or "unavailable (summary.json absent)"))
    rows.append(("finished", "yes (summary.json written)" if summary["finished"] else
                 "no: summary.json absent (stopped early, crashed, or still running)"))
    st = summary["steps"]
    steps = f"{st['logged']} logged" + (f" (steps {st['first']} to {st['last']})" if st["logged"] else "")
    if st["global_step"] is not None:
        steps += f"; step {st['global_step']:.0f}" + (f" of {st['max_steps']:.0f}" if st["max_steps"] else "")
    rows.append(("steps", steps))
    plan = summary["planned"]
    if plan["max_steps"]:
        rows.append(("planned length", f"{plan['max_steps']:.0f} steps"
                     + (f", {_duration(plan['seconds'])} predicted" if plan["seconds"] else "")
                     + f" ({plan['source']})"))
    rows.append(("duration", _join(_duration(summary["elapsed_seconds"]),
                                   _f(summary["started_at"] and _clock(summary["started_at"]), "from {}"), sep=" ")))
    loss = summary["loss"]
    if loss["first"] is not None:
        rows.append(("loss", f"{loss['first']:.4f} first, {loss['last']:.4f} last, {loss['min']:.4f} lowest "
                             f"(step {loss['min_step']})"
                     + (f"; {loss['non_finite_steps']} non-finite" if loss["non_finite_steps"] else "")))
    else:
        rows.append(("loss", f"unavailable ({na.get('loss', 'not logged')})"))
    rows.append(("learning rate (max)", _f(summary["learning_rate_max"], "{:.3g}")))
    tp = summary["throughput"]
    rows.append(("tokens/s", _join(_f(tp["tokens_per_second_median"], "{:,.0f} median"),
                                   _f(tp["tokens_per_second_max"], "{:,.0f} max"))))
    rows.append(("step time (median)", _f(tp["step_seconds_median"], "{:.4g} s")))
    mem = summary["memory"]
    rows.append(("peak memory, measured", _join(_gib(mem["measured_peak_bytes"]),
                                                 _f(mem["measured_peak_kind"], "({})"), sep=" ")))
    predicted = _join(_f(_gib(mem["predicted_total_bytes"]), "{} total"),
                      _f(_gib(mem["predicted_tensor_peak_bytes"]), "{} tensors"))
    rows.append(("peak memory, predicted",
                 predicted or f"unavailable ({na.get('memory.predicted_total_bytes', 'no prediction')})"))
    rows.append(("measured / predicted", _f(mem["measured_over_predicted_total"], "{:.2f}x")))
    if mem["process_rss_max_bytes"] is not None:
        rows.append(("process RSS (max, samples)", _gib(mem["process_rss_max_bytes"])))
    if mem["ram_used_max_bytes"] is not None:
        rows.append(("machine RAM used (max)", _join(_gib(mem["ram_used_max_bytes"]),
                                                     _f(_gib(mem["ram_total_bytes"]), "of {}"), sep=" ")))
    if mem["swap_used_max_bytes"]:
        rows.append(("swap used (max)", _gib(mem["swap_used_max_bytes"])))
    th = summary["thermal"]
    if summary["samples"]:
        cpu = _join(_f(th["cpu_temperature_max_c"], "{:.0f} °C"), _f(th["cpu_package_watts_max"], "{:.0f} W package"),
                    _f(th["cpu_throttle_events"] or None, "{:.0f} thermal throttle events"))
        rows.append(("CPU (max)", cpu or f"unavailable ({na.get('thermal.cpu_temperature_max_c', 'not read')})"))
        for g in th["gpus"]:
            power = _join(_f(g["power_max_watts"], "{:.0f} W"), _f(g["power_limit_watts"], "of {:.0f} W limit"),
                          sep=" ") if g["power_max_watts"] is not None else None
            used = _join(_f(_gib(g["memory_used_max_bytes"]), "{} used"), _f(_gib(g["memory_total_bytes"]), "of {}"),
                         sep=" ") if g["memory_used_max_bytes"] is not None else None
            rows.append((f"GPU {g['index']} (max)", _join(
                _f(g["temperature_max_c"], "{:.0f} °C"), power, used,
                _f(g["utilization_median_percent"], "{:.0f} % busy (median)"),
                _f(g["throttled_samples"] or None, "throttled in {} samples")) or "no reading"))
        if th["on_battery_samples"] or th["battery_min_percent"] is not None:
            rows.append(("battery", _join(_f(th["on_battery_samples"] or None, "on battery in {} samples"),
                                          _f(th["battery_min_percent"], "lowest {:.0f} %")) or "on AC"))
    rows.append(("machine samples", str(summary["samples"]) if summary["samples"] else
                 f"none ({na.get('thermal', 'none recorded')})"))
    rows.append(("events", ", ".join(f"{k} ×{v}" for k, v in summary["events"].items()) or "none"))
    for change in summary.get("config_changes") or []:  # how the config in force differed from config.yaml
        at = "at start" if change["step"] is None else f"from step {change['step']}"
        rows.append(("config changed", f"{', '.join(change['fields'])} {at} ({change['reason']})"))
    return [(label, value or "unavailable") for label, value in rows]


def _img(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    return (f'<figure id="plot-{plot.name}"><img class="plot" src="data:image/png;base64,{data}" '
            f'alt="{_esc(plot.alt)}" width="{plot.width}" height="{plot.height}">'
            f"<figcaption><b>{_esc(plot.title)}.</b> {_esc(plot.alt)}</figcaption></figure>")


def _details(details: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={json.dumps(v)}" for k, v in details.items())
    return text if len(text) <= 300 else text[:297] + "..."


def render_html(run: RunData, summary: dict[str, Any], plots: list[Plot], left_out: dict[str, str],
                *, generated_by: str) -> str:
    """The page (see the module doc)."""
    name = run.run_dir.name or str(run.run_dir)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>trainfit report: {_esc(name)}</title><style>{_CSS}</style></head><body>",
           f"<h1>Training report: {_esc(name)}</h1>",
           f'<p class="meta">Run directory {_esc(run.run_dir)}. Written {_esc(_clock(time.time()))} by '
           f"{_esc(generated_by)}. Memory in GiB (2<sup>30</sup> bytes) and MiB (2<sup>20</sup> bytes); "
           "times are this computer's local time.</p>",
           '<section id="summary"><h2>Summary</h2><table class="summary"><tbody>']
    out += [f"<tr><th>{_esc(label)}</th><td>{_esc(value)}</td></tr>" for label, value in summary_rows(summary)]
    out.append("</tbody></table>")
    if summary["notes"]:
        out.append('<ul class="notes">' + "".join(f'<li class="note">{_esc(n)}</li>' for n in summary["notes"])
                   + "</ul>")
    out.append('</section><section id="plots"><h2>Plots</h2>')
    out += [_img(p) for p in plots]
    if left_out:
        out.append('<ul class="left-out">' + "".join(
            f"<li><b>{_esc(TITLES[k])}</b> left out: {_esc(why)}.</li>" for k, why in left_out.items()) + "</ul>")
    out.append('</section><section id="events"><h2>Events</h2>')
    events = sorted(run.events, key=lambda e: (e.time is None, e.time or 0.0, e.line))
    if events:
        t0 = summary["started_at"]
        out.append("<table><thead><tr><th>time</th><th>since start</th><th>step</th><th>kind</th><th>reason</th>"
                   "<th>details</th></tr></thead><tbody>")
        for e in events[:MAX_EVENT_ROWS]:
            since = "—" if e.time is None or t0 is None else f"{e.time - t0:,.1f} s"
            out.append(f'<tr><td class="time">{_esc(_clock(e.time))}</td><td class="time">{_esc(since)}</td>'
                       f"<td>{'—' if e.step is None else e.step}</td><td>{_esc(e.kind)}</td>"
                       f"<td>{_esc(e.reason or '—')}</td><td>{_esc(_details(e.details))}</td></tr>")
        out.append("</tbody></table>")
        if len(events) > MAX_EVENT_ROWS:
            out.append(f'<p class="note">The first {MAX_EVENT_ROWS} of {len(events)} events are shown; all are in '
                       "metrics.jsonl.</p>")
    else:
        out.append("<p>No events were recorded.</p>")
    config = (run.config_text if run.config_text is not None else
              "(no config.yaml: a run monitored with MonitorCallback or monitor_training)")
    out.append('</section><section id="config"><h2>Run config (config.yaml)</h2>'
               f"<pre>{_esc(config)}</pre></section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
