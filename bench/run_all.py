"""Run every benchmark in bench/ in turn (what `make bench` does).

Run:  .venv/bin/python bench/run_all.py [--quick] [--only NAME ...] [--skip NAME ...] [--list]

Each bench/*.py script runs as its own process with this interpreter, one after the other (so
that no two timings share the CPUs), and writes its own bench/results/<name>.{json,md}. The
short timing benchmarks go first, the long accuracy ones (minutes; they need the `train` extra)
after; a script added to bench/ later runs at the end without being listed here. One script
failing does not stop the others; the exit status is 1 when any failed.

--quick passes each script its own smoke-test arguments where it has them (see QUICK); some of
those write their results under /tmp rather than bench/results.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIRST = ["cli_latency", "estimate_speed", "plan_speed", "cloud_speed", "profile_bench",
         "memory_accuracy", "step_time_accuracy", "plan_quality", "trainer_overhead"]
QUICK = {
    "cli_latency": ["--runs", "3", "--wait", "60", "--out", os.path.join(tempfile.gettempdir(), "cli_latency_quick")],
    "memory_accuracy": ["--quick"],
    "step_time_accuracy": ["--quick"],
    "plan_quality": ["--quick"],
    "trainer_overhead": ["--rounds", "1", "--steps", "10"],
}


ON_REQUEST = ("cuda_memory", "cuda_speed",  # need a CUDA machine; see bench/README.md
              "litgpt_meta_trace",  # needs litgpt installed
              "launcher_parsers",  # installs skypilot / kubernetes into a venv of its own (needs the package index)
              "tool_exports")  # needs the tools' environments (make test-tools)


def scripts() -> list[str]:
    found = sorted(p.stem for p in HERE.glob("*.py") if p.stem != Path(__file__).stem and not p.stem.startswith("_"))
    return [n for n in FIRST if n in found] + [n for n in found if n not in FIRST]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke-test arguments where a script has them")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these (names without .py)")
    ap.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="leave these out")
    ap.add_argument("--list", action="store_true", help="print the scripts in the order they would run")
    opts = ap.parse_args()
    names = scripts()
    unknown = [n for n in (opts.only or []) + opts.skip if n not in names]
    if unknown:
        ap.error(f"no bench/{unknown[0]}.py (there are: {', '.join(names)})")
    # The CUDA grid runs real GPU steps for a long while: only when named (--only cuda_memory ...).
    names = [n for n in names if (n in opts.only if opts.only else n not in ON_REQUEST) and n not in opts.skip]
    if opts.list:
        print("\n".join(names))
        return 0
    summary = []
    for name in names:
        args = [sys.executable, str(HERE / f"{name}.py"), *(QUICK.get(name, []) if opts.quick else [])]
        print(f"=== bench/{name}.py {' '.join(args[2:])}".rstrip(), flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(args, cwd=HERE.parent).returncode
        summary.append((name, rc, time.perf_counter() - t0))
    print("\n=== summary")
    for name, rc, seconds in summary:
        print(f"{'ok  ' if rc == 0 else 'FAIL'} {name:22s} {seconds:7.1f} s" + (f"  (exit {rc})" if rc else ""))
    return 1 if any(rc for _, rc, _ in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
