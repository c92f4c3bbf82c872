"""`trainfit plan` on the machine it plans for: confirm the picks with a few seconds of real steps
(trainfit.train.probe), or say why no probe ran. The flags: --probe-seconds, --no-probe.

TRAINFIT_SPEED_SKEW (a test hook, e.g. "precision=bf16-mixed:0.02") makes the speed model
deliberately wrong about one knob's value: its predicted step times are multiplied by the factor,
so a test or benchmark can show the probe finds the measured best anyway. TRAINFIT_NO_PROBE=1
turns the probe off (the test suite sets it; its plans must not spend seconds measuring).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from trainfit.errors import BadInputError

SKEW_ENV = "TRAINFIT_SPEED_SKEW"
NO_PROBE_ENV = "TRAINFIT_NO_PROBE"
SKEW_KNOBS = ("precision", "attention", "grad_checkpointing", "optimizer", "method")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from trainfit.train.probe import DEFAULT_PROBE_SECONDS
    from trainfit.validate import arg

    p.add_argument("--probe-seconds", type=arg("probe_seconds"), default=DEFAULT_PROBE_SECONDS,
                   help=f"planning for this machine: seconds of real training steps that confirm the picks "
                        f"(default {DEFAULT_PROBE_SECONDS:g}; stored, so the next plan needs none)")
    p.add_argument("--no-probe", action="store_true", help="plan from the speed model alone (no real steps)")


def speed_skew() -> tuple:
    """The TRAINFIT_SPEED_SKEW test hook: KNOB=VALUE:FACTOR[,KNOB=VALUE:FACTOR...]."""
    from trainfit.core.plan.measured import SpeedSkew

    text = os.environ.get(SKEW_ENV, "").strip()
    if not text:
        return ()
    out = []
    for part in text.split(","):
        try:
            knob_value, factor = part.rsplit(":", 1)
            knob, value = knob_value.split("=", 1)
            f = float(factor)
        except ValueError:
            f, knob = -1.0, ""
        if knob.strip() not in SKEW_KNOBS or not (0 < f < 1e6):
            raise BadInputError(f"{SKEW_ENV}: {part!r} is not KNOB=VALUE:FACTOR (knobs: {', '.join(SKEW_KNOBS)}; "
                                "factor > 0), e.g. precision=bf16-mixed:0.02")
        out.append(SpeedSkew(knob.strip(), value.strip(), f))
    return tuple(out)


def why_no_probe(args: argparse.Namespace, req) -> str | None:
    """None when the plan is for this machine and may probe, else why it does not."""
    if getattr(args, "no_probe", False):
        return "--no-probe"
    if os.environ.get(NO_PROBE_ENV):
        return f"{NO_PROBE_ENV} is set"
    if getattr(args, "flavor", None):
        return "planned for a cloud flavor, not this machine"
    if args.hardware is not None and not _is_this_machine(req.hardware):
        return "planned for other hardware (--hardware), not this machine"
    if req.method == "inference":
        return "inference plans rank by batch size, not step time"
    framework = getattr(req, "framework", None)
    if framework is not None and not framework.is_own:  # the probe times trainfit's own loop
        return f"planned for {framework.label} (--framework), whose steps the probe cannot run"
    return None


def _is_this_machine(hw) -> bool:
    """A saved profile of this machine (same fingerprint as the live one) counts as this machine."""
    if not hw.source.startswith("file:"):
        return False
    from trainfit.cli.cmd_estimate import load_hardware
    from trainfit.train.calibration import machine_fingerprint

    return machine_fingerprint(hw) == machine_fingerprint(load_hardware(None))


def plan(args: argparse.Namespace, req):
    """(Plan, probe JSON or None): the plan, confirmed by the probe where it may run."""
    from trainfit.core.plan.planner import plan as plan_only

    skew = speed_skew()
    if skew:
        req = dataclasses.replace(req, speed_skew=skew)
    why = why_no_probe(args, req)
    if why is not None:
        result = plan_only(req)
        return result, ({"ran": False, "skipped": why, "speed_skew": _skew_json(skew)} if skew or why not in (
            "planned for other hardware (--hardware), not this machine",
            "planned for a cloud flavor, not this machine") else None)
    from trainfit.train.probe import confirm_plan

    result, report = confirm_plan(req, seconds=args.probe_seconds, log=_progress)
    return result, {**dataclasses.asdict(report), "speed_skew": _skew_json(skew)}


def _skew_json(skew: tuple) -> list[dict]:
    return [dataclasses.asdict(s) for s in skew]


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def render(probe: dict | None, out) -> None:
    """The probe in a few lines under the plan's tables."""
    if probe is None:
        return
    if probe.get("speed_skew"):
        skews = ", ".join(f"{s['knob']}={s['value']} x{s['factor']:g}" for s in probe["speed_skew"])
        out.print(f"[yellow]speed model skewed on purpose ({SKEW_ENV}): {skews}[/]")
    if not probe["ran"]:
        out.print(f"[dim]probe: not run ({probe['skipped']})[/]" if probe.get("skipped") else
                  "[dim]probe: not run[/]")
        if probe.get("skipped") and "stored" not in probe["skipped"]:
            return
    else:
        state = "confirmed the picks" if probe["confirmed"] else f"did not finish ({probe['unconfirmed']})"
        again = f", {probe['rechecks']} finalist pair(s) measured again" if probe.get("rechecks") else ""
        out.print(f"[bold]probe[/]: {probe['seconds']:.1f} s of real steps on this machine "
                  f"(budget {probe['budget_seconds']:g} s, {probe['rounds']} rounds{again}): {state}")
    for m in probe["measurements"]:
        if "error" in m:
            out.print(f"  {m['setup']}: not measured ({m['error']})")
            continue
        bound = ">= " if m["lower_bound"] else ""
        repeats = m.get("repeats", 1)
        noise = f", spread {m['spread']:.0%}" if m.get("spread") is not None and not m["lower_bound"] else ""
        out.print(f"  {m['setup']}: {bound}{m['measured_step_seconds']:.3g} s/step measured"
                  + (f" (median of {repeats})" if repeats > 1 else "") + f"{noise}, "
                  f"{m['predicted_step_seconds']:.3g} predicted ({m['measured_over_predicted']:.2f}x)"
                  + (" [stored]" if m["source"] == "stored" else ""))
    for p in probe["picks"]:
        if p.get("decision"):
            out.print(f"  {p['mode']}: {p['decision']['text']}")
        elif p["changed"]:
            out.print(f"  {p['mode']}: the speed model picked {p['speed_model_pick']}; measured best: {p['pick']}")
    if probe.get("stored"):
        out.print(f"  stored as this machine's calibration: {probe['stored']}")
