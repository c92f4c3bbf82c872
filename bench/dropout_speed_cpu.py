"""What the model's own dropout costs a CPU training step, timed against the same model without it.

GPT-2 configurations of bench/step_time_accuracy.py, each built twice from one seed: with GPT-2's
config dropout (0.1 on the residuals, the embeddings and the attention probabilities, which sends
SDPA down its math path on a CPU) and with none. The two variants are timed alternately, round after
round, so a slow spell of the VM hits both; the lower median per variant is kept. Predictions use
the rates a fresh machine measures (step_time_accuracy.machine_rates: the default CPU measurement,
now with the dropout rate, hardware.benchmark.cpu_dropout_ns_per_element), taken in the same run.

    .venv/bin/python bench/dropout_speed_cpu.py      # ~3 min, writes bench/results/dropout_speed_cpu.{json,md}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import step_time_accuracy as sta

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "dropout_speed_cpu"
PAIRS = [
    sta.row_config((256, 4, 8, 1024, 8192, 2, 256, "full", "fp32", "none"), "gpt2"),
    sta.row_config((512, 4, 8, 2048, 16384, 1, 256, "full", "fp32", "none"), "gpt2"),
    sta.row_config((256, 4, 8, 1024, 8192, 2, 256, "lora", "fp32", "full"), "gpt2"),
]
DROPOUT = 0.1


def run(steps: int, warmup: int, rounds: int) -> dict:
    profile, rates = sta.machine_rates()
    bench = profile.benchmark
    rows = []
    for base in PAIRS:
        with_dropout = dict(base, dropout=DROPOUT)
        medians: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(rounds):
            for key, cfg in (("off", base), ("on", with_dropout)):
                medians[key].append(sta.time_config(cfg, steps, warmup)[0])
        measured = {k: min(v) for k, v in medians.items()}
        predicted = {"off": sta.predict(base, rates), "on": sta.predict(with_dropout, rates)}
        extra_m, extra_p = measured["on"] - measured["off"], predicted["on"] - predicted["off"]
        row = dict(config=sta.describe(base), measured_ms={k: round(v * 1e3, 1) for k, v in measured.items()},
                   predicted_ms={k: round(v * 1e3, 1) for k, v in predicted.items()},
                   measured_extra_ms=round(extra_m * 1e3, 1), predicted_extra_ms=round(extra_p * 1e3, 1),
                   extra_ratio=round(extra_p / extra_m, 3) if extra_m > 0 else None,
                   error_off=round(predicted["off"] / measured["off"] - 1, 4),
                   error_on=round(predicted["on"] / measured["on"] - 1, 4))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return dict(rates=dict(fp32_gflops=bench.cpu_fp32_gflops if bench else None,
                           bandwidth_gbps=bench.memory_bandwidth_gbps if bench else None,
                           dropout_ns_per_element=bench.cpu_dropout_ns_per_element if bench else None),
                steps=steps, warmup=warmup, rounds=rounds, rows=rows)


def write(result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{NAME}.json").write_text(json.dumps(result, indent=2) + "\n")
    r = result["rates"]
    lines = ["# The model's own dropout on a CPU: timed with and without, against the predicted extra", "",
             f"Command: `.venv/bin/python bench/{NAME}.py` ({result['rounds']} alternating rounds of "
             f"{result['steps']} timed steps after {result['warmup']} warm-up; lower median per variant). "
             f"Rates measured in the same run: fp32 {r['fp32_gflops']} GFLOP/s, {r['bandwidth_gbps']} GB/s, "
             f"dropout {r['dropout_ns_per_element']} ns per element.", "",
             "| config (GPT-2, dropout 0.1 vs 0) | measured off / on ms | predicted off / on ms | measured extra ms "
             "| predicted extra ms | predicted / measured extra | error off | error on |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for x in result["rows"]:
        m, p = x["measured_ms"], x["predicted_ms"]
        lines.append(f"| {x['config']} | {m['off']} / {m['on']} | {p['off']} / {p['on']} | {x['measured_extra_ms']} "
                     f"| {x['predicted_extra_ms']} | {x['extra_ratio']} | {x['error_off']:+.1%} | {x['error_on']:+.1%} |")
    (RESULTS / f"{NAME}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    write(run(args.steps, args.warmup, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
