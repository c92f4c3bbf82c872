"""Wall time of `trainfit profile --json` (median of 5 subprocess runs) and of
`trainfit profile --json --benchmark` (one run), with the figures the benchmark measured.

Targets: profile --json < 1.5 s median; --benchmark < 30 s.
Writes bench/results/profile.json and bench/results/profile.md. Re-run on a quiet machine:
    .venv/bin/python bench/profile_bench.py
Timings taken while other jobs use the CPUs are noisy; the script records the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def timed(args: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    return time.perf_counter() - t0, json.loads(done.stdout)


def main() -> None:
    load_before = os.getloadavg()[0]
    runs = [timed(["profile", "--json"])[0] for _ in range(5)]
    bench_s, doc = timed(["profile", "--json", "--benchmark"])
    b = doc["benchmark"]
    result = {
        "machine": {"cpu": doc["cpu"]["model"], "logical_cores": doc["cpu"]["logical_cores"],
                    "ram_bytes": doc["memory"]["total_bytes"], "gpus": [g["name"] for g in doc["gpus"]]},
        "load_average_1min_before": round(load_before, 2),
        "profile_json_seconds": {"runs": [round(r, 3) for r in runs], "median": round(statistics.median(runs), 3),
                                 "target": 1.5},
        "profile_benchmark_seconds": {"wall": round(bench_s, 2), "inside_benchmark": b["seconds"], "target": 30},
        "probe_seconds": doc["probe_seconds"],
        "measured": {k: b[k] for k in ("memory_bandwidth_gbps", "cpu_fp32_gflops", "cpu_bf16_gflops",
                                       "gpu_tflops", "gpu_bandwidth_gbps", "disk_read_mbps", "disk_write_mbps")},
        "default_profile_disk_mbps": {"read": doc["storage"][0]["read_mbps"], "write": doc["storage"][0]["write_mbps"]},
        "unavailable": b["unavailable"],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "profile.json").write_text(json.dumps(result, indent=2) + "\n")
    med = result["profile_json_seconds"]["median"]
    m = result["measured"]
    lines = [
        "# trainfit profile: wall time and measured figures",
        "",
        f"Machine: {result['machine']['cpu']}, {result['machine']['logical_cores']} logical cores, "
        f"{result['machine']['ram_bytes'] / 2**30:.1f} GiB RAM, GPUs: {result['machine']['gpus'] or 'none'}.",
        f"1-minute load average before the runs: {load_before:.2f} (above ~0.5 on this 2-core machine means "
        "other jobs were running and the timings are noisy).",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| `trainfit profile --json` wall, median of 5 | {med:.2f} s (runs {', '.join(f'{r:.2f}' for r in runs)}) | < 1.5 s |",
        f"| `trainfit profile --json --benchmark` wall | {bench_s:.1f} s (benchmark part {b['seconds']:.1f} s) | < 30 s |",
        f"| RAM bandwidth (numpy copy, read+write) | {m['memory_bandwidth_gbps']} GB/s | |",
        f"| CPU matmul fp32 (numpy 2048^2) | {m['cpu_fp32_gflops']} GFLOP/s | |",
        f"| CPU matmul bf16 (torch 2048^2) | {m['cpu_bf16_gflops']} GFLOP/s | |",
        f"| Disk sequential 512 MiB read / write | {m['disk_read_mbps']} / {m['disk_write_mbps']} MB/s | |",
        f"| Disk sequential 64 MiB (default profile) read / write | {result['default_profile_disk_mbps']['read']} / "
        f"{result['default_profile_disk_mbps']['write']} MB/s | |",
        "",
        "Reproduce: `.venv/bin/python bench/profile_bench.py` (writes this file and profile.json).",
    ]
    (RESULTS / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
