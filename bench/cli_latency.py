"""Wall time of the short commands, process start included, against `python -c "import trainfit"`.

Run:  .venv/bin/python bench/cli_latency.py [--runs 7] [--max-load 1.0] [--wait 300] [--src DIR]
Writes bench/results/cli_latency.md and .json (with --src: /tmp/cli_latency_<name>.*, for a
before/after comparison against another checkout, e.g. `git archive HEAD src | tar -x -C /tmp/x`).

Targets (issue "Speed of the commands"): estimate, models show, gpus, profile and analyze (no
--benchmark) under 0.3 s each; cloud under 0.5 s; --help instant (here: under 0.1 s).

Each command runs as a subprocess with this interpreter: one warm-up run, then `--runs` timed runs
(the median is the figure; min and max are kept). The runs see the package as an installed one
does: bytecode cached (in a temporary PYTHONPYCACHEPREFIX, so nothing is written into the source
tree, and PYTHONDONTWRITEBYTECODE is dropped) and trainfit's cache filled (a temporary
XDG_CACHE_HOME: parsed catalogs, trainfit/yaml_io.py, and the disk speed measured within the day,
hardware/storage.py). Three more runs per command start with an empty cache: the first run after
an install or a catalog change, which also measures the disk (the "cold" column). The baseline,
`python -c "import trainfit"`, runs interleaved with the commands so that both see the same load;
the ratio is command / baseline. Timings depend on load: the script waits (up to --wait seconds)
for the 1-minute load average to fall under --max-load and records the load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
INSTANT_S = 0.1
# (label, trainfit arguments, target seconds, exit codes that are answers)
COMMANDS = [
    ("--help", ["--help"], INSTANT_S, (0,)),
    ("estimate", ["estimate", "llama-3.2-1b", "--json"], 0.3, (0, 3)),  # 3: does not fit here, an answer
    ("models show", ["models", "show", "llama-3.2-1b"], 0.3, (0,)),
    ("gpus", ["gpus"], 0.3, (0,)),
    ("profile", ["profile"], 0.3, (0,)),
    ("analyze", ["analyze"], 0.3, (0,)),
    ("cloud", ["cloud", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--examples", "10000", "--seq-len", "1024"],
     0.5, (0, 3)),
    # No target: where profile's and analyze's time goes (the 64 MiB disk test; the planning).
    ("profile --quick", ["profile", "--quick"], None, (0,)),
    ("analyze --profile-only", ["analyze", "--profile-only"], None, (0,)),
]
BASELINE = ["-c", "import trainfit"]
NOTES = [
    "Reading the diagnostic rows: `profile` = `profile --quick` + the storage probe, whose 64 MiB write, "
    "fsync and read (hardware/storage.py) runs in the cold column only: a filesystem's speed measured within "
    "the day is reused, with the time it was measured. `analyze` = `analyze --profile-only` + the planner's "
    "search (pretraining on this machine: three modes, the model size bisected along the ladder, core/plan). "
    "`gpus` spends most of its time rendering the rich table (one cell per GPU and column).",
]


def _env(pycache: str, xdg_cache: str, src: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env.update(PYTHONPYCACHEPREFIX=pycache, XDG_CACHE_HOME=xdg_cache)
    env.pop("COLUMNS", None)  # piped output: the CLI's own default width
    if src:
        env["PYTHONPATH"] = src
    return env


def _time(args: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    return time.perf_counter() - t0, done.returncode, done.stderr


def _wait_for_quiet(max_load: float, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= max_load:
        if time.monotonic() >= deadline:
            return False
        time.sleep(5)
    return True


def measure(runs: int, src: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="trainfit-bench-") as tmp:
        xdg = os.path.join(tmp, "xdg")
        env = _env(os.path.join(tmp, "pycache"), xdg, src)
        probe = subprocess.run([sys.executable, "-c", "import trainfit, os; print(os.path.dirname(trainfit.__file__))"],
                               capture_output=True, text=True, env=env, check=True).stdout.strip()
        if src and not Path(probe).resolve().is_relative_to(Path(src).resolve()):
            raise SystemExit(f"--src {src}: the subprocess imported trainfit from elsewhere")
        _time(BASELINE, env)
        base_walls: list[float] = []
        rows = []
        for label, argv, target, answers in COMMANDS:
            args = ["-m", "trainfit", *argv]
            _, rc, err = _time(args, env)  # warm-up: bytecode and catalog cache
            if rc not in answers:
                raise SystemExit(f"trainfit {' '.join(argv)} exited {rc}: {err.strip()[-500:]}")
            cold = []
            for _ in range(3):
                shutil.rmtree(xdg, ignore_errors=True)
                cold.append(_time(args, env)[0])
            walls = []
            for _ in range(runs):
                base_walls.append(_time(BASELINE, env)[0])
                wall, rc, err = _time(args, env)
                if rc not in answers:
                    raise SystemExit(f"trainfit {' '.join(argv)} exited {rc}: {err.strip()[-500:]}")
                walls.append(wall)
            rows.append({"command": label, "argv": ["trainfit", *argv], "target_s": target,
                         "median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
                         "walls_s": walls, "cold_cache_median_s": statistics.median(cold), "exit_code": rc})
    base = statistics.median(base_walls)
    for row in rows:
        row["ratio_to_import"] = row["median_s"] / base
        row["pass"] = None if row["target_s"] is None else row["median_s"] < row["target_s"]
    return {"baseline": {"command": 'python -c "import trainfit"', "median_s": base, "min_s": min(base_walls),
                         "max_s": max(base_walls), "runs": len(base_walls)},
            "commands": rows}


def _versions() -> dict[str, str]:
    import yaml

    return {"python": platform.python_version(), "implementation": platform.python_implementation(),
            "platform": platform.platform(), "machine": platform.machine(), "cpus": str(os.cpu_count()),
            "pyyaml": f"{yaml.__version__} (libyaml: {'yes' if getattr(yaml, '__with_libyaml__', False) else 'no'})"}


def _markdown(doc: dict, command: str) -> str:
    v, load = doc["versions"], doc["load_average_start"]
    lines = ["# CLI latency", "",
             f"Command: `{command}` (Python {v['python']} on {v['platform']}, {v['cpus']} CPUs, PyYAML {v['pyyaml']}).  ",
             f"Load average (1/5/15 min) {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start, "
             f"{doc['load_average_end'][0]:.2f} at the end"
             + (" (other jobs were running: re-run on a quiet machine)." if load[0] >= doc["max_load"] else
                " (a quiet machine)."), "",
             f"Median of {doc['runs']} runs after a warm-up, process start included; bytecode and catalog cache warm. "
             f"Baseline `{doc['baseline']['command']}`: {doc['baseline']['median_s'] * 1000:.0f} ms (median of "
             f"{doc['baseline']['runs']}, interleaved with the commands). Cold: median of 3 runs with an empty "
             "cache (the first run after an install or a catalog edit; it also measures the disk).", "",
             "| command | median s | min s | max s | x import | cold s | target s | |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in doc["commands"]:
        target, verdict = ("-", "(diagnostic)") if r["target_s"] is None else (
            f"< {r['target_s']:g}", "pass" if r["pass"] else "FAIL")
        lines.append(f"| `{' '.join(r['argv'])}` | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | "
                     f"{r['ratio_to_import']:.1f} | {r['cold_cache_median_s']:.3f} | {target} | {verdict} |")
    return "\n".join([*lines, "", *NOTES]) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed runs per command (default 7)")
    ap.add_argument("--max-load", type=float, default=1.0, help="wait for the 1-min load average to fall under this")
    ap.add_argument("--wait", type=float, default=300, help="seconds to wait for that (0: start at once)")
    ap.add_argument("--src", help="benchmark the trainfit package in this directory (a checkout's src/) instead")
    ap.add_argument("--out", help="output prefix (default bench/results/cli_latency; with --src /tmp/cli_latency_src)")
    opts = ap.parse_args()
    quiet = _wait_for_quiet(opts.max_load, opts.wait)
    load_start = os.getloadavg()
    doc = {"runs": opts.runs, "max_load": opts.max_load, "quiet_at_start": quiet, "load_average_start": load_start,
           "versions": _versions(), "source": "another checkout (--src)" if opts.src else "this checkout"}
    doc.update(measure(opts.runs, opts.src))
    doc["load_average_end"] = os.getloadavg()
    doc["all_pass"] = all(r["pass"] is not False for r in doc["commands"])
    paths = {opts.src: "DIR", opts.out: "OUT"}  # no paths of this machine in the results
    command = " ".join([".venv/bin/python", "bench/cli_latency.py", *(paths.get(a, a) for a in sys.argv[1:])])
    out = Path(opts.out) if opts.out else (Path(tempfile.gettempdir()) / "cli_latency_src" if opts.src
                                           else RESULTS / "cli_latency")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    text = _markdown(doc, command)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
