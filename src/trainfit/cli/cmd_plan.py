"""`trainfit plan`: three ready-to-run configurations (conservative, balanced, extreme) for a goal on
this machine or on named hardware, and with --out the files Transformers, TRL, PEFT, Accelerate,
DeepSpeed and `trainfit train` load."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainfit.cli.framework_arg import add_framework_argument, plan_framework
from trainfit.cli.plan_document import cluster_document, plan_document
from trainfit.cli.plan_request import build_request, check_launchers, command_line, data_paths, invoked
from trainfit.errors import EXIT_DOES_NOT_FIT, EXIT_OK, BadInputError
from trainfit.validate import arg

# The request helpers live in cli/plan_request.py and the JSON document in cli/plan_document.py, which
# `plan --pipeline` (cli/plan_pipeline.py) and `analyze` import too: this module imports them, never
# the other way round. Named here as well, where callers have always found them.
__all__ = ["HELP", "add_arguments", "build_request", "cluster_document", "command_line", "data_paths", "invoked",
           "plan_document", "plan_for", "run", "write_exports"]

HELP = "plan three configurations (conservative / balanced / extreme) and write their config files"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from trainfit.core.plan.modes import MODES
    from trainfit.core.plan.planner import PLAN_METHODS
    from trainfit.core.setup import DEFAULT_METHOD

    p.add_argument("model", nargs="?", help="catalog id or alias, a local model dir or config.json, or a shape "
                   "(shape:125m); omit with --method pretrain to let the planner pick the size")
    p.add_argument("--method", default=DEFAULT_METHOD, help=f"{', '.join(PLAN_METHODS)} (sft = full; default "
                   f"{DEFAULT_METHOD} as estimate and cloud: full fine-tuning, falling back to LoRA, then QLoRA, "
                   "where it does not fit; auto is the same rule)")
    p.add_argument("--mode", action="append", help=f"{', '.join(MODES)} (repeatable; default all three)")
    p.add_argument("--hardware", help="catalog machine ('rtx-4090', '2x a100-80gb', 'm2-16gb', 'cpu') or a profile "
                   "JSON; default: this machine")
    from trainfit.cli.knob_flags import add_knob_flags

    add_knob_flags(p, "plan", only=("seq_len",))  # declared in trainfit.core.knobs
    p.add_argument("--target-batch", type=arg("target_batch"), help="effective batch to keep (default: 16 / 32 / 64 by mode)")
    p.add_argument("--examples", type=arg("examples"), help="training examples (DPO: pairs)")
    p.add_argument("--pipeline", help="plan phases that run in order, joined by their hand-offs: sft+dpo, "
                   "pretrain+sft, pretrain+sft+dpo (--method is the SFT phase's; docs/pipeline.md)")
    p.add_argument("--pairs", type=arg("pairs"), help="with --pipeline: DPO preference pairs (default: --examples)")
    p.add_argument("--dataset-tokens", type=arg("dataset_tokens"), help="tokens in the dataset (one epoch)")
    from trainfit.cli.cmd_estimate import add_image_arguments

    add_image_arguments(p)
    p.add_argument("--epochs", type=arg("epochs"), default=1.0)
    p.add_argument("--time-budget", help="longest run, e.g. 2h, 90m, 1.5d (default: each mode's)")
    p.add_argument("--memory-budget", help="memory per device to plan for, e.g. 3GiB (default: what the device has)")
    p.add_argument("--memory-share", type=arg("memory_share"), help="share of the memory each mode may use (default .5/.75/.95)")
    p.add_argument("--tokens-per-param", type=arg("tokens_per_param"), help="pretraining token budget (default 12 / 20 / 25)")
    p.add_argument("--vocab", type=arg("vocab"), default=32000, help="pretraining vocabulary size (default 32000)")
    p.add_argument("--usd-per-hour", type=arg("usd_per_hour"), help="hourly price of the machine (rented hardware)")
    p.add_argument("--flavor", metavar="ID", help="plan for a cloud flavor (trainfit cloud): its GPUs and its price")
    p.add_argument("--spot", action="store_true", help="with --flavor: its spot price and interruption rate (checkpoint "
                   "cadence, expected cost incl. re-done work, safety.interruption_hours in the run config)")
    p.add_argument("--prices", help="with --flavor: a price file (as trainfit cloud --prices), e.g. a spot price and "
                   "spot_interruption for an AWS flavor")
    p.add_argument("--budget", type=arg("budget_usd"), help="most dollars to spend (with --usd-per-hour)")
    p.add_argument("--price-per-kwh", type=arg("price_per_kwh"), default=None, help="electricity price (default 0.17)")
    p.add_argument("--data", action="append", help="data file or directory for the exported run config "
                   "(repeatable; default: the shipped sample set); its size and row lengths plan the data I/O")
    p.add_argument("--dataset", metavar="HUB_ID", help="a Hub dataset ('owner/name' or 'owner/name:config'): its "
                   "size metadata plans streaming vs download, the cache and the token budget")
    p.add_argument("--out", help="write each mode's files into OUT/<mode>/")
    p.add_argument("--launcher", action="append", metavar="ENGINE", help="with --out: also write the job spec for "
                   "slurm (slurm.sbatch), skypilot (skypilot.yaml, skypilot-job.yaml) or kubernetes (pytorchjob.yaml), "
                   "repeatable; docs: README 'Running on a cluster'")
    p.add_argument("--for", dest="for_tool", metavar="TOOL", default="trl", help="with --out, also write the "
                   "native config of the tool you train with: trl (default: trainfit's run config and the TRL / "
                   "Accelerate / DeepSpeed files only), axolotl, llama-factory, torchtune, litgpt")
    p.add_argument("--force", action="store_true", help="overwrite files that exist in --out")
    add_framework_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    from trainfit.cli import plan_probe

    plan_probe.add_arguments(p)  # --probe-seconds, --no-probe


def plan_for(model: str | None = None, **flags):
    """Python twin of `trainfit plan` (without --pipeline / --out): (Plan, PlanRequest), what it prints.
    Keyword flags are the command's long options with underscores (method="lora", flavor="t4-small")."""
    from trainfit.core.plan.planner import plan

    # The command's own parser gives every flag not named here its default, so the twin cannot drift
    # from the command line; build_request then checks them all, as for `trainfit plan`.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([] if model is None else [model])
    for key, value in flags.items():
        if not hasattr(args, key) or key in ("out", "pipeline", "json"):
            raise BadInputError(f"plan_for(): unknown option {key!r}")
        setattr(args, key, value)
    req = build_request(args)
    return plan(req), req


def write_exports(plan, req, out_dir: Path, *, force: bool, data: list[str] | None, command: str,
                  flag: str = "--out", launchers: tuple[str, ...] = (), tool: str = "trl") -> dict[str, list[str]]:
    """Render every mode's files first (all validated), then publish them all in one step
    (trainfit.export.publish.write_tree); returns mode -> paths."""
    from trainfit.export.plan_files import plan_files
    from trainfit.export.publish import write_tree

    if plan.method == "inference":
        raise BadInputError(f"{flag}: an inference plan has no training files to write", hint=f"drop {flag}")
    rendered = {}
    for mp in plan.modes:
        if mp.fits:
            rendered[mp.mode] = plan_files(mp, req, command, data, base_dir=out_dir / mp.mode, launchers=launchers,
                                           tool=tool)
    if not rendered:
        return {}
    written = write_tree(out_dir, rendered, force=force, flag=flag)
    return {mode: [str(p) for p in paths] for mode, paths in written.items()}


def run(args: argparse.Namespace) -> int:
    if args.pipeline is not None and getattr(args, "for_tool", "trl") not in (None, "trl"):
        raise BadInputError("--for: a --pipeline plan is written for trainfit's own run (--for trl); plan each "
                            "phase on its own with --for")
    if args.pipeline is not None and getattr(args, "launcher", None):
        raise BadInputError("--launcher: writes one run's job spec; a --pipeline runs its phases in order, "
                            "so plan each phase with --launcher")
    if args.pipeline is not None:  # phases in order, one meta-config per mode (cli/plan_pipeline.py)
        from trainfit.cli.plan_pipeline import run as run_pipeline

        return run_pipeline(args)
    if args.pairs is not None:
        raise BadInputError("--pairs: counts the DPO phase of a --pipeline; for one DPO run give --examples")
    req = build_request(args)
    from trainfit.cli import plan_probe

    result, probe = plan_probe.plan(args, req)  # on this machine: confirmed by real steps
    files: dict[str, list[str]] = {}
    if args.out is not None:
        files = write_exports(result, req, Path(args.out), force=args.force, data=data_paths(args.data),
                              command=invoked(args), launchers=check_launchers(args), tool=args.for_tool)
    if args.json:
        from trainfit.cli.output import print_json

        doc = plan_document(result, files)
        doc["framework"] = plan_framework(result, req, as_json=True)
        doc["cluster"] = cluster_document(req.hardware)
        if probe is not None:
            doc["probe"] = probe
        print_json(doc)
    else:
        from trainfit.cli.output import console
        from trainfit.cli.render_plan import render_plan

        out = console()
        out.print(f"[bold]trainfit plan[/]: {req.model.id if req.model else 'pretraining from scratch'} "
                  f"on {req.hardware.source} ({result.device})")
        if result.rates:
            out.print(f"[dim]{result.rates['text']}[/]")
        out.print("")
        render_plan(result, out, files=files)
        plan_framework(result, req, as_json=False)
        cluster = cluster_document(req.hardware)
        if cluster is not None:
            out.print(f"[bold]cluster[/] ({cluster['network']}): " + " ".join(
                f"{v['name']}={v['value']}" if v["value"] is not None else v["name"] for v in cluster["env"]))
            out.print(f"[dim]{cluster['checkpoint_dir']}[/]")
        plan_probe.render(probe, out)
    return EXIT_OK if any(m.fits for m in result.modes) else EXIT_DOES_NOT_FIT


