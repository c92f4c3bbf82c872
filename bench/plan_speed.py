"""How fast the planner answers: all three modes in-process, and `trainfit plan` / `analyze` wall time.

Run:  .venv/bin/python bench/plan_speed.py
Writes bench/results/plan_speed.md and .json. Targets (issue: planner): three modes for one model
and machine < 100 ms in-process; `trainfit plan` and `trainfit analyze` < 1 s wall. Timings depend
on load: the file records the CPU count and the load average before each part.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.catalog import resolve_model
from trainfit.core.plan.planner import PlanRequest, plan

RESULTS = Path(__file__).resolve().parent / "results"
# (label, model, method, hardware, seq_len): one per kind of search the planner does.
CASES = [
    ("7B LoRA on one A10G", "Qwen/Qwen2.5-7B-Instruct", "lora", "a10g", 1024),
    ("0.5B DPO on an M2 16 GB", "Qwen/Qwen2-0.5B-Instruct", "dpo", "m2-16gb", None),
    ("2B full on 2x RTX 4090 (ZeRO/offload tiers)", "Qwen/Qwen2-VL-2B-Instruct", "full", "2x rtx-4090", 1024),
    ("32B full on 4x A100-80GB", "Qwen/Qwen2.5-32B", "full", "4x a100-80gb", 1024),
    ("8B auto on an RTX 3060 (falls to QLoRA)", "meta-llama/Meta-Llama-3-8B", "auto", "rtx-3060", 512),
    ("pretraining, size chosen, on a CPU", None, "pretrain", "cpu", None),
]
CLI = [
    ("trainfit plan (7B LoRA, a10g)", ["plan", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--hardware", "a10g",
                                       "--examples", "10000", "--seq-len", "1024", "--json"]),
    ("trainfit analyze --hardware rtx-4090", ["analyze", "--hardware", "rtx-4090", "--json"]),
    ("trainfit analyze (this machine)", ["analyze", "--json"]),
]


def in_process(rounds: int = 15) -> list[dict]:
    rows = []
    for label, model_id, method, hw_name, seq in CASES:
        hw = resolve_hardware(hw_name)
        model = resolve_model(model_id) if model_id else None
        req = PlanRequest(hardware=hw, method=method, model=model, seq_len=seq, examples=10000)
        result = plan(req)  # warm caches (catalog, per-model stats), as a long-lived process would be
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            plan(req)
            times.append(time.perf_counter() - t0)
        rows.append({"case": label, "median_ms": statistics.median(times) * 1000, "max_ms": max(times) * 1000,
                     "evaluated": sum(m.candidates_evaluated for m in result.modes),
                     "fits": [m.fits for m in result.modes]})
    return rows


def cli(rounds: int = 5) -> list[dict]:
    rows = []
    for label, args in CLI:
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if done.returncode not in (0, 3):
                raise SystemExit(f"{label} failed: {done.stderr}")
        rows.append({"command": label, "median_s": statistics.median(times), "min_s": min(times),
                     "max_s": max(times)})
    return rows


def main() -> None:
    load_before = os.getloadavg()[0]
    planner = in_process()
    load_cli = os.getloadavg()[0]
    commands = cli()
    data = {"cpus": os.cpu_count(), "load_before": load_before, "load_before_cli": load_cli,
            "in_process": planner, "cli": commands}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "plan_speed.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = ["# Planner speed", "",
             f"Command: `.venv/bin/python bench/plan_speed.py` ({os.cpu_count()} CPUs; load average "
             f"{load_before:.2f} before the in-process part, {load_cli:.2f} before the CLI part).", "",
             "All three modes planned in one `plan()` call (median of 15 after a warm-up call; no trial runs: "
             "memory and speed come from the models).", "",
             "| case | median ms | max ms | setups evaluated (3 modes) | fits (c/b/e) |", "|---|---:|---:|---:|---|"]
    for r in planner:
        lines.append(f"| {r['case']} | {r['median_ms']:.1f} | {r['max_ms']:.1f} | {r['evaluated']} | "
                     f"{'/'.join('y' if f else 'n' for f in r['fits'])} |")
    lines += ["", "Wall time of the command, process start included (median of 5):", "",
              "| command | median s | min s | max s |", "|---|---:|---:|---:|"]
    for r in commands:
        lines.append(f"| {r['command']} | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} |")
    (RESULTS / "plan_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
