"""`trainfit` entry point: builds the sub-command parsers and maps errors to exit codes.

Each command lives in its own module `trainfit.cli.cmd_<name>` exposing:
    HELP: str                        one line for `trainfit --help`
    add_arguments(parser) -> None
    run(args) -> int                 exit code; raise TrainfitError for user-facing failures
Command modules must import heavy libraries (torch, transformers) inside run(), never at import
time. Only the command named on the command line is imported (`trainfit --help` imports none):
the one-line helps are repeated in COMMANDS below, and a test checks they equal each module's HELP.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Collection, Sequence

from trainfit import __version__
from trainfit.errors import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_UNAVAILABLE, Interrupted, TrainfitError,
                             raise_interrupted)
from trainfit.files import DISK_FULL_ERRNOS as _DISK_FULL

# Command -> its module's HELP, in the order shown in --help (tests/test_cli_imports.py checks
# that each equals trainfit.cli.cmd_<name>.HELP).
COMMANDS = {
    "analyze": "analyze hardware for LLM training: profile, score, three recommended configurations, warnings",
    "profile": "profile this machine's hardware (CPU, RAM, GPUs, storage, power); --json for the data",
    "estimate": "predict the memory of a training / inference setup and say whether it fits",
    "plan": "plan three configurations (conservative / balanced / extreme) and write their config files",
    "cloud": "rank cloud flavors (HF Jobs, AWS, GCP, Azure, Lambda, RunPod, ...) by fit, time and cost",
    "train": "run a training from a run config (pretrain, sft, lora, qlora, dpo); resumable",
    "verify": "run a few real steps of a run config and compare memory and speed with the predictions",
    "report": "report on a run directory: summary, plots (memory, loss, speed, thermals, events), one HTML page",
    "models": "list the model catalog, or show one model (catalog id, local dir, config.json, shape)",
    "gpus": "list the GPU catalog: memory, dense peak TFLOPS, bandwidth, power, interconnect",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line (plus the valid choices) with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"trainfit: error: {message} (see '{self.prog} --help')\n")


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The full parser. `load` names the commands whose modules are imported to add their
    arguments (default: all); the others get a placeholder sub-parser, enough for --help and
    for the list of valid choices."""
    parser = _Parser(
        prog="trainfit",
        description="Make LLM training fit your machine: profile, estimate, plan, train.",
    )
    parser.add_argument("--version", action="version", version=f"trainfit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, help_line in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_line, description=help_line)
        if load is None or name in load:
            module = importlib.import_module(f"trainfit.cli.cmd_{name}")
            module.add_arguments(cmd)
            cmd.set_defaults(_run=module.run)
    return parser


def named_command(argv: Sequence[str]) -> str | None:
    """The command argv names: its first word that is not an option (the top-level options
    take no value), or None."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    command = named_command(argv)
    parser = build_parser(load=[command] if command else [])
    args = parser.parse_args(argv)
    args.argv = list(argv)  # the words as given (generated files quote the command that made them)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    # SIGTERM stops a command the way Ctrl-C does (what it was writing rolled back, a message, exit
    # 143); train and verify handle both signals themselves (trainfit.train.monitor.safety).
    previous = _sigterm_as_interrupt() if command not in ("train", "verify") else None
    try:
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # a full disk behind `> file` shows here, not at interpreter exit
        return code
    except TrainfitError as exc:
        print(f"trainfit: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        print(f"trainfit: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("trainfit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _drop_stdout()
        return 0
    except OSError as exc:
        known = os_error_exit(exc)
        if known is None:
            raise
        code, message = known
        print(f"trainfit: error: {message}", file=sys.stderr)
        return code
    finally:
        if previous is not None:
            import signal

            signal.signal(signal.SIGTERM, previous)


def _sigterm_as_interrupt():
    """Install the SIGTERM handler; returns the one it replaced (None off the main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, raise_interrupted)


# OSErrors that are the machine's or the user's doing, not a bug: a full disk (exit 4, with what to
# do), a name the filesystem cannot hold or a place the user may not write (exit 2).
_USER_PATH = {errno.ENAMETOOLONG: ("a file name is too long for the filesystem", "each part of a path holds at most "
                                                                              "255 bytes"),
              errno.EACCES: ("permission denied", "give a path you may use"),
              errno.EPERM: ("operation not permitted", "give a path you may use"),
              errno.EROFS: ("read-only filesystem", "write somewhere else")}


def os_error_exit(exc: OSError) -> tuple[int, str] | None:
    """(exit code, one-line message) for an OSError a user can act on; None for any other."""
    where = f" ({_shown(exc.filename)})" if exc.filename else ""
    if exc.errno in _DISK_FULL:
        _drop_stdout()
        return EXIT_UNAVAILABLE, (f"no space left on the device{where}: free some space (or write elsewhere) "
                                  "and run the command again")
    if exc.errno in _USER_PATH:
        what, hint = _USER_PATH[exc.errno]
        return EXIT_BAD_INPUT, f"{what}{where}: {hint}"
    return None


def _shown(name: object) -> str:
    text = str(name)
    return text if len(text) <= 80 else text[:77] + "..."


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of what could not be written
    (a closed pipe, a full disk) raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests capture stdout)
        pass


if __name__ == "__main__":
    raise SystemExit(main())
