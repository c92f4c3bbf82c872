"""Step-time model vs timed training steps on this CPU.

Builds small Llama-shaped models from configs (random weights, no hub), times real training
steps (forward + backward + AdamW step + zero_grad) with torch threads = the usable cores, and
compares the median with `trainfit.core.speed.predict_step` for device "cpu" on this machine's
profile (`build_profile(benchmark=True)`: measured matmul GFLOP/s and memory bandwidth).

    .venv/bin/python bench/step_time_accuracy.py            # ~3.5 min, writes bench/results/step_time_accuracy.{json,md}
    .venv/bin/python bench/step_time_accuracy.py --large    # + 2 Qwen2.5-0.5B-wide shapes (~2 min, ~13 GB RAM)
    .venv/bin/python bench/step_time_accuracy.py --quick    # 8 configurations, for a smoke test
    .venv/bin/python bench/step_time_accuracy.py --calibrate  # also fit the FITTED CPU constants on the
                                                              # even configurations, report on the odd
    .venv/bin/python bench/step_time_accuracy.py --from bench/results/step_time_accuracy.json --out /tmp/x
                                                    # re-predict stored timings (no timing run)

Timings are only meaningful on a quiet machine: the load average before and after is recorded;
re-run it when nothing else runs. Even then this VM has slow spells (the matmul rate drops by up
to a third for seconds), hence several rounds and the lower median per configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainfit.core.model_spec import ModelSpec  # noqa: E402
from trainfit.core.setup import LoraSettings, TrainingSetup  # noqa: E402
from trainfit.core.speed import DeviceRates, cpu_rates, predict_step  # noqa: E402

# (hidden, layers, heads, ffn, vocab, micro_batch, seq, method, precision, checkpointing)
CONFIGS = [
    (64, 2, 4, 172, 2048, 1, 64, "full", "fp32", "none"),
    (64, 2, 4, 172, 2048, 4, 128, "full", "fp32", "none"),
    (128, 2, 4, 344, 4096, 2, 128, "full", "fp32", "none"),
    (128, 4, 4, 344, 4096, 4, 256, "full", "fp32", "none"),
    (128, 4, 4, 344, 4096, 4, 256, "full", "fp32", "full"),
    (256, 2, 8, 688, 8192, 1, 128, "full", "fp32", "none"),
    (256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"),
    (256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "full"),
    (256, 4, 8, 688, 8192, 4, 128, "full", "bf16-mixed", "none"),
    (256, 4, 8, 688, 8192, 2, 256, "full", "bf16-mixed", "full"),
    (384, 4, 6, 1032, 8192, 2, 256, "full", "fp32", "none"),
    (384, 4, 6, 1032, 8192, 4, 256, "full", "bf16-mixed", "none"),
    (512, 4, 8, 1376, 16384, 1, 256, "full", "fp32", "none"),
    (512, 4, 8, 1376, 16384, 2, 256, "full", "fp32", "full"),
    (512, 4, 8, 1376, 16384, 2, 128, "full", "bf16-mixed", "none"),
    (128, 4, 4, 344, 4096, 4, 256, "lora", "fp32", "none"),
    (256, 4, 8, 688, 8192, 2, 256, "lora", "fp32", "none"),
    (256, 4, 8, 688, 8192, 2, 256, "lora", "fp32", "full"),
    (256, 4, 8, 688, 8192, 4, 128, "lora", "bf16-mixed", "none"),
    (384, 4, 6, 1032, 8192, 2, 256, "lora", "fp32", "none"),
    (512, 4, 8, 1376, 16384, 2, 256, "lora", "fp32", "none"),
    (512, 4, 8, 1376, 16384, 2, 256, "lora", "bf16-mixed", "full"),
    (768, 4, 12, 2048, 16384, 1, 256, "full", "fp32", "none"),
    (768, 4, 12, 2048, 16384, 2, 256, "lora", "fp32", "none"),
]
# Out-of-sample shapes (--large): Qwen2.5-0.5B widths and vocabulary, 8 layers, untied.
LARGE = [
    (896, 8, 14, 4864, 151936, 1, 512, "full", "fp32", "none"),
    (896, 8, 14, 4864, 151936, 2, 512, "lora", "fp32", "none"),
]
LORA = LoraSettings(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def spec_for(h: int, layers: int, heads: int, ffn: int, vocab: int) -> ModelSpec:
    return ModelSpec(
        id=f"bench-llama-h{h}-l{layers}", architecture="llama", vocab_size=vocab, hidden_size=h,
        num_layers=layers, num_heads=heads, num_kv_heads=heads, head_dim=h // heads,
        intermediate_size=ffn, activation="silu", gated_mlp=True, tie_embeddings=False, position="rope",
        max_position_embeddings=4096, norm="rmsnorm", qkv_bias=False, o_bias=False, mlp_bias=False,
        lm_head_bias=False, stored_dtype="float32", source="bench",
    )  # fmt: skip


def setup_for(cfg) -> TrainingSetup:
    h, layers, heads, ffn, vocab, mb, seq, method, precision, ckpt = cfg
    return TrainingSetup(
        method=method, precision=precision, micro_batch=mb, seq_len=seq, grad_checkpointing=ckpt,
        attention="sdpa", lora=LORA if method == "lora" else None, device="cpu",
    )  # fmt: skip


def time_config(cfg, steps: int, warmup: int) -> tuple[float, float]:
    """Median seconds of one training step (fwd + bwd + AdamW + zero_grad) and of its optimizer part."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    h, layers, heads, ffn, vocab, mb, seq, method, precision, ckpt = cfg
    torch.manual_seed(0)
    conf = LlamaConfig(
        vocab_size=vocab, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=ffn, max_position_embeddings=4096,
        tie_word_embeddings=False, attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(conf)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA.rank, lora_alpha=LORA.alpha, lora_dropout=0.0,
                                                 target_modules=list(LORA.target_modules)))  # fmt: skip
    if ckpt == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if method == "lora":
            model.enable_input_require_grads()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, vocab, (mb, seq))
    times, opt_times = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            t2 = time.perf_counter()
            times.append(t2 - t0)
            opt_times.append(t2 - t1)
    return statistics.median(times), statistics.median(opt_times)


def machine_rates():
    """Rates from the best of two benchmarked profiles: a peak is a best-of figure, and a single
    profile taken while the host VM is briefly slowed can read a matmul rate half the true one."""
    from trainfit.hardware.profiler import build_profile

    profiles = [build_profile(benchmark=True, quick=False) for _ in range(2)]
    best = {}
    for name in ("cpu_fp32_gflops", "cpu_bf16_gflops", "memory_bandwidth_gbps"):
        values = [getattr(p.benchmark, name) for p in profiles if p.benchmark and getattr(p.benchmark, name)]
        best[name] = max(values) if values else None
    profile = profiles[0]
    if profile.benchmark:
        profile = dataclasses.replace(profile, benchmark=dataclasses.replace(profile.benchmark, **best))
    return profile, cpu_rates(profile)


def predict(cfg, rates) -> float:
    return predict_step(spec_for(*cfg[:5]), setup_for(cfg), rates).step_seconds


# The CPU model's constants the calibration may scale (trainfit.core.speed.cpu); the others
# (first-touch cost, mmap threshold, AdamW kernel and byte counts) are measured or counted.
FITTED = ("CPU_GEMM_CEILING", "CPU_ATTENTION_CEILING", "CPU_ELEMENTWISE_BANDWIDTH_FACTOR", "CPU_OP_SECONDS",
          "CPU_PARTLY_FRESH_FRACTION")
PRIOR_WEIGHT = 0.5


def _scaled(value, factor: float):
    return {k: v * factor for k, v in value.items()} if isinstance(value, dict) else value * factor


def apply_constants(values: dict) -> None:
    """Set CPU-model constants (as `calibrate` returns them) for the predictions that follow."""
    from trainfit.core.speed import cpu

    for name, value in values.items():
        setattr(cpu, name, value)


def calibrate(rows: list[dict], rates) -> dict:
    """Fit scale factors of the FITTED constants on the even rows (coordinate descent on the mean
    |log(predicted / measured)|); the odd rows stay held out. Returns the fitted values."""
    import math

    from trainfit.core.speed import cpu

    train = rows[0::2]
    start = {name: getattr(cpu, name) for name in FITTED}
    factors = {name: 1.0 for name in FITTED}

    def loss(f: dict) -> float:
        # Mean |log error| on the training rows plus a pull towards the micro-benchmarked values
        # (PRIOR_WEIGHT x log(factor)^2), so noisy rows cannot trade one term off against another.
        apply_constants({n: _scaled(start[n], f[n]) for n in FITTED})
        fit = statistics.fmean(abs(math.log(predict(r["config"], rates) / r["measured_seconds"])) for r in train)
        return fit + PRIOR_WEIGHT * sum(math.log(x) ** 2 for x in f.values())

    best = loss(factors)
    for step in (1.5, 1.2, 1.07, 1.02):
        improved = True
        while improved:
            improved = False
            for name in FITTED:
                for mult in (step, 1 / step):
                    trial = {**factors, name: factors[name] * mult}
                    if name == "CPU_PARTLY_FRESH_FRACTION" and trial[name] * start[name] > 1.0:
                        continue  # a fraction of the tensors
                    value = loss(trial)
                    if value < best - 1e-6:
                        best, factors, improved = value, trial, True
    fitted = {n: _scaled(start[n], factors[n]) for n in FITTED}
    apply_constants(fitted)
    return {n: ({k: round(v, 3) for k, v in x.items()} if isinstance(x, dict) else float(f"{x:.3g}"))
            for n, x in fitted.items()}


def run_timings(configs, steps: int, warmup: int, rounds: int) -> tuple[list[dict], DeviceRates, dict]:
    """Profile the machine (measured rates), then time every configuration."""
    import torch

    load_before = os.getloadavg()  # before anything of ours runs: what else loads the machine
    profile, rates = machine_rates()
    threads = max(1, int(profile.cpu.usable_cores))
    torch.set_num_threads(threads)
    # Each configuration is timed in `rounds` rounds (every other round in reverse order, a fresh
    # model each time) and the round with the lower median step kept: the host VM has slow spells
    # of several seconds (matmul rate down by up to a third) that one round can fall into.
    best: dict[int, tuple[float, float]] = {}
    for r in range(rounds):
        order = list(range(len(configs)))[:: -1 if r % 2 else 1]
        for i in order:
            step, opt = time_config(configs[i], steps, warmup)
            if i not in best or step < best[i][0]:
                best[i] = (step, opt)
            print(f"round {r + 1} {configs[i]}  measured {step * 1e3:8.1f} ms (optimizer {opt * 1e3:.1f})", flush=True)
    rows = [{"config": list(cfg), "measured_seconds": best[i][0], "measured_optimizer_seconds": best[i][1]}
            for i, cfg in enumerate(configs)]
    bench = profile.benchmark
    return rows, rates, {
        "threads": threads,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu": profile.cpu.model,
        "measured_fp32_gflops": bench.cpu_fp32_gflops if bench else None,
        "measured_bf16_gflops": bench.cpu_bf16_gflops if bench else None,
        "measured_bandwidth_gbps": bench.memory_bandwidth_gbps if bench else None,
    }


def predicted_terms(cfg, rates) -> dict:
    """The CPU model's terms for one configuration, in ms (where a prediction misses)."""
    from trainfit.core.speed.cpu import cpu_step
    from trainfit.core.speed.flops import step_flops
    from trainfit.core.speed.rates import compute_precision

    spec, setup = spec_for(*cfg[:5]), setup_for(cfg)
    precision = compute_precision(setup.precision, setup.method)
    peak, used = rates.flops_for(precision)
    c = cpu_step(spec, setup, rates, step_flops(spec, setup), used, peak)
    return {k: round(v * 1e3, 2) for k, v in dataclasses.asdict(c).items()}


def evaluate(rows: list[dict], rates) -> None:
    for row in rows:
        est = predict_step(spec_for(*row["config"][:5]), setup_for(row["config"]), rates)
        row["predicted_seconds"] = est.step_seconds
        row["error"] = est.step_seconds / row["measured_seconds"] - 1
        row["bottleneck"] = est.bottleneck
        row["predicted_terms_ms"] = predicted_terms(row["config"], rates)


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| hidden | layers | vocab | batch | seq | method | precision | ckpt | measured ms | predicted ms | error "
        "| optimizer measured / predicted ms | bottleneck |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h, layers, heads, ffn, vocab, mb, seq, method, precision, ckpt = r["config"]
        t = r["predicted_terms_ms"]
        opt = f"{r['measured_optimizer_seconds'] * 1e3:.1f} / {t['optimizer_seconds'] + t['step_first_touch_seconds']:.1f}"
        lines.append(f"| {h} | {layers} | {vocab} | {mb} | {seq} | {method} | {precision} | {ckpt} | "
                     f"{r['measured_seconds'] * 1e3:.1f} | {r['predicted_seconds'] * 1e3:.1f} | {r['error']:+.1%} | "
                     f"{opt} | {r['bottleneck']} |")  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 configurations only")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration and round (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="rounds over all configurations; the lower median is kept")
    ap.add_argument("--large", action="store_true",
                    help=f"also time {len(LARGE)} larger out-of-sample configurations once (~2 min, ~13 GB RAM)")
    ap.add_argument("--calibrate", action="store_true", help="fit the CPU model's FITTED constants on the even rows")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_time_accuracy"))
    ap.add_argument("--from", dest="from_json", metavar="JSON",
                    help="re-predict the timings stored in a previous result (no timing run)")
    args = ap.parse_args()

    import torch

    keys = ("config", "measured_seconds", "measured_optimizer_seconds")
    if args.from_json:
        prev = json.loads(Path(args.from_json).read_text())
        rows = [{k: r[k] for k in keys} for r in prev["rows"]]
        large = [{k: r[k] for k in keys} for r in prev.get("large_rows", [])]
        rates = DeviceRates(**prev["summary"]["rates"])
        measured_at = prev["summary"]
    else:
        rows, rates, measured_at = run_timings(CONFIGS[::3] if args.quick else CONFIGS, args.steps, args.warmup, args.rounds)
        large = []
        for cfg in LARGE if args.large else []:
            step, opt = time_config(cfg, 3, 1)
            large.append({"config": list(cfg), "measured_seconds": step, "measured_optimizer_seconds": opt})
            print(f"large {cfg}  measured {step * 1e3:8.1f} ms", flush=True)
        if large:
            measured_at["loadavg_after"] = os.getloadavg()
    threads = measured_at["threads"]
    load_before, load_after = measured_at["loadavg_before"], measured_at["loadavg_after"]
    fitted = calibrate(rows, rates) if args.calibrate else None
    evaluate(rows, rates)
    evaluate(large, rates)
    errs = [abs(r["error"]) for r in rows]
    summary = {
        "configs": len(rows),
        "median_abs_error": statistics.median(errs),
        "max_abs_error": max(errs),
        "median_abs_error_even_rows": statistics.median(errs[0::2]),
        "median_abs_error_odd_rows": statistics.median(errs[1::2]) if len(errs) > 1 else None,
        "large_errors": [round(r["error"], 4) for r in large],
        **{k: measured_at[k] for k in ("threads", "loadavg_before", "loadavg_after", "cpu", "measured_fp32_gflops",
                                       "measured_bf16_gflops", "measured_bandwidth_gbps")},
        "fitted_constants": fitted,
        "torch": torch.__version__,
        "rates": dataclasses.asdict(rates),  # the measured machine, so --from can re-predict offline
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows, "large_rows": large}, indent=2) + "\n")
    flags = "".join(f" --{name}" for name in ("quick", "large", "calibrate") if getattr(args, name))
    flags += f" --from {args.from_json}" if args.from_json else ""
    lines = [
        "# Step-time accuracy on CPU",
        "",
        f"Command: `.venv/bin/python bench/step_time_accuracy.py{flags}`  ",
        f"CPU: {summary['cpu']}, {threads} threads, torch {torch.__version__}; measured (best of two profiles) "
        f"{summary['measured_fp32_gflops']:.0f} GFLOP/s fp32, {summary['measured_bf16_gflops'] or 0:.0f} GFLOP/s bf16, "
        f"{summary['measured_bandwidth_gbps']:.1f} GB/s.  ",
        f"Load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} (the run itself keeps {threads} cores busy; "
        "before > ~0.5 means other jobs shared the cores).  ",
        "Each configuration: median of the timed steps, lower of the rounds' medians. Model: "
        "`trainfit.core.speed.cpu` (terms per configuration in the JSON).",
        "",
        f"**Median |error| {summary['median_abs_error']:.1%}**, max {summary['max_abs_error']:.1%} over {len(rows)} "
        f"configurations; even rows (the configurations the FITTED constants were refined on, in an earlier run) median "
        f"{summary['median_abs_error_even_rows']:.1%}, odd (held-out) rows median {summary['median_abs_error_odd_rows']:.1%}.",
        "",
        *table(rows),
    ]
    if large:
        lines += ["", "Larger, out-of-sample configurations (a Qwen2.5-0.5B-wide model, 8 layers; one round of 3 "
                  "steps; DRAM-bound, 150k vocabulary; not used for any fit):", "", *table(large)]
    if fitted:
        lines += ["", f"Fitted on the even rows of this run: `{fitted}`"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
