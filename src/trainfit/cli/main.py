"""`trainfit` entry point: builds the sub-command parsers and maps errors to exit codes.

Each command lives in its own module `trainfit.cli.cmd_<name>` exposing:
    HELP: str                        one line for `trainfit --help`
    add_arguments(parser) -> None
    run(args) -> int                 exit code; raise TrainfitError for user-facing failures
Command modules must import heavy libraries (torch, transformers) inside run(), never at import
time, so that `trainfit --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trainfit import __version__
from trainfit.errors import EXIT_BAD_INPUT, TrainfitError

# Order is the order shown in --help.
COMMANDS = ["analyze", "profile", "estimate", "plan", "cloud", "train", "verify", "models", "gpus"]


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line (plus the valid choices) with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"trainfit: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trainfit",
        description="Make LLM training fit your machine: profile, estimate, plan, train.",
    )
    parser.add_argument("--version", action="version", version=f"trainfit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"trainfit.cli.cmd_{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trainfit.cli.cmd_{name}":
                continue  # command not built yet
            raise
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args._run(args) or 0)
    except TrainfitError as exc:
        print(f"trainfit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("trainfit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
