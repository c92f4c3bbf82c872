"""The numbers of `trainfit report`: steps, loss, throughput, memory measured vs predicted,
temperatures and power, events by kind. Pure: a RunData in, a JSON-ready dict out.

Every figure is measured (metrics.jsonl, summary.json's "measured") or predicted (summary.json's
"predicted"); a figure that cannot be given is None with its reason in `unavailable`. Non-finite
values (a diverged loss) are left out of the figures and counted in `notes`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any

from trainfit.report.run_data import RunData

# NVML clock-event reasons that are not a slowdown (idle, a clock the user set, display, sync).
BENIGN_THROTTLE_REASONS = frozenset({"gpu_idle", "idle", "applications_clocks_setting", "display_clock_setting",
                                     "sync_boost", "none"})
# A safety pause (train/monitor/safety.py) -> the events that end it: resumed, or stopped for good.
PAUSE_ENDS = {"thermal_pause": ("thermal_resume", "thermal_stop"), "battery_pause": ("power_resume", "battery_stop")}


def finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _max(values) -> float | None:
    vals = finite(values)
    return max(vals) if vals else None


def _median(values) -> float | None:
    vals = finite(values)
    return statistics.median(vals) if vals else None


def _num(d: Any, *keys: str) -> float | None:
    """d[k1][k2]... when it is a finite number (summary.json is read, not trusted)."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
        return None
    return d


def _text(d: Any, key: str) -> str | None:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, str) else None


def is_throttled(reasons) -> bool:
    return any(r not in BENIGN_THROTTLE_REASONS for r in reasons)


def run_plan(run: RunData) -> dict[str, Any]:
    """What the run was planned to do, as its last `run_plan` event wrote it when it started
    (train/runner.py): {} when it has none (an older run, or one monitored from Python)."""
    plans = [e for e in run.events if e.kind == "run_plan"]
    return dict(plans[-1].details) if plans else {}


def summarize(run: RunData) -> dict[str, Any]:
    """The report's summary (see the module doc). A run without summary.json (killed, crashed,
    still running) takes its prediction and planned length from its run_plan event."""
    plan = run_plan(run)
    s = run.summary or {key: plan.get(key) for key in ("method", "model", "device", "max_steps", "predicted")}
    unavailable: dict[str, str] = {}
    notes: list[str] = []
    steps = run.steps
    n = run.step_count

    # --- steps and loss
    losses = [(st, v) for st, v in zip(steps["step"], steps["loss"]) if v is not None]
    finite_losses = [(st, v) for st, v in losses if math.isfinite(v)]
    bad = [st for st, v in losses if not math.isfinite(v)]
    if bad:
        notes.append(f"the loss was not a finite number at {len(bad)} logged step(s), first at step {bad[0]}")
    loss = {"first": finite_losses[0][1] if finite_losses else None,
            "last": finite_losses[-1][1] if finite_losses else None,
            "min": min(v for _, v in finite_losses) if finite_losses else None,
            "min_step": min(finite_losses, key=lambda p: p[1])[0] if finite_losses else None,
            "non_finite_steps": len(bad)}
    if not finite_losses:
        unavailable["loss"] = "no logged step with a finite loss in metrics.jsonl"

    # --- throughput
    tps = finite(steps["tokens_per_second"])
    throughput = {"tokens_per_second_median": _median(tps), "tokens_per_second_max": _max(tps),
                  # the run's own median (after warm-up, every step timed) when it has finished
                  "step_seconds_median": _num(s, "measured", "step_seconds_median") or _median(steps["step_seconds"])}
    if not tps:
        unavailable["tokens_per_second"] = "no logged step with tokens_per_second"

    # --- memory
    host = [smp.host for smp in run.samples]
    gpus = gpu_series(run)
    measured_peak = _num(s, "measured", "peak_bytes")
    peak_kind = _text(s.get("measured"), "peak_kind") if isinstance(s, dict) else None
    if measured_peak is None:  # the run has not finished: the peaks its steps logged
        for key, kind in (("cuda_max_allocated_bytes", "cuda_max_allocated"), ("peak_rss_bytes", "peak_rss")):
            measured_peak = _max(steps[key])
            if measured_peak is not None:
                peak_kind = kind
                break
    predicted_total = _num(s, "predicted", "total_bytes")
    predicted_tensor = _num(s, "predicted", "tensor_peak_bytes")
    memory = {
        "measured_peak_bytes": measured_peak,
        "measured_peak_kind": peak_kind if measured_peak is not None else None,
        "predicted_total_bytes": predicted_total,
        "predicted_tensor_peak_bytes": predicted_tensor,
        "measured_over_predicted_total": (measured_peak / predicted_total
                                          if measured_peak is not None and predicted_total else None),
        "process_rss_max_bytes": _max(h.process_rss_bytes for h in host),
        "ram_used_max_bytes": _max(h.ram_used_bytes for h in host),
        "ram_total_bytes": _max(h.ram_total_bytes for h in host),
        "swap_used_max_bytes": _max(h.swap_used_bytes for h in host),
    }
    if measured_peak is None:
        unavailable["memory.measured_peak_bytes"] = "no peak memory in summary.json or in the logged steps"
    if predicted_total is None:
        unavailable["memory.predicted_total_bytes"] = (
            "summary.json and the run_plan event are absent" if run.summary is None and not plan else
            _text(s.get("predicted", {}).get("unavailable") if isinstance(s.get("predicted"), dict) else None,
                  "total_bytes") or "summary.json has no predicted total")

    # --- temperatures and power
    cpu_throttle = finite(h.cpu_throttle_events for h in host)
    thermal = {
        "cpu_temperature_max_c": _max(h.cpu_temperature_c for h in host),
        "cpu_package_watts_max": _max(h.cpu_package_watts for h in host),
        "cpu_throttle_events": (max(cpu_throttle) - min(cpu_throttle)) if cpu_throttle else None,
        "gpus": [{
            "index": idx,
            "temperature_max_c": _max(g.temperature_c for _, g in series),
            "power_max_watts": _max(g.power_watts for _, g in series),
            "power_limit_watts": _max(g.power_limit_watts for _, g in series),
            "memory_used_max_bytes": _max(g.memory_used_bytes for _, g in series),
            "memory_total_bytes": _max(g.memory_total_bytes for _, g in series),
            "allocated_max_bytes": _max(g.allocated_bytes for _, g in series),
            "reserved_max_bytes": _max(g.reserved_bytes for _, g in series),
            "utilization_median_percent": _median([g.utilization_percent for _, g in series]),
            "throttled_samples": sum(1 for _, g in series if is_throttled(g.throttle_reasons)),
        } for idx, series in sorted(gpus.items())],
        "on_battery_samples": sum(1 for h in host if h.on_ac is False),
        "battery_min_percent": min(finite(h.battery_percent for h in host), default=None),
    }
    if not run.samples:
        unavailable["thermal"] = ("metrics.jsonl has no machine samples (written by the training monitor); "
                                  "temperatures and power were not recorded")
    elif thermal["cpu_temperature_max_c"] is None:
        unavailable["thermal.cpu_temperature_max_c"] = run.unavailable.get(
            "host.cpu_temperature_c", "no sample carries a CPU temperature")

    # --- events and time
    kinds = Counter(e.kind for e in run.events)
    times = finite([*steps["time"], *(smp.time for smp in run.samples), *(e.time for e in run.events)])
    summary = {
        "run_dir": str(run.run_dir),
        "method": _text(s, "method"), "model": _text(s, "model"), "device": _text(s, "device"),
        "finished": run.summary is not None,
        "started_at": min(times) if times else None,
        "elapsed_seconds": (max(times) - min(times)) if times else None,
        "wall_seconds": _num(s, "wall_seconds"),
        "steps": {"logged": n, "first": steps["step"][0] if n else None, "last": steps["step"][-1] if n else None,
                  "global_step": _num(s, "global_step"), "max_steps": _num(s, "max_steps")},
        # the length it was planned for: steps, and the memory model's time for them
        "planned": {"max_steps": _num(s, "max_steps"), "step_seconds": _num(s, "predicted", "step_seconds"),
                    "seconds": (_num(s, "max_steps") * _num(s, "predicted", "step_seconds")
                                if _num(s, "max_steps") and _num(s, "predicted", "step_seconds") else None),
                    "source": "summary.json" if run.summary is not None else ("run_plan event" if plan else None)},
        "loss": loss,
        "learning_rate_max": _max(steps["learning_rate"]),
        "throughput": throughput,
        "memory": memory,
        "thermal": thermal,
        "samples": len(run.samples),
        "events": dict(sorted(kinds.items())),
        "config_changes": config_changes(run),
        "unavailable": unavailable,
        "notes": [*run.notes, *notes],
    }
    return summary


def config_changes(run: RunData) -> list[dict[str, Any]]:
    """The run's config_change events (train/in_force.py) in order: step, why, what made it, and
    each changed field as "path: old -> new"."""
    out = []
    for e in run.events:
        if e.kind != "config_change":
            continue
        changes = e.details.get("changes")
        fields = [f"{path}: {c.get('from')} -> {c.get('to')}" for path, c in changes.items() if isinstance(c, dict)] \
            if isinstance(changes, dict) else []
        out.append({"step": e.step, "reason": e.reason, "source": e.details.get("source"), "fields": fields})
    return out


def gpu_series(run: RunData) -> dict[int, list]:
    """GPU index -> [(time, GpuSample)] over the samples."""
    out: dict[int, list] = {}
    for smp in run.samples:
        for g in smp.gpus:
            out.setdefault(g.index, []).append((smp.time, g))
    return out


def pause_spans(run: RunData) -> list[tuple[float, float, str]]:
    """(start, end, kind) of each pause a safety policy made: a thermal_pause to the next
    thermal_resume / thermal_stop, a battery_pause to the next power_resume / battery_stop; a pause
    with no end lasts to the run's last record."""
    end_of_run = _max([*run.steps["time"], *(smp.time for smp in run.samples), *(e.time for e in run.events)])
    spans, open_pause = [], None
    for e in sorted((e for e in run.events if e.time is not None), key=lambda e: e.time):
        if e.kind in PAUSE_ENDS and open_pause is None:
            open_pause = e
        elif open_pause is not None and e.kind in PAUSE_ENDS[open_pause.kind]:
            spans.append((open_pause.time, e.time, open_pause.kind))
            open_pause = None
    if open_pause is not None and end_of_run is not None and end_of_run > open_pause.time:
        spans.append((open_pause.time, end_of_run, open_pause.kind))
    return spans
