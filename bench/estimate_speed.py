"""Cost of one memory estimate in-process, and the wall time of `trainfit estimate ... --json`.

Run:  .venv/bin/python bench/estimate_speed.py
Writes bench/results/estimate_speed.md and .json. Timings depend on machine load: re-run on a
quiet machine for publishable figures (the file records the CPU count and load average).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trainfit.core.memory import estimate_memory
from trainfit.core.models.catalog import get_model
from trainfit.core.setup import LoraSettings, TrainingSetup

RESULTS = Path(__file__).resolve().parent / "results"
SETUPS = {
    "full bf16-mixed": TrainingSetup(micro_batch=4, seq_len=2048),
    "lora": TrainingSetup(method="lora", lora=LoraSettings(), seq_len=2048),
    "qlora nf4-dq": TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16", lora=LoraSettings()),
    "zero-3 8 GPUs": TrainingSetup(zero_stage=3, num_gpus=8, seq_len=4096),
    "inference": TrainingSetup(method="inference", generate_tokens=256, micro_batch=8),
}
CLI = ["Qwen/Qwen2.5-7B", "--method", "lora", "--hardware", "a10g", "--json"]


def in_process(n: int = 2000) -> dict[str, float]:
    model = get_model("meta-llama/Llama-3.1-8B")
    out = {}
    for name, setup in SETUPS.items():
        estimate_memory(model, setup)  # warm the per-model cache, as the planner would
        t0 = time.perf_counter()
        for _ in range(n):
            estimate_memory(model, setup)
        out[name] = (time.perf_counter() - t0) / n * 1e3
    return out


def cli_wall(runs: int = 5) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "trainfit", "estimate", *CLI], capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    load = os.getloadavg()[0]  # before the runs: above ~0.5 on 2 cores means other jobs ran too
    per = in_process()
    wall = cli_wall()
    doc = dict(ms_per_estimate=per, cli_command="trainfit estimate " + " ".join(CLI),
               cli_wall_seconds=wall, cli_wall_median_seconds=statistics.median(wall),
               cpus=os.cpu_count(), load_average=os.getloadavg())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "estimate_speed.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = ["# Memory estimate speed", "", "Command: `.venv/bin/python bench/estimate_speed.py` "
             f"({os.cpu_count()} CPUs, load average {load:.2f} before the runs"
             + (": other jobs were running, re-run on a quiet machine)." if load > 0.5 else ", a quiet machine).")
             , "",
             "| setup (Llama-3.1-8B) | ms per estimate_memory call |", "|---|---:|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in per.items()]
    lines += ["", f"`{doc['cli_command']}`: median wall {doc['cli_wall_median_seconds']:.2f} s over "
              f"{len(wall)} runs (min {min(wall):.2f} s, max {max(wall):.2f} s), process start included."]
    (RESULTS / "estimate_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
