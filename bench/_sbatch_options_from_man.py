"""Regenerate tests/export/data/sbatch_options.txt: every long option sbatch documents, from its man page.

    python bench/_sbatch_options_from_man.py SBATCH_1_FILE COMMIT

SBATCH_1_FILE: doc/man/man1/sbatch.1 of the Slurm source (https://github.com/SchedMD/slurm), the
page published as https://slurm.schedmd.com/sbatch.html. An option is a `.TP` paragraph whose
first line names it (`\\fB\\-\\-name\\fR`, then `=` when it takes a value, `[=` when the value is
optional). The tests parse the #SBATCH lines trainfit writes against this list.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "export" / "data" / "sbatch_options.txt"


def documented_options(man_text: str) -> dict[str, str]:
    lines = man_text.splitlines()
    options: dict[str, str] = {}
    for i, line in enumerate(lines[:-1]):
        if line.strip() != ".TP":
            continue
        head = lines[i + 1].replace("\\-", "-")
        for m in re.finditer(r"\\fB--([a-z0-9][a-z0-9-]*)\\fR(\[?=)?", head):
            value = "none" if not m.group(2) else "optional" if m.group(2).startswith("[") else "required"
            options.setdefault(m.group(1), value)
    return options


def main(argv: list[str]) -> int:
    man, commit = Path(argv[0]), argv[1]
    options = documented_options(man.read_text(encoding="utf-8", errors="replace"))
    head = ["# sbatch's documented long options: NAME VALUE (required | optional | none)",
            "# source: the sbatch man page, https://slurm.schedmd.com/sbatch.html, as doc/man/man1/sbatch.1 of",
            f"# https://github.com/SchedMD/slurm at commit {commit} (read 2026-11-28)",
            "# regenerate: python bench/_sbatch_options_from_man.py sbatch.1 COMMIT"]
    OUT.write_text("\n".join(head + [f"{k} {v}" for k, v in sorted(options.items())]) + "\n", encoding="utf-8")
    print(f"{len(options)} options -> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
