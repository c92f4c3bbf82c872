"""`trainfit train RUN_CONFIG`: run a training (pretrain, SFT full / LoRA / QLoRA, DPO)."""

from __future__ import annotations

import argparse
import json

from trainfit.validate import arg

HELP = "run a training from a run config (pretrain, sft, lora, qlora, dpo); resumable"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="RUN_CONFIG", help="run config YAML (see docs/run-config.md), or a pipeline "
                        "meta-config whose phases run in order (docs/pipeline.md)")
    parser.add_argument("--out", metavar="RUN_DIR", help="run directory (default: runs/<config name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest complete checkpoint in RUN_DIR")
    parser.add_argument("--max-steps", type=arg("max_steps"), metavar="N",
                        help="stop (with a checkpoint) after N optimizer steps; the schedule still follows "
                             "the config, so --resume later continues the same run")
    parser.add_argument("--verify", action="store_true",
                        help="first run a few steps to compare measured and predicted memory and time")
    parser.add_argument("--quiet", action="store_true", help="log lines only, no progress bar")
    parser.add_argument("--json", action="store_true", help="print summary.json on stdout")


def default_run_dir(config_path: str) -> str:
    from pathlib import Path

    return str(Path("runs") / Path(config_path).stem)


def train(config: str, out: str | None = None, *, resume: bool = False, max_steps: int | None = None,
          verify: bool = False, quiet: bool = False, log=None) -> dict:
    """Python twin of the command: returns the summary (plus the verify report when asked)."""
    from trainfit.core.serde import to_jsonable
    from trainfit.config.run_config import load_run_config, refuse_foreign_framework
    from trainfit.errors import BadInputError

    if max_steps is not None and max_steps < 1:
        raise BadInputError(f"--max-steps: must be >= 1, got {max_steps}")
    from trainfit.config.pipeline import is_pipeline_file
    from trainfit.train.pipeline_run import train_pipeline_file
    from trainfit.validate import output_dir

    def check_out() -> None:
        # Before any work: the default runs/<name> in a read-only directory is refused now, not
        # after seconds of loading with a PermissionError.
        output_dir(out if out is not None else default_run_dir(config),
                   "--out" if out is not None else f"the default run directory {default_run_dir(config)} (give --out DIR)")

    if is_pipeline_file(config):  # a meta-config (docs/pipeline.md): its phases in order
        check_out()
        return train_pipeline_file(config, out, resume=resume, max_steps=max_steps, verify=verify, quiet=quiet, log=log)
    cfg = load_run_config(config)  # a bad config is named first: it is the first thing to fix
    refuse_foreign_framework(cfg, "trainfit train")
    check_out()
    from trainfit.config.run_config import shared_storage_errors

    for problem in shared_storage_errors(cfg, out or default_run_dir(config)):  # several nodes: shared storage
        raise BadInputError(problem)
    report = None
    if verify:
        from trainfit.cli.cmd_verify import render_report
        from trainfit.train.verify import verify_run

        report = verify_run(cfg, log=log)
        if log:
            for line in render_report(report):
                log(line)
    from trainfit.train.runner import run_training

    result = run_training(cfg, out or default_run_dir(config), resume=resume, stop_after=max_steps,
                          quiet=quiet, log=log)
    summary = dict(result.summary)
    if report is not None:
        summary["verify"] = to_jsonable(report)
        if result.summary:
            from trainfit.cli.output import write_atomic

            write_atomic(result.run_dir / "verify.json", json.dumps(summary["verify"], indent=2) + "\n")
    return summary


def run(args: argparse.Namespace) -> int:
    from trainfit.cli.output import print_json, say
    from trainfit.train.environment import quiet_libraries

    with _stdout_to_stderr(args.json), quiet_libraries():  # library warnings are not the user's business
        summary = train(args.config, args.out, resume=args.resume, max_steps=args.max_steps, verify=args.verify,
                        quiet=args.quiet, log=say)
    from trainfit.train.environment import end_distributed, world

    end_distributed()

    if world()[0] != 0:
        return 0  # under a launcher only rank 0 reports
    if args.json:
        print_json(summary)
    elif "pipeline" in summary:
        from trainfit.train.pipeline_run import summary_lines

        for line in summary_lines(summary):
            say(line)
    elif summary:
        first, last = summary.get("first_loss"), summary.get("final_loss")
        loss = f"loss {first:.4f} -> {last:.4f}" if first is not None and last is not None else "no steps run"
        step = summary["measured"]["step_seconds_median"]
        say(f"done: step {summary['global_step']}/{summary['max_steps']}, {loss}"
            + (f", {step:.3f} s/step" if step else "") + f"; weights: {summary['weights']}")
        recoveries = [r for r in summary.get("recoveries") or [] if r.get("kind") != "device_replan"]
        if recoveries:
            t = summary.get("training", {})
            kinds = ", ".join(sorted({r.get("kind", "?") for r in recoveries}))
            say(f"recovered {len(recoveries)} time(s) ({kinds}); global batch {summary['global_batch']} kept, a step "
                f"is now micro-batch {t.get('micro_batch')} x accumulation {t.get('grad_accum')}"
                + (", gradient checkpointing" if t.get("grad_checkpointing", "none") != "none" else "")
                + f", precision {t.get('precision')} (RUN_DIR/adjustments.json; events in metrics.jsonl)")
    return 0


class _stdout_to_stderr:
    """While training runs under --json, file descriptor 1 points at stderr: libraries that log on
    stdout (DeepSpeed's logger holds sys.stdout from its import on) cannot break the one JSON
    document the command prints after."""

    def __init__(self, active: bool):
        self.active, self.saved = active, None

    def __enter__(self):
        if self.active:
            import os
            import sys

            sys.stdout.flush()
            self.saved = os.dup(1)
            os.dup2(2, 1)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import os
            import sys

            sys.stdout.flush()
            os.dup2(self.saved, 1)
            os.close(self.saved)
        return False
