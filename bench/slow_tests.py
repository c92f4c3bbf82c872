"""The long end-to-end tests, run as a benchmark: what the default test run leaves out.

Run:  .venv/bin/python bench/slow_tests.py [--out DIR]   (also `make test-slow`, without the results)

Tests marked `slow` (multi-process gloo launches, kill-and-resume cycles, FSDP, multi-node, signal
handling through `trainfit train`) take tens of seconds each on two cores, so the default
`pytest` run deselects them to stay under ten minutes. They still have to pass: this script runs
them with pytest's JUnit report and writes each test's outcome and seconds to
bench/results/slow_tests.{json,md}. Exit status 1 when any failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from _results import write_results

HERE = Path(__file__).resolve().parent


def outcomes(junit_xml: Path) -> list[dict]:
    rows = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        rows.append({"test": f"{case.get('classname')}::{case.get('name')}",
                     "outcome": "failed" if failed else "skipped" if skipped else "passed",
                     "seconds": round(float(case.get("time") or 0.0), 1)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "slow.xml"
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "slow", f"--junitxml={junit}"],
                            cwd=HERE.parent).returncode
        wall_seconds = time.perf_counter() - t0
        rows = outcomes(junit) if junit.exists() else []
    failed = [r for r in rows if r["outcome"] == "failed"]
    doc = {"pytest_exit": rc, "wall_seconds": round(wall_seconds, 1), "cpus": os.cpu_count(),
           "load_average_1min_after": round(os.getloadavg()[0], 2), "tests": rows}
    lines = ["# The slow end-to-end tests", "",
             f"`pytest -m slow`: {sum(r['outcome'] == 'passed' for r in rows)} passed, "
             f"{sum(r['outcome'] == 'skipped' for r in rows)} skipped, {len(failed)} failed of {len(rows)} "
             f"in {wall_seconds:.0f} s on {os.cpu_count()} CPUs (exit {rc}).", "", "| test | outcome | s |", "|---|---|---:|"]
    lines += [f"| `{r['test']}` | {r['outcome']} | {r['seconds']} |" for r in sorted(rows, key=lambda r: -r["seconds"])]
    write_results(opts.out, "slow_tests", doc, "\n".join(lines) + "\n")
    return 1 if rc not in (0, 5) or failed else 0


if __name__ == "__main__":
    sys.exit(main())
