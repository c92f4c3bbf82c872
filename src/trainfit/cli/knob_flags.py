"""The command-line flags of the declared knobs (trainfit.core.knobs), generated, and the way back
from parsed flags to knob values.

Everyday knobs are shown by `--help`; advanced and runtime ones by `--help-all`. Runtime knobs are
also `--runtime KEY=VALUE`; their own flags still parse (hidden), so existing scripts keep working.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainfit.core.knobs import KNOBS, Knob, knobs_for, parse_runtime
from trainfit.validate import arg


def shown(knob_level: str, front: str, show_all: bool) -> bool:
    return show_all or front != "estimate" or knob_level == "everyday"


def add_knob_flags(p: argparse.ArgumentParser, front: str, *, show_all: bool = False,
                   only: tuple[str, ...] | None = None) -> None:
    """One flag per knob the front end shows (`only`: these knob names, in table order)."""
    for k in knobs_for(front):
        if only is not None and k.name not in only:
            continue
        p.add_argument(k.flag, **_flag_kwargs(k, front, shown(k.level, front, show_all)))


def _flag_kwargs(k: Knob, front: str, visible: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"default": k.default_for(front),
                          "help": k.help_for(front) if visible else argparse.SUPPRESS}
    if k.kind == "bool":
        kw["action"] = "store_true"
    elif k.choices:
        kw["choices"] = k.choices
    elif k.range is not None:
        kw["type"] = arg(k.name, k.range)
        kw["metavar"] = "N"
    if k.metavar:
        kw["metavar"] = k.metavar
    return kw


def add_runtime_flag(p: argparse.ArgumentParser) -> None:
    names = ", ".join(k.name for k in KNOBS if k.level == "runtime")
    p.add_argument("--runtime", action="append", metavar="KEY=VALUE",
                   help=f"how another tool's runtime behaves, where tools differ (repeatable; see --help-all): {names}")


def knob_values(args: argparse.Namespace, front: str) -> dict[str, Any]:
    """The parsed flags as {knob name: value}, with `--runtime KEY=VALUE` over the flags' defaults.
    A malformed --runtime is a BadInputError (exit 2) naming the key and the valid values."""
    from trainfit.errors import BadInputError

    values = {k.name: getattr(args, k.dest) for k in knobs_for(front) if hasattr(args, k.dest)}
    try:
        values.update(parse_runtime(getattr(args, "runtime", None)))
    except ValueError as exc:
        raise BadInputError(f"--runtime {exc}") from None
    return values


def wording(args: argparse.Namespace):
    """How a message names a knob: `--runtime KEY` where the user gave it so, else its flag."""
    from trainfit.core.knobs import flag_of

    given = {item.partition("=")[0].strip().replace("-", "_") for item in getattr(args, "runtime", None) or []}
    return lambda name: f"--runtime {name}" if name in given else flag_of(name)


class HelpAll(argparse.Action):
    """`--help-all`: the help with every flag, then the knob table."""

    def __init__(self, option_strings, dest, add_all=None, **kwargs):
        self.add_all = add_all
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from trainfit.core.knobs import markdown_table

        full = argparse.ArgumentParser(prog=parser.prog, description=parser.description)
        self.add_all(full)
        full.print_help()
        print("\nknobs (flag, run-config key, valid values, default, level; runtime knobs: --runtime KEY=VALUE):")
        print(markdown_table("estimate"))
        parser.exit(0)


START, END = "<!-- knobs:start -->", "<!-- knobs:end -->"


def with_knob_table(readme: str) -> str:
    """`readme` with the generated knob table between its markers (tests/memory/test_knob_table.py)."""
    from trainfit.core.knobs import markdown_table

    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{markdown_table('estimate')}\n{END}{tail}"


if __name__ == "__main__":  # python -m trainfit.cli.knob_flags README.md: regenerate the README's table
    import sys
    from pathlib import Path

    from trainfit.files import write_atomic

    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    write_atomic(path, with_knob_table(path.read_text()))
