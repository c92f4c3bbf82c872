"""The launch specs of `plan --launcher` through their engines' own parsers, in a venv of their own.

Run:  python3 bench/launcher_parsers.py [--venv DIR]      (what `make test-launchers` does)

Creates DIR (default: launcher-venv under the system temp folder) with `python3 -m venv`, installs
SkyPilot, the Kubernetes client and jsonschema with the project's constraints (no torch: the plan
and its specs need none) and trainfit's own light dependencies, then runs
tests/export/test_cluster_specs.py there with this checkout's sources first on the path, so the
tests that the default suite skips (SkyPilot's task loader, the PyTorchJob CRD schema, the
Kubernetes models) run. Writes bench/results/launcher_parsers.{json,md}: versions, install time,
the pytest outcome per test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _results import write_results  # noqa: E402

PACKAGES = ["skypilot==0.14.1", "kubernetes==37.0.2", "jsonschema", "pytest", "pyyaml", "psutil", "rich", "numpy",
            "huggingface_hub", "nvidia-ml-py"]
TESTS = "tests/export/test_cluster_specs.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=os.path.join(tempfile.gettempdir(), "launcher-venv"))
    opts = ap.parse_args()
    venv = Path(opts.venv)
    py = venv / "bin" / "python"
    started = time.monotonic()
    fresh = not py.exists()  # a fresh venv's install time is the one that decides "not a test dependency"
    if fresh:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c",
                    str(ROOT / "constraints.txt"), *PACKAGES], check=True)
    install_seconds = time.monotonic() - started
    versions = subprocess.run([str(py), "-c", "import sky, kubernetes, jsonschema; "
                               "print(sky.__version__, kubernetes.__version__, jsonschema.__version__)"],
                              check=True, capture_output=True, text=True).stdout.split()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([str(py), "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", TESTS], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    per_test = {name: outcome for outcome, name in re.findall(r"^(PASSED|FAILED|SKIPPED|ERROR) (\S+)", run.stdout,
                                                              re.MULTILINE)}
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    doc = {"skypilot": versions[0], "kubernetes": versions[1], "jsonschema": versions[2],
           "install_seconds": round(install_seconds, 1), "fresh_venv": fresh, "pytest_exit": run.returncode, "summary": summary,
           "tests": per_test}
    md = ["# Launch specs through their engines' parsers\n",
          f"`python3 bench/launcher_parsers.py`: skypilot {versions[0]}, kubernetes {versions[1]}, jsonschema "
          f"{versions[2]}; {'fresh ' if fresh else 'existing '}venv, install {install_seconds:.0f} s; pytest exit {run.returncode}: {summary}\n",
          "| test | outcome |", "|---|---|", *[f"| {k} | {v} |" for k, v in per_test.items()]]
    write_results(HERE / "results", "launcher_parsers", doc, "\n".join(md) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
