"""Step-time model vs timed training steps on this CPU.

Builds small models from transformers configs (random weights, no hub): Llama rows, then other
families and knobs (grouped-query attention and tied embeddings in Qwen2 shape, a 4-expert Mixtral,
GPT-2, GPT-NeoX with parallel attention, Gemma-2 with a 256k vocabulary, SGD, LoRA on all linear
layers, sequences of 512 and 1024, bf16 autocast; Mistral, Qwen3, Phi-3, Gemma and Phi built by
trainfit's own config builder). Every timed round records the cores other processes used meanwhile
(hardware.cpu_load): rows timed while shared are flagged LOADED and, with rates measured under
load, left out of the verdict on the families beyond Llama (median |error| <= 10 %, |median signed
error| <= 5 %). It times real training steps (forward +
backward + optimizer step + zero_grad) with torch threads = the usable cores, and compares the
median with `trainfit.core.speed.predict_step` for device "cpu" with the rates a fresh machine
predicts with when no --hardware is given: `build_profile()` with an empty trainfit cache, i.e.
the default measured CPU rates (hardware.cpu_measure), recorded in the results.

    .venv/bin/python bench/step_time_accuracy.py            # ~7.5 min, writes bench/results/step_time_accuracy.{json,md}
    .venv/bin/python bench/step_time_accuracy.py --large    # + 2 Qwen2.5-0.5B-wide shapes (~2 min, ~13 GB RAM)
    .venv/bin/python bench/step_time_accuracy.py --quick    # every third configuration, for a smoke test
    .venv/bin/python bench/step_time_accuracy.py --only beyond-llama --out /tmp/beyond  # the other families only (~4 min)
    .venv/bin/python bench/step_time_accuracy.py --max-wait 300  # wait up to 5 min per row for quiet cores
    .venv/bin/python bench/step_time_accuracy.py --calibrate  # also fit the FITTED CPU constants on the
                                                              # even configurations, report on the odd
    .venv/bin/python bench/step_time_accuracy.py --from bench/results/step_time_accuracy.json --out /tmp/x
                                                    # re-predict stored timings (no timing run)

Timings are only meaningful on a quiet machine (1-minute load below ~0.7 before the start): the
load average before and after is recorded; re-run it when nothing else runs. Even then this VM
has slow spells (the matmul rate drops by up to a third for seconds), hence several rounds and
the lower median per configuration. On a CPU without bf16 instructions a bf16-autocast step takes
seconds (the emulated path, ~50x slower than fp32): those rows run one round of BF16_STEPS.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainfit.core.models.spec import ModelSpec  # noqa: E402
from trainfit.core.setup import LoraSettings, TrainingSetup  # noqa: E402
from trainfit.core.speed import DeviceRates, cpu_rates, predict_step  # noqa: E402

# Llama rows: (hidden, layers, heads, ffn, vocab, micro_batch, seq, method, precision, checkpointing)
LLAMA = [
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
KEYS = ("hidden", "layers", "heads", "ffn", "vocab", "micro_batch", "seq", "method", "precision", "ckpt")


def row_config(values: tuple, family: str = "llama", **extra) -> dict:
    """One configuration as a dict: the Llama tuple's fields plus family, kv_heads, optimizer and
    LoRA targets (defaults: Llama, kv_heads = heads, AdamW, LoRA on the attention projections)."""
    cfg = {"family": family, **dict(zip(KEYS, values)), "optimizer": "adamw", "lora_targets": "attention"}
    cfg["kv_heads"] = cfg["heads"]
    cfg.update(extra)
    return cfg


# Beyond Llama: one knob or family per row (shapes of the Llama rows where one fits).
# GQA + tied + qkv bias (Qwen2-shaped, 4 query heads per KV head as Qwen2.5-0.5B's 14/2 ~ 7);
# MoE (Mixtral: 4 experts, top 2); GPT-2 (GELU, LayerNorm, learned positions, tied, biases,
# dropout 0: bench/dropout_speed_cpu.py times GPT-2's own 0.1 against it); GPT-NeoX (parallel
# attention + MLP, partial rotary, GELU, LayerNorm); Gemma-2 (256k vocabulary on a 128-wide model, GQA, soft-capped attention
# scores and logits, GELU-tanh); SGD; LoRA on all linear layers; sequences of 512 and 1024.
OTHERS = [
    row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), "llama", kv_heads=2),
    row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), "qwen2", kv_heads=2),
    row_config((512, 4, 8, 1376, 16384, 1, 256, "full", "fp32", "none"), "qwen2", kv_heads=2),
    row_config((384, 4, 6, 1032, 8192, 2, 256, "lora", "fp32", "none"), "qwen2", kv_heads=2),
    row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), "mixtral", kv_heads=2),
    row_config((256, 4, 8, 688, 8192, 2, 256, "lora", "fp32", "none"), "mixtral", kv_heads=2),
    row_config((256, 4, 8, 1024, 8192, 2, 256, "full", "fp32", "none"), "gpt2"),
    row_config((512, 4, 8, 2048, 16384, 1, 256, "full", "fp32", "none"), "gpt2"),
    row_config((256, 4, 8, 1024, 8192, 2, 256, "full", "fp32", "none"), "gpt_neox"),
    row_config((384, 4, 6, 1536, 8192, 2, 256, "lora", "fp32", "none"), "gpt_neox"),
    row_config((128, 2, 4, 512, 256000, 1, 256, "full", "fp32", "none"), "gemma2", kv_heads=2),
    row_config((128, 2, 4, 512, 256000, 1, 256, "lora", "fp32", "none"), "gemma2", kv_heads=2),
    row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), optimizer="sgd"),
    row_config((512, 4, 8, 1376, 16384, 1, 256, "full", "fp32", "none"), optimizer="sgd"),
    row_config((256, 4, 8, 688, 8192, 2, 256, "lora", "fp32", "none"), lora_targets="all-linear"),
    row_config((512, 4, 8, 1376, 16384, 2, 256, "lora", "fp32", "none"), lora_targets="all-linear"),
    row_config((256, 4, 8, 688, 8192, 1, 1024, "full", "fp32", "none")),
    row_config((256, 4, 8, 688, 8192, 1, 1024, "full", "fp32", "full")),
    row_config((384, 4, 6, 1032, 8192, 1, 512, "lora", "fp32", "none")),
    row_config((128, 4, 4, 344, 4096, 1, 1024, "lora", "fp32", "none"), "qwen2", kv_heads=2),
    row_config((128, 2, 4, 344, 4096, 1, 128, "full", "bf16-mixed", "none")),
    row_config((128, 2, 4, 512, 4096, 1, 128, "full", "bf16-mixed", "none"), "gpt2"),
]
# More families, built by trainfit's own ModelSpec -> transformers config (train.hf_config, the
# builder `trainfit train` uses): Mistral (GQA), Qwen3 (per-head q/k RMSNorm, tied), Phi-3 (fused
# qkv_proj / gate_up_proj), Gemma (GELU-tanh gate, tied, a 32k vocabulary on a 256-wide model),
# Phi (Phi-2 layout: parallel attention + MLP, LayerNorm, biases, partial rotary). OPT is not a
# family trainfit models.
BUILT = ("mistral", "qwen3", "phi3", "gemma", "phi")
MORE = [
    row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), "mistral", kv_heads=2),
    row_config((384, 4, 6, 1032, 8192, 2, 256, "lora", "fp32", "none"), "mistral", kv_heads=2),
    row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), "qwen3", kv_heads=2),
    row_config((384, 4, 6, 1032, 8192, 2, 256, "lora", "fp32", "none"), "qwen3", kv_heads=2, lora_targets="all-linear"),
    row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), "phi3"),
    row_config((384, 4, 6, 1032, 8192, 1, 512, "lora", "fp32", "none"), "phi3", lora_targets="all-linear"),
    row_config((256, 4, 8, 1024, 32768, 2, 256, "full", "fp32", "none"), "gemma", kv_heads=2),
    row_config((256, 4, 8, 1024, 32768, 2, 256, "lora", "fp32", "none"), "gemma", kv_heads=2),
    row_config((256, 4, 8, 1024, 8192, 2, 256, "full", "fp32", "none"), "phi"),
    row_config((384, 4, 6, 1536, 8192, 2, 256, "lora", "fp32", "none"), "phi"),
]
CONFIGS = [row_config(c) for c in LLAMA] + OTHERS + MORE
# Out-of-sample shapes (--large): Qwen2.5-0.5B widths and vocabulary, 8 layers, untied.
LARGE = [
    row_config((896, 8, 14, 4864, 151936, 1, 512, "full", "fp32", "none")),
    row_config((896, 8, 14, 4864, 151936, 2, 512, "lora", "fp32", "none")),
]
LORA_RANK, LORA_ALPHA = 8, 16
# A 16-bit step on a CPU without native bf16 (no AVX512-BF16 / AMX) takes the emulated path,
# ~50x slower than fp32 (hardware.cpu_measure): such rows get fewer steps (BF16_STEPS).
BF16_STEPS, BF16_WARMUP = 1, 1


def normalise(config) -> dict:
    """A stored configuration: a dict, or the 10-field Llama list of results before families."""
    return dict(config) if isinstance(config, dict) else row_config(tuple(config))


def lora_settings(cfg: dict, spec: ModelSpec | None = None) -> LoraSettings:
    """LoRA on all linear layers, or on the attention projections as trainfit names them per family."""
    from trainfit.core.models.params import attention_module_names

    targets = "all-linear"
    if cfg["lora_targets"] != "all-linear":
        targets = attention_module_names(spec or spec_for(cfg))
    return LoraSettings(rank=LORA_RANK, alpha=LORA_ALPHA, dropout=0.0, target_modules=targets)


def built_spec(cfg: dict) -> ModelSpec:
    """The ModelSpec of a configuration of a BUILT family (the features of that family, the row's shape)."""
    h, heads = cfg["hidden"], cfg["heads"]
    fam = cfg["family"]
    base = dict(id=f"bench-{fam}-h{h}-l{cfg['layers']}", architecture=fam, vocab_size=cfg["vocab"], hidden_size=h,
                num_layers=cfg["layers"], num_heads=heads, num_kv_heads=cfg["kv_heads"], head_dim=h // heads,
                intermediate_size=cfg["ffn"], activation="silu", gated_mlp=True, tie_embeddings=False,
                position="rope", max_position_embeddings=4096, norm="rmsnorm", qkv_bias=False, o_bias=False,
                mlp_bias=False, lm_head_bias=False, stored_dtype="float32", source="bench")
    if fam == "qwen3":
        base.update(tie_embeddings=True)
    elif fam == "gemma":
        base.update(activation="gelu_tanh", tie_embeddings=True)
    elif fam == "phi":
        base.update(activation="gelu_new", gated_mlp=False, norm="layernorm", qkv_bias=True, o_bias=True,
                    mlp_bias=True, lm_head_bias=True)
    return ModelSpec(**base)


def hf_config(cfg: dict):
    """The transformers config of a configuration (random weights are built from it, no hub)."""
    import transformers as T

    if cfg["family"] in BUILT:
        from trainfit.train.hf_config import build_hf_config

        conf = build_hf_config(built_spec(cfg))
        conf._attn_implementation = attention_for(cfg)
        return conf

    h, layers, heads, kv, ffn, vocab = (cfg[k] for k in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab"))
    common = dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=ffn, max_position_embeddings=4096)
    fam = cfg["family"]
    drop = cfg.get("dropout", 0.0)  # the model's own dropout (GPT-2 only: bench/dropout_speed_cpu.py)
    if fam == "llama":
        conf = T.LlamaConfig(**common, num_key_value_heads=kv, tie_word_embeddings=False)
    elif fam == "qwen2":
        conf = T.Qwen2Config(**common, num_key_value_heads=kv, tie_word_embeddings=True)
    elif fam == "mixtral":
        conf = T.MixtralConfig(**common, num_key_value_heads=kv, num_local_experts=4, num_experts_per_tok=2,
                               tie_word_embeddings=False)
    elif fam == "gpt2":
        conf = T.GPT2Config(vocab_size=vocab, n_embd=h, n_layer=layers, n_head=heads, n_inner=ffn, n_positions=4096,
                            resid_pdrop=drop, embd_pdrop=drop, attn_pdrop=drop, bos_token_id=0, eos_token_id=0)
    elif fam == "gpt_neox":
        conf = T.GPTNeoXConfig(**common, use_parallel_residual=True, rotary_pct=0.25, hidden_dropout=0.0,
                               attention_dropout=0.0, tie_word_embeddings=False)
    elif fam == "gemma2":
        conf = T.Gemma2Config(**common, num_key_value_heads=kv, head_dim=h // heads, sliding_window=4096,
                              query_pre_attn_scalar=h // heads, tie_word_embeddings=True)
    else:
        raise ValueError(f"unknown family {fam!r}")
    conf._attn_implementation = attention_for(cfg)
    return conf


def attention_for(cfg: dict) -> str:
    # Gemma-2 soft-caps its attention scores, which SDPA cannot: transformers runs it eager.
    return "eager" if cfg["family"] == "gemma2" else "sdpa"


def spec_for(cfg: dict) -> ModelSpec:
    from trainfit.core.models.loader import spec_from_config

    data = hf_config(cfg).to_dict()
    data["torch_dtype"] = data["dtype"] = "float32"
    return spec_from_config(data, origin="bench", model_id=f"bench-{cfg['family']}-h{cfg['hidden']}-l{cfg['layers']}")


def setup_for(cfg: dict, spec: ModelSpec | None = None) -> TrainingSetup:
    return TrainingSetup(
        method=cfg["method"], precision=cfg["precision"], micro_batch=cfg["micro_batch"], seq_len=cfg["seq"],
        grad_checkpointing=cfg["ckpt"], attention=attention_for(cfg), optimizer=cfg["optimizer"],
        lora=lora_settings(cfg, spec) if cfg["method"] == "lora" else None, device="cpu",
    )  # fmt: skip


def time_config(cfg: dict, steps: int, warmup: int) -> tuple[float, float]:
    """Median seconds of one training step (fwd + bwd + optimizer step + zero_grad) and of its optimizer part."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation=attention_for(cfg))
    if cfg["method"] == "lora":
        from peft import LoraConfig, get_peft_model

        lora = lora_settings(cfg)
        model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0,
                                                 target_modules=lora.target_modules))  # fmt: skip
    if cfg["ckpt"] == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg["method"] == "lora":
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-4) if cfg["optimizer"] == "sgd" else torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, cfg["vocab"], (cfg["micro_batch"], cfg["seq"]))
    times, opt_times = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg["precision"] == "bf16-mixed"):
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
    """The rates a fresh machine predicts with, no --hardware: `build_profile()` with an empty
    trainfit cache (a temporary TRAINFIT_CACHE_DIR), i.e. the default measured CPU rates
    (hardware.cpu_measure), not a --benchmark profile nor a best-of figure."""
    import tempfile

    from trainfit.hardware.profiler import build_profile

    before = os.environ.get("TRAINFIT_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="trainfit-fresh-") as cache:
        os.environ["TRAINFIT_CACHE_DIR"] = cache
        try:
            profile = build_profile(quick=True)
        finally:
            if before is None:
                os.environ.pop("TRAINFIT_CACHE_DIR", None)
            else:
                os.environ["TRAINFIT_CACHE_DIR"] = before
    return profile, cpu_rates(profile)


def predict(cfg, rates) -> float:
    return predict_step(spec_for(cfg), setup_for(cfg), rates).step_seconds


# The CPU model's constants the calibration may scale (trainfit.core.speed.cpu); the others
# (first-touch cost, mmap threshold, AdamW kernel and byte counts) are measured or counted.
FITTED = ("CPU_GEMM_CEILING", "CPU_ATTENTION_CEILING", "CPU_ELEMENTWISE_BANDWIDTH_FACTOR", "CPU_OP_SECONDS",
          "CPU_PARTLY_FRESH_FRACTION", "CPU_TRAINING_GEMM_SHARE")
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

    train = [r for r in rows[0::2] if not r.get("loaded")]  # never fit to timings of shared cores
    if not train:
        raise SystemExit("--calibrate: every even row was timed while other processes shared the cores")
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


def describe(cfg: dict) -> str:
    extra = "".join(f" {k}={cfg[k]}" for k in ("kv_heads", "optimizer", "lora_targets")
                    if cfg[k] != row_config(tuple(cfg[x] for x in KEYS))[k])
    return f"{cfg['family']} " + " ".join(str(cfg[k]) for k in KEYS) + extra


def wait_quiet(max_wait_seconds: float) -> None:
    """Wait (1 s samples) up to `max_wait_seconds` until other processes leave our cores alone."""
    from trainfit.hardware import cpu_load

    end = time.monotonic() + max_wait_seconds
    while time.monotonic() < end and cpu_load.sample(1.0).busy_reason is not None:
        pass


def run_timings(configs, steps: int, warmup: int, rounds: int,
                max_wait_seconds: float = 0.0) -> tuple[list[dict], DeviceRates, dict]:
    """Profile the machine (measured rates), then time every configuration, watching the load."""
    import torch

    from trainfit.hardware import cpu_load
    from trainfit.hardware.cpu_measure import native_bf16

    load_before = os.getloadavg()  # before anything of ours runs: what else loads the machine
    wait_quiet(max_wait_seconds)
    profile, rates = machine_rates()
    threads = max(1, int(profile.cpu.usable_cores))
    torch.set_num_threads(threads)
    native16 = native_bf16(profile.cpu)
    # Each configuration is timed in `rounds` rounds (every other round in reverse order, a fresh
    # model each time) and the round with the lower median step kept: the host VM has slow spells
    # of several seconds (matmul rate down by up to a third) that one round can fall into. Every
    # round records what other processes took of our cores meanwhile (hardware.cpu_load); a row
    # whose kept round was shared is flagged `loaded` and left out of the summary.
    best: dict[int, tuple[float, float, cpu_load.LoadWindow]] = {}
    for r in range(rounds):
        order = list(range(len(configs)))[:: -1 if r % 2 else 1]
        for i in order:
            slow = configs[i]["precision"] != "fp32" and not native16
            if slow and r > 0:
                continue  # one round of BF16_STEPS for an emulated 16-bit row (seconds per step)
            wait_quiet(max_wait_seconds)
            start = cpu_load.snapshot()
            step, opt = time_config(configs[i], *((BF16_STEPS, BF16_WARMUP) if slow else (steps, warmup)))
            win = cpu_load.window(start)
            if i not in best or step < best[i][0]:
                best[i] = (step, opt, win)
            print(f"round {r + 1} {describe(configs[i])}  measured {step * 1e3:8.1f} ms (optimizer {opt * 1e3:.1f})"
                  f"  others {win.other_cores if win.other_cores is not None else '?'} cores", flush=True)
    rows = [{"config": cfg, "measured_seconds": best[i][0], "measured_optimizer_seconds": best[i][1],
             "other_cores": best[i][2].other_cores, "steal_cores": best[i][2].steal_cores,
             "loaded": best[i][2].busy_reason is not None}
            for i, cfg in enumerate(configs)]
    bench = profile.benchmark
    return rows, rates, {
        "threads": threads,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu": profile.cpu.model,
        "measured_fp32_gflops": bench.cpu_fp32_gflops if bench else None,
        "measured_bf16_gflops": bench.cpu_bf16_gflops if bench else None,
        "measured_fp32_training_gflops": bench.cpu_fp32_training_gflops if bench else None,
        "measured_first_touch_ns_per_page": bench.cpu_first_touch_ns_per_page if bench else None,
        "measured_bandwidth_gbps": bench.memory_bandwidth_gbps if bench else None,
        "measured_at": bench.measured_at if bench else None,
        "rates_load_check": dataclasses.asdict(bench.load_check) if bench and bench.load_check else None,
        # Only what bears on the rates (e.g. "under_load"), not the figures the CPU measurement skips.
        "measurement_notes": {k: v for k, v in (bench.unavailable if bench else {}).items()
                              if k not in ("gpu_bandwidth_gbps", "disk_read_mbps", "disk_write_mbps")},
        "native_bf16": native16,
    }


def predicted_terms(cfg, rates) -> dict:
    """The CPU model's terms for one configuration, in ms (where a prediction misses)."""
    from trainfit.core.speed.cpu import cpu_step
    from trainfit.core.speed.flops import step_flops
    from trainfit.core.speed.rates import compute_precision

    spec, setup = spec_for(cfg), setup_for(cfg)
    precision = compute_precision(setup.precision, setup.method)
    peak, used = rates.flops_for(precision)
    c = cpu_step(spec, setup, rates, step_flops(spec, setup), used, peak)
    return {k: round(v * 1e3, 2) for k, v in dataclasses.asdict(c).items()}


@contextlib.contextmanager
def gemm_basis(basis: str):
    """Predict with the fp32 GEMMs on `basis` (core.speed.cpu.CPU_FP32_GEMM_BASIS) inside the block."""
    from trainfit.core.speed import cpu

    before = cpu.CPU_FP32_GEMM_BASIS
    cpu.CPU_FP32_GEMM_BASIS = basis
    try:
        yield
    finally:
        cpu.CPU_FP32_GEMM_BASIS = before


def evaluate(rows: list[dict], rates) -> None:
    for row in rows:
        est = predict_step(spec_for(row["config"]), setup_for(row["config"]), rates)
        row["predicted_seconds"] = est.step_seconds
        row["error"] = est.step_seconds / row["measured_seconds"] - 1
        row["bottleneck"] = est.bottleneck
        row["predicted_terms_ms"] = predicted_terms(row["config"], rates)
        if rates.training_gemm_flops:
            # Both fp32 GEMM bases (core.speed.cpu.CPU_FP32_GEMM_BASIS) on the same timings, so one quiet run
            # shows which one is closer.
            for basis in ("numpy_peak", "torch_training"):
                with gemm_basis(basis):
                    row[f"error_{basis.split('_')[0]}_basis"] = predict(row["config"], rates) / row["measured_seconds"] - 1


def _others(row: dict) -> str:
    """Cores other processes used while the row was timed; LOADED when that disqualifies it."""
    if row.get("other_cores") is None:
        return "not recorded"
    return f"{row['other_cores']:.2f}" + (" LOADED" if row.get("loaded") else "")


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| family | hidden | layers | heads/kv | vocab | batch | seq | method | precision | ckpt | optimizer "
        "| measured ms | predicted ms | error | optimizer measured / predicted ms | bottleneck | other cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, t = r["config"], r["predicted_terms_ms"]
        opt = f"{r['measured_optimizer_seconds'] * 1e3:.1f} / {t['optimizer_seconds'] + t['step_first_touch_seconds']:.1f}"
        method = c["method"] + (" (all-linear)" if c["method"] == "lora" and c["lora_targets"] == "all-linear" else "")
        lines.append(f"| {c['family']} | {c['hidden']} | {c['layers']} | {c['heads']}/{c['kv_heads']} | {c['vocab']} "
                     f"| {c['micro_batch']} | {c['seq']} | {method} | {c['precision']} | {c['ckpt']} | {c['optimizer']} | "
                     f"{r['measured_seconds'] * 1e3:.1f} | {r['predicted_seconds'] * 1e3:.1f} | {r['error']:+.1%} | "
                     f"{opt} | {r['bottleneck']} | {_others(r)} |")  # fmt: skip
    return lines


def group(cfg: dict) -> str:
    """The row's group for the by-family medians: its family, or the knob it varies on Llama."""
    if cfg["family"] != "llama":
        return cfg["family"]
    if cfg["optimizer"] != "adamw":
        return "llama, " + cfg["optimizer"]
    if cfg["method"] == "lora" and cfg["lora_targets"] == "all-linear":
        return "llama, lora all-linear"
    if cfg["kv_heads"] != cfg["heads"]:
        return "llama, gqa"
    if cfg["precision"] != "fp32":
        return "llama, " + cfg["precision"]
    if cfg["seq"] > 256:
        return "llama, seq 512-1024"
    return "llama"


def by_group(rows: list[dict]) -> dict:
    groups: dict[str, list[float]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(group(r["config"]), []).append((i, r["error"]))
    return {g: {"rows": len(v), "median_abs_error": round(statistics.median(abs(e) for _, e in v), 4),
                "median_error": round(statistics.median(e for _, e in v), 4),
                "held_out_median_abs_error": (round(statistics.median(abs(e) for i, e in v if i % 2), 4)
                                              if any(i % 2 for i, _ in v) else None)}
            for g, v in groups.items()}


def select(only: str | None, configs: list[dict]) -> list[dict]:
    """The configurations of the families named by --only (all without it)."""
    if not only:
        return configs
    names = {x.strip() for x in only.split(",") if x.strip()}
    chosen = [c for c in configs if c["family"] in names or ("beyond-llama" in names and c["family"] != "llama")]
    if not chosen:
        raise SystemExit(f"--only {only}: no configuration of these families "
                         f"(families: {', '.join(sorted({c['family'] for c in configs}))}, or beyond-llama)")
    return chosen


# The Done-when bar for families beyond Llama (issue 33): median |error| and signed median.
BEYOND_LLAMA_MAX_MEDIAN_ABS = 0.10
BEYOND_LLAMA_MAX_BIAS = 0.05


def beyond_llama(rows: list[dict], measured: dict) -> dict:
    """Rows of other families timed while no other process shared the cores: median |error|,
    median signed error (bias), and the verdict; none when the rates themselves were measured under load."""
    quiet = [r for r in rows if r["config"]["family"] != "llama" and not r.get("loaded")]
    out = {"rows": len(quiet), "families": sorted({r["config"]["family"] for r in quiet}),
           "left_out_loaded": sum(1 for r in rows if r["config"]["family"] != "llama" and r.get("loaded")),
           "load_not_recorded": sum(1 for r in quiet if "loaded" not in r)}
    check = measured.get("rates_load_check")
    if check is not None and not check.get("reliable", True):
        return {**out, "verdict": f"no verdict: the CPU rates were measured under load ({check.get('reason')})"}
    if not quiet:
        return {**out, "verdict": "no verdict: no row beyond Llama was timed on a quiet machine"}
    med = statistics.median(abs(r["error"]) for r in quiet)
    bias = statistics.median(r["error"] for r in quiet)
    ok = med <= BEYOND_LLAMA_MAX_MEDIAN_ABS and abs(bias) <= BEYOND_LLAMA_MAX_BIAS
    for basis in ("numpy", "torch"):
        if all(f"error_{basis}_basis" in r for r in quiet):
            out[f"{basis}_basis_median_abs_error"] = round(statistics.median(abs(r[f"error_{basis}_basis"]) for r in quiet), 4)
            out[f"{basis}_basis_median_error"] = round(statistics.median(r[f"error_{basis}_basis"] for r in quiet), 4)
    return {**out, "median_abs_error": round(med, 4), "median_error": round(bias, 4),
            "verdict": ("PASS" if ok else "FAIL") + f" (median |error| <= {BEYOND_LLAMA_MAX_MEDIAN_ABS:.0%}, "
                       f"|median error| <= {BEYOND_LLAMA_MAX_BIAS:.0%})"}


def beyond_line(summary: dict) -> str:
    b = summary["beyond_llama"]
    unknown = f" ({b['load_not_recorded']} from before the per-row load was recorded)" if b.get("load_not_recorded") else ""
    head = (f"**Families beyond Llama** ({', '.join(b['families']) or 'none'}; {b['rows']} rows timed on quiet cores"
            f"{unknown}, {b['left_out_loaded']} left out as timed under load): ")
    if "median_abs_error" not in b:
        return head + b["verdict"] + "."
    line = head + f"median |error| {b['median_abs_error']:.1%}, median error {b['median_error']:+.1%}: **{b['verdict']}**."
    for basis, what in (("numpy", "numpy's peak x the reference ceiling"), ("torch", "torch's measured training matmul")):
        if f"{basis}_basis_median_abs_error" in b:
            line += (f" fp32 GEMMs on {what}: median |error| {b[f'{basis}_basis_median_abs_error']:.1%}, "
                     f"median error {b[f'{basis}_basis_median_error']:+.1%}.")
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every third configuration only")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration and round (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all configurations; the lower median is kept")
    ap.add_argument("--large", action="store_true",
                    help=f"also time {len(LARGE)} larger out-of-sample configurations once (~2 min, ~13 GB RAM)")
    ap.add_argument("--calibrate", action="store_true", help="fit the CPU model's FITTED constants on the even rows")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_time_accuracy"))
    ap.add_argument("--from", dest="from_json", metavar="JSON",
                    help="re-predict the timings stored in a previous result (no timing run)")
    ap.add_argument("--only", metavar="FAMILIES",
                    help="comma-separated families to time (e.g. mistral,phi3), or 'beyond-llama' for every non-Llama row")
    ap.add_argument("--max-wait", type=float, default=0.0, metavar="S",
                    help="before the rates and each configuration, wait up to S seconds for other processes to "
                         "leave the cores (rows timed while shared are flagged and left out of the summary)")
    args = ap.parse_args()

    import torch

    keys = ("config", "measured_seconds", "measured_optimizer_seconds")
    load_keys = ("other_cores", "steal_cores", "loaded")  # absent in results from before the load was watched
    if args.from_json:
        prev = json.loads(Path(args.from_json).read_text())
        rows = [{**{k: r[k] for k in keys + load_keys if k in r}, "config": normalise(r["config"])} for r in prev["rows"]]
        large = [{**{k: r[k] for k in keys}, "config": normalise(r["config"])} for r in prev.get("large_rows", [])]
        rates = DeviceRates(**prev["summary"]["rates"])
        measured_at = prev["summary"]
    else:
        rows, rates, measured_at = run_timings(select(args.only, CONFIGS[::3] if args.quick else CONFIGS), args.steps,
                                               args.warmup, args.rounds, args.max_wait)
        large = []
        for cfg in LARGE if args.large else []:
            step, opt = time_config(cfg, 3, 1)
            large.append({"config": cfg, "measured_seconds": step, "measured_optimizer_seconds": opt})
            print(f"large {describe(cfg)}  measured {step * 1e3:8.1f} ms", flush=True)
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
        "by_family": by_group(rows),
        "loaded_rows": sum(1 for r in rows if r.get("loaded")),
        "beyond_llama": beyond_llama(rows, measured_at),
        "large_errors": [round(r["error"], 4) for r in large],
        **{k: measured_at.get(k) for k in ("threads", "loadavg_before", "loadavg_after", "cpu", "measured_fp32_gflops",
                                           "measured_bf16_gflops", "measured_bandwidth_gbps", "measured_at",
                                           "measurement_notes", "native_bf16", "measured_fp32_training_gflops",
                                           "measured_first_touch_ns_per_page", "rates_load_check")},
        "fitted_constants": fitted,
        "timing_command": measured_at.get("timing_command") or ".venv/bin/python bench/step_time_accuracy.py" + "".join(
            f" --{name}" for name in ("quick", "large") if getattr(args, name)) + (f" --only {args.only}" if args.only else ""),
        "torch": torch.__version__,
        "rates": dataclasses.asdict(rates),  # the measured machine, so --from can re-predict offline
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "rows": rows, "large_rows": large}, indent=2) + "\n")
    flags = "".join(f" --{name}" for name in ("quick", "large", "calibrate") if getattr(args, name))
    flags += f" --only {args.only}" if args.only else ""
    flags += f" --from {args.from_json}" if args.from_json else ""
    lines = [
        "# Step-time accuracy on CPU",
        "",
        f"Command: `.venv/bin/python bench/step_time_accuracy.py{flags}`  ",
        f"CPU: {summary['cpu']}, {threads} threads, torch {torch.__version__}, native bf16: "
        f"{ {True: 'yes', False: 'no'}.get(summary['native_bf16'], 'not recorded')}. Rates of a fresh machine with no --hardware (`build_profile()` "
        f"with an empty trainfit cache: the default measurement of hardware.cpu_measure, taken "
        f"{summary['measured_at'] or 'at an unknown time'}): {summary['measured_fp32_gflops']:.1f} GFLOP/s fp32, "
        f"{summary['measured_bf16_gflops'] or 0:.1f} GFLOP/s bf16 (autocast training matmul), "
        f"{summary['measured_bandwidth_gbps']:.1f} GB/s{' ' + str(summary['measurement_notes']) if summary['measurement_notes'] else ''}"
        + (f"; torch fp32 training matmul {summary['measured_fp32_training_gflops']:.1f} GFLOP/s, first touch "
           f"{summary['measured_first_touch_ns_per_page']:.0f} ns/page" if summary.get("measured_fp32_training_gflops") else "")
        + ".  ",
        *([f"Timings taken by `{summary['timing_command']}`; this file re-predicts them with the current model.  "]
          if args.from_json else []),
        f"Load average (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
        f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} (the run itself keeps {threads} cores busy; "
        "before > ~0.5 means other jobs shared the cores); per row, the cores other processes used while it was "
        "timed (hardware.cpu_load; LOADED rows, above 10 % of the cores, are left out of the beyond-Llama verdict).  ",
        "Each configuration: median of the timed steps, lower of the rounds' medians (16-bit rows on a CPU without "
        f"native bf16: one round, {BF16_STEPS} timed step(s) after {BF16_WARMUP} warm-up, each step takes seconds). Model: "
        "`trainfit.core.speed.cpu` (terms per configuration in the JSON).",
        "",
        f"**Median |error| {summary['median_abs_error']:.1%}**, max {summary['max_abs_error']:.1%} over {len(rows)} "
        f"configurations; even rows (where fits are made: --calibrate, and the FITTED constants in an earlier run) median "
        f"{summary['median_abs_error_even_rows']:.1%}, odd (held-out) rows median {summary['median_abs_error_odd_rows']:.1%}.",
        "",
        beyond_line(summary),
        "",
        "By family (or the knob varied on Llama): rows, median |error|, median signed error, held-out (odd rows) median |error|:",
        "",
        "| group | rows | median abs error | median error | held-out median abs error |",
        "|---|---|---|---|---|",
        *[f"| {g} | {v['rows']} | {v['median_abs_error']:.1%} | {v['median_error']:+.1%} | "
          f"{'-' if v['held_out_median_abs_error'] is None else format(v['held_out_median_abs_error'], '.1%')} |"
          for g, v in summary["by_family"].items()],
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
