"""Step-time model vs timed training steps on this CPU.

Builds small Llama-shaped models from configs (random weights, no hub), times real training
steps (forward + backward + AdamW step + zero_grad) with torch threads = the usable cores, and
compares the median with `trainfit.core.speed.predict_step` for device "cpu" on this machine's
profile (`build_profile(benchmark=True)`: measured matmul GFLOP/s and memory bandwidth).

    .venv/bin/python bench/step_time_accuracy.py            # run, write bench/results/step_time_accuracy.{json,md}
    .venv/bin/python bench/step_time_accuracy.py --quick    # 8 configurations, for a smoke test
    .venv/bin/python bench/step_time_accuracy.py --calibrate  # also fit the CPU constants on the
                                                              # even configurations, report on the odd

Timings are only meaningful on a quiet machine: the load average before and after is recorded;
re-run it when nothing else runs.
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
from trainfit.core.speed import cpu_rates, predict_step  # noqa: E402

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


def time_config(cfg, steps: int, warmup: int) -> float:
    """Median seconds of one training step (fwd + bwd + AdamW + zero_grad)."""
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
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine_rates():
    from trainfit.hardware.profiler import build_profile

    profile = build_profile(benchmark=True, quick=False)
    return profile, cpu_rates(profile)


def predict(cfg, rates) -> float:
    return predict_step(spec_for(*cfg[:5]), setup_for(cfg), rates).step_seconds


def calibrate(rows: list[dict], rates) -> dict:
    """Grid-fit the CPU constants on the even rows (median |log error|), report on the odd rows."""
    import itertools

    train = rows[0::2]
    best = None
    for ceiling, half_h, half_t, mem_eff, op in itertools.product(
        (0.5, 0.6, 0.7, 0.8, 0.9, 1.0), (32.0, 64.0, 96.0, 160.0, 256.0), (8.0, 24.0, 64.0, 128.0),
        (0.3, 0.45, 0.6, 0.8), (10e-6, 25e-6, 40e-6, 70e-6),
    ):  # fmt: skip
        r = dataclasses.replace(rates, ceiling=ceiling, half_hidden=half_h, half_tokens=half_t,
                                memory_efficiency=mem_eff, op_overhead_seconds=op)  # fmt: skip
        errs = [abs(predict(row["config"], r) / row["measured_seconds"] - 1) for row in train]
        score = statistics.median(errs) + 0.25 * max(errs)
        if best is None or score < best[0]:
            best = (score, dict(ceiling=ceiling, half_hidden=half_h, half_tokens=half_t,
                                memory_efficiency=mem_eff, op_overhead_seconds=op))  # fmt: skip
    return best[1]  # type: ignore[index]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 configurations only")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_time_accuracy"))
    args = ap.parse_args()

    import torch

    profile, rates = machine_rates()
    threads = max(1, int(profile.cpu.usable_cores))
    torch.set_num_threads(threads)
    load_before = os.getloadavg()
    configs = CONFIGS[::3] if args.quick else CONFIGS
    rows = []
    for cfg in configs:
        measured = time_config(cfg, args.steps, args.warmup)
        rows.append({"config": list(cfg), "measured_seconds": measured})
        print(f"{cfg}  measured {measured * 1e3:8.1f} ms", flush=True)
    load_after = os.getloadavg()
    fitted = calibrate(rows, rates) if args.calibrate else None
    use = dataclasses.replace(rates, **fitted) if fitted else rates
    for row in rows:
        est = predict_step(spec_for(*row["config"][:5]), setup_for(row["config"]), use)
        row["predicted_seconds"] = est.step_seconds
        row["error"] = est.step_seconds / row["measured_seconds"] - 1
        row["bottleneck"] = est.bottleneck
    errs = [abs(r["error"]) for r in rows]
    held_out = [abs(r["error"]) for r in rows[1::2]]
    summary = {
        "configs": len(rows),
        "median_abs_error": statistics.median(errs),
        "max_abs_error": max(errs),
        "median_abs_error_odd_rows": statistics.median(held_out) if held_out else None,
        "threads": threads,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "cpu": profile.cpu.model,
        "measured_fp32_gflops": profile.benchmark.cpu_fp32_gflops if profile.benchmark else None,
        "measured_bf16_gflops": profile.benchmark.cpu_bf16_gflops if profile.benchmark else None,
        "measured_bandwidth_gbps": profile.benchmark.memory_bandwidth_gbps if profile.benchmark else None,
        "fitted_constants": fitted,
        "torch": torch.__version__,
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Step-time accuracy on CPU",
        "",
        f"Command: `.venv/bin/python bench/step_time_accuracy.py{' --calibrate' if fitted else ''}`  ",
        f"CPU: {summary['cpu']}, {threads} threads, torch {torch.__version__}; measured "
        f"{summary['measured_fp32_gflops']:.0f} GFLOP/s fp32, {summary['measured_bf16_gflops'] or 0:.0f} GFLOP/s bf16, "
        f"{summary['measured_bandwidth_gbps']:.1f} GB/s.  ",
        f"Load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} (other jobs shared the cores when > ~0.5).",
        "",
        f"**Median |error| {summary['median_abs_error']:.1%}**, max {summary['max_abs_error']:.1%} over {len(rows)} configurations"
        + (f"; constants fitted on the even rows, odd (held-out) rows median {summary['median_abs_error_odd_rows']:.1%}" if fitted else "")
        + ".",
        "",
        "| hidden | layers | vocab | batch | seq | method | precision | ckpt | measured ms | predicted ms | error | bottleneck |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h, layers, heads, ffn, vocab, mb, seq, method, precision, ckpt = r["config"]
        lines.append(f"| {h} | {layers} | {vocab} | {mb} | {seq} | {method} | {precision} | {ckpt} | "
                     f"{r['measured_seconds'] * 1e3:.1f} | {r['predicted_seconds'] * 1e3:.1f} | {r['error']:+.1%} | {r['bottleneck']} |")  # fmt: skip
    if fitted:
        lines += ["", f"Fitted constants: `{fitted}`"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
