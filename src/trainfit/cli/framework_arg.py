"""`--framework NAME[@VERSION]` on estimate, plan, cloud and verify: the figures for the tool a user
trains with (trainfit.core.frameworks), and what naming it changed, behaviour by behaviour.

One definition of the flag (add_framework_argument); each command adds it with one call, applies the
profile where its TrainingSetup is built, and prints `framework_lines` / puts `framework_json` in its
--json document. With no flag the figures are trainfit's own run, and the output says so (with the
installed versions when the command describes this machine).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from trainfit.core.frameworks import (
    Change,
    Framework,
    apply_framework,
    base_setup,
    change_effects,
    describe,
    own_run,
    resolve_framework,
)
from trainfit.core.setup import TrainingSetup

GIB = 2**30
# Changes that move the figure by less than this are listed as "no effect on this setting".
NEGLIGIBLE_BYTES = 0.005 * GIB


def add_framework_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--framework", metavar="NAME[@VERSION]", default=None,
                   help="the tool that will run the training, so the figures are that tool's (trl, "
                        "transformers, peft, accelerate-fsdp, deepspeed, torchtune, litgpt, axolotl, llama-factory, "
                        "unsloth, fsdp_qlora, fms-hf-tuning, ...; an unknown name lists them all), with a release "
                        "or a constraint: trl@0.12, litgpt@0.4.9, 'transformers<4.49'; default: trainfit's own run")


def chosen(args: argparse.Namespace, *, this_machine: bool) -> Framework:
    """The framework the command's figures describe: --framework, else trainfit's own run (with the
    installed versions when the command describes this machine)."""
    text = getattr(args, "framework", None)
    if text is None:
        return own_run(this_machine=this_machine)
    return resolve_framework(text)


@dataclass
class Applied:
    framework: Framework
    base: TrainingSetup  # the setup before the profile
    framed: TrainingSetup  # as the framework runs it
    changes: list[Change] = field(default_factory=list)


def apply_to(args: argparse.Namespace, setup: TrainingSetup, *, this_machine: bool) -> TrainingSetup:
    """The setup as --framework runs it; what changed is kept on args.framework_applied."""
    framework = chosen(args, this_machine=this_machine)
    framed, changes = (setup, []) if framework.is_own else apply_framework(setup, framework)
    args.framework_applied = Applied(framework, setup, framed, changes)
    return framed


def applied_for(framework: Framework, framed: TrainingSetup) -> Applied:
    """A planned setup (already framed) with the changes the profile made to it."""
    if framework.is_own:
        return Applied(framework, framed, framed, [])
    base = base_setup(framed, framework)
    again, changes = apply_framework(base, framework)
    return Applied(framework, base, again, changes)


@dataclass(frozen=True)
class Effect:
    change: Change
    bytes: float  # what this behaviour alone adds to the need the fit verdict compares
    seconds: float | None  # ... to the step time (None: not computed)


def effects(applied: Applied, memory_bytes: Callable[[TrainingSetup], float],
            step_seconds: Callable[[TrainingSetup], float] | None = None) -> list[Effect]:
    """Each change's own effect: the estimate with and without that one behaviour."""
    mem = change_effects(applied.framed, applied.changes, memory_bytes)
    time = (change_effects(applied.framed, applied.changes, step_seconds) if step_seconds
            else [(c, None) for c in applied.changes])
    return [Effect(c, b, t) for (c, b), (_, t) in zip(mem, time)]


def needed_bytes_fn(model, hardware) -> Callable[[TrainingSetup], float]:
    """The need of the fullest device (what the fit verdict compares)."""
    from trainfit.core.memory import estimate_memory

    return lambda s: float(max(d.needed_bytes for d in estimate_memory(model, s, hardware).devices))


def framework_json(applied: Applied, found: list[Effect]) -> dict:
    """The framework the figures describe and each change with what it adds (bytes, seconds)."""
    return {**profile_fields(applied.framework), "changes": [change_json(e) for e in found]}


def change_json(e: Effect) -> dict:
    return {"knob": e.change.knob, "from": e.change.before, "to": e.change.after, "what": e.change.says,
            "source": e.change.source, "needed_bytes": _num(e.bytes), "step_seconds": _num(e.seconds)}


def profile_fields(fw: Framework) -> dict:
    return {
        "name": fw.name, "title": fw.title, "release": fw.release, "asked": fw.asked if not fw.is_own else None,
        "versions": fw.versions, "own_run": fw.is_own, "describes": describe(fw), "partial": fw.partial or None,
    }


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, 6)


def framework_lines(applied: Applied, found: list[Effect], *, indent: str = "  ") -> list[str]:
    """'figures for: ...' and one line per behaviour that moves the figure: '+4.10 GiB: trl 0.12 upcasts ...'."""
    fw = applied.framework
    lines = [f"figures for: {describe(fw)}"]
    if fw.is_own:
        return lines
    if fw.partial:
        lines.append(f"{indent}(partly derived: {fw.partial})")
    quiet = 0
    for e in found:
        if not math.isnan(e.bytes) and abs(e.bytes) < NEGLIGIBLE_BYTES and not (e.seconds and abs(e.seconds) >= 1e-3):
            quiet += 1
            continue
        lines.append(f"{indent}{_effect_text(e)}: {_what(fw, e.change)}")
    if not found:
        lines.append(f"{indent}no behaviour of {fw.label} differs from trainfit's own run on this setting")
    elif quiet:
        lines.append(f"{indent}{quiet} more behaviour{'s' if quiet > 1 else ''} of {fw.label} change nothing "
                     "measurable on this setting (--json lists them)")
    return lines


def _effect_text(e: Effect) -> str:
    mem = "n/a" if math.isnan(e.bytes) else f"{e.bytes / GIB:+.2f} GiB"
    if e.seconds is None or math.isnan(e.seconds) or abs(e.seconds) < 1e-3:
        return mem
    return f"{mem}, {e.seconds:+.3g} s/step"


def _what(fw: Framework, change: Change) -> str:
    """'trl 0.12 upcasts ...'; a behaviour a version decides names that version itself."""
    if change.source.startswith("derived:"):
        return change.says if change.says.startswith(f"{fw.name} ") else f"{change.says} (under {fw.label})"
    return f"{fw.label} {change.says}"


def plan_framework(result, req, *, as_json: bool):
    """plan: the framework every mode's memory and time are computed for, and per mode what each of its
    behaviours adds to that mode's memory and step time (printed, or the JSON)."""
    from trainfit.core.plan.hardware_rules import rules_for
    from trainfit.core.speed import predict_step
    from trainfit.core.speed.rates import device_rates

    framework = req.framework
    rates = device_rates(req.hardware, rules_for(req.hardware).device)
    per_mode = {}
    for mp in result.modes:
        if not mp.fits or mp.setup is None:
            continue
        applied = applied_for(framework, mp.setup)
        model = mp.model
        per_mode[mp.mode] = (applied, effects(applied, needed_bytes_fn(model, req.hardware),
                                               lambda s, m=model: predict_step(m, s, rates).step_seconds))
    if as_json:
        return {**profile_fields(framework),
                "modes": {mode: [change_json(e) for e in found] for mode, (_, found) in per_mode.items()}}
    from trainfit.cli.output import console

    out = console()
    out.print(f"figures for: {describe(framework)}", markup=False, highlight=False)
    if framework.is_own:
        return None
    for mode, (applied, found) in per_mode.items():
        for line in framework_lines(applied, found, indent="    ")[1:]:
            out.print(f"  {mode}: {line.strip()}", markup=False, highlight=False)
    return None


def profile_json(framework: Framework) -> dict:
    """The framework and the behaviours it may set (cloud: each flavor's setting is the tool's)."""
    return {**profile_fields(framework),
            "behaviours": [{"knob": b.knob, "to": b.value, "when": b.when, "what": b.says, "source": b.source}
                           for b in framework.behaviours]}


def print_profile(framework: Framework, flavor: str | None = None, found: list[Effect] | None = None) -> None:
    """cloud: the framework every setting is for, and what each behaviour adds on one flavor's setting."""
    from trainfit.cli.output import console

    out = console()
    out.print(f"figures for: {describe(framework)}", markup=False, highlight=False)
    if framework.is_own:
        return
    out.print(f"  every setting is as {framework.label} runs it", markup=False, highlight=False)
    if flavor and found is not None:
        applied = Applied(framework, None, None, [e.change for e in found])  # type: ignore[arg-type]
        for line in framework_lines(applied, found, indent="")[1:]:
            out.print(f"  {flavor}: {line}", markup=False, highlight=False)
