"""LitGPT's own model code (TrainingSetup.model_code = "litgpt") and a loop that keeps the previous
micro-step's tensors (previous_step_kept).

The per-layer figures are the ones bench/litgpt_meta_trace.py measured from LitGPT's classes on the
meta device (bf16) and on the CPU (fp32, dropout); the results file is committed, so the model is
held to those measurements here without litgpt installed."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.core.memory import estimate_memory
from trainfit.core.memory.activations import quantised_inputs_per_token
from trainfit.core.memory.layer_activations import layer_bytes_per_token
from trainfit.core.memory.stats import lora_stats, model_stats
from trainfit.core.models.catalog import get_model
from trainfit.core.models.loader import spec_from_config
from trainfit.core.setup import LoraSettings, TrainingSetup

ROOT = Path(__file__).resolve().parents[2]
RESULTS = json.loads((ROOT / "bench" / "results" / "litgpt_meta_trace.json").read_text())
LLAMA_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _per_layer(spec, targets, rank=8, dropout=0.0, code="litgpt", precision="bf16", device="cuda"):
    lora = LoraSettings(rank=rank, alpha=16, dropout=dropout, target_modules=targets)
    setup = TrainingSetup(method="lora", precision=precision, attention="flash" if device == "cuda" else "sdpa",
                          device=device, lora=lora, micro_batch=1, seq_len=512, model_code=code)
    _, where = lora_stats(spec, targets, rank)
    return layer_bytes_per_token(spec, model_stats(spec), setup, where)[0]


def _measured(case, run_prefix="meta"):
    rows = [r for r in RESULTS["rows"] if r["case"] == case and r["run"].startswith(run_prefix)]
    assert rows, case
    return rows[0]["measured_bytes_per_token"]


@pytest.mark.parametrize("case, model_id, rank, targets", [
    ("tinyllama all r32", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", 32, LLAMA_ALL),  # GQA: k, v repeated
    ("tinyllama q,v r8", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", 8, ["q_proj", "v_proj"]),  # zero_pad
    ("llama-3.1-8b all r16", "meta-llama/Llama-3.1-8B", 16, LLAMA_ALL),
    ("qwen2.5-7b q,v r16", "Qwen/Qwen2.5-7B", 16, ["q_proj", "v_proj"]),
    ("pythia-1b all r8", "EleutherAI/pythia-1b", 8,  # MHA: v keeps the fused q+k+v output; shared LayerNorm input
     ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]),
    ("gemma-7b q,v r16", "google/gemma-7b", 16, ["q_proj", "v_proj"]),  # no fp32 y in LitGPT's RMSNorm
])
def test_litgpt_layers_keep_what_was_measured(case, model_id, rank, targets):
    predicted = _per_layer(get_model(model_id), targets, rank)
    assert predicted == pytest.approx(_measured(case), rel=0.005)


def test_litgpt_code_differs_from_transformers_and_peft_where_the_code_does():
    tiny = get_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    litgpt, peft = _per_layer(tiny, LLAMA_ALL, 32), _per_layer(tiny, LLAMA_ALL, 32, code="transformers")
    # PEFT keeps fp32 adapter inputs (autocast_adapter_dtype) for each of 7 modules; LitGPT keeps
    # bf16 ones, one for q/k/v together, plus the repeated keys/values and o_proj's input copy.
    assert litgpt < 0.7 * peft
    h, kv, f = 2048, 256, 5632
    q_v = _per_layer(tiny, ["q_proj", "v_proj"]) - _per_layer(tiny, ["q_proj", "v_proj"], code="transformers")
    # zero_pad's q+v-wide output (+), k and v repeated to 32 heads (+); the bf16 input once instead
    # of PEFT's two fp32 casts (-), the A outputs in bf16 instead of fp32 (-)
    assert q_v == 2 * (h + kv) + 2 * 2 * (h - kv) - (2 * 4 * h - 2 * h) - 2 * 8 * 2


def test_dropout_on_the_cpu_matches_litgpts_measured_run():
    tiny = get_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    predicted = _per_layer(tiny, LLAMA_ALL, 32, dropout=0.05, precision="fp32", device="cpu")
    assert predicted == pytest.approx(_measured("tinyllama all r32", "CPU"), rel=0.01)


def test_untied_lm_head_and_16bit_adapters():
    gemma = get_model("google/gemma-2b")
    assert gemma.tie_embeddings
    lora = LoraSettings(rank=8, target_modules=["q_proj", "v_proj"])
    base = TrainingSetup(method="lora", precision="bf16", lora=lora, micro_batch=1, seq_len=256, device="cuda")
    hf = estimate_memory(gemma, base).devices[0]
    lit = estimate_memory(gemma, dataclasses.replace(base, model_code="litgpt")).devices[0]
    weights = {d: next(c.bytes for c in dev.components if c.name == "weights") for d, dev in (("hf", hf), ("lit", lit))}
    # LitGPT copies the tied embedding into an lm_head of its own: vocab x hidden more 16-bit weights
    assert weights["lit"] - weights["hf"] == gemma.vocab_size * gemma.hidden_size * 2
    adapters = {d: next(c for c in dev.components if c.name == "lora") for d, dev in (("hf", hf), ("lit", lit))}
    assert adapters["hf"].bytes == 2 * adapters["lit"].bytes and "bf16-true" in adapters["lit"].what


def test_gpt_neox_reads_use_parallel_residual():
    cfg = {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 256,
           "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
           "max_position_embeddings": 512, "rotary_pct": 0.25, "hidden_act": "gelu"}
    parallel = spec_from_config(dict(cfg, use_parallel_residual=True))
    sequential = spec_from_config(dict(cfg, use_parallel_residual=False))
    assert parallel.parallel_attention and parallel.block_norms == 2 and not sequential.parallel_attention
    assert get_model("EleutherAI/pythia-1b").parallel_attention  # the catalog's gpt_neox default
    full = TrainingSetup(method="full", precision="bf16", micro_batch=1, seq_len=128, device="cuda")
    per = {name: layer_bytes_per_token(s, model_stats(s), full, None)[0] for name, s in
           (("parallel", parallel), ("sequential", sequential))}
    # both LayerNorms of a parallel block read the block input: it is kept once (2 B x hidden less)
    assert per["sequential"] - per["parallel"] == 2 * 256


def _qlora_setup(**kw):
    lora = LoraSettings(rank=8, dropout=0.05, target_modules=LLAMA_ALL)
    kw.setdefault("grad_checkpointing", "none")
    kw.setdefault("bnb_keeps_input", True)
    return TrainingSetup(method="qlora", quant="nf4", precision="bf16", lora=lora, micro_batch=2, seq_len=512,
                         device="cuda", model_code="litgpt", loss="chunked-16bit", **kw)


def test_previous_step_keeps_its_logits_and_bitsandbytes_kept_inputs_through_the_next_forward():
    tiny = get_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    tokens = 2 * 512
    base = estimate_memory(tiny, _qlora_setup())
    kept = estimate_memory(tiny, _qlora_setup(previous_step_kept=True))
    inputs = quantised_inputs_per_token(tiny, model_stats(tiny), _qlora_setup())
    assert inputs == 2 * (2 * 2048 + 2048 + 5632)  # attention and MLP inputs, o_proj's and down_proj's
    previous = (2 * tiny.vocab_size + inputs * tiny.num_layers) * tokens
    component = next(c for c in kept.devices[0].components if c.name == "previous_step")
    assert component.bytes == previous and "bitsandbytes" in component.what
    assert _forward_phase_gib(kept) - _forward_phase_gib(base) == pytest.approx(previous / 2**30, abs=0.006)
    assert kept.devices[0].tensor_peak_bytes > base.devices[0].tensor_peak_bytes


@pytest.mark.parametrize("change", [
    {"grad_checkpointing": "full"},  # the recomputed graph is gone after each layer's backward
    {"bnb_keeps_input": False},  # bitsandbytes >= 0.43.2 keeps the weight only
])
def test_previous_step_without_kept_inputs_leaves_only_its_logits(change):
    tiny = get_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    base = _forward_phase_gib(estimate_memory(tiny, _qlora_setup(**change)))
    kept = _forward_phase_gib(estimate_memory(tiny, _qlora_setup(previous_step_kept=True, **change)))
    assert kept - base == pytest.approx(2 * tiny.vocab_size * 1024 / 2**30, abs=0.006)


def _forward_phase_gib(est) -> float:
    note = next(n for n in est.notes if n.startswith("tensor peak at the"))
    return float(note.split("(GiB): forward ")[1].split(",")[0])


def test_cli_model_code_flag():
    def run(*extra):
        out = subprocess.run([sys.executable, "-m", "trainfit", "estimate", "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
                              "--method", "lora", "--lora-targets", "all-linear", "--precision", "bf16",
                              "--hardware", "1x a10g", "--json", *extra], capture_output=True, text=True)
        return out
    hf, lit = run(), run("--model-code", "litgpt")
    assert hf.returncode == lit.returncode == 0, hf.stderr + lit.stderr
    peak = lambda out: json.loads(out.stdout)["devices"][0]["tensor_peak_bytes"]  # noqa: E731
    assert peak(lit) < peak(hf)
    kept = run("--model-code", "litgpt", "--previous-step-kept")
    assert kept.returncode == 0 and peak(kept) >= peak(lit)
    bad = run("--model-code", "megatron")
    assert bad.returncode == 2 and "--model-code" in bad.stderr and "litgpt" in bad.stderr


def test_sharded_peft_adapters_are_still_called_fp32():
    tiny = get_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0")
    setup = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings(rank=8), micro_batch=1, seq_len=256,
                          device="cuda", num_gpus=2, zero_stage=3, fsdp_strategy="full-shard")
    lora = next(c for c in estimate_memory(tiny, setup).devices[0].components if c.name == "lora")
    assert "x 4 B (fp32)" in lora.what


def test_litgpt_falcon_keeps_the_fused_attention_kernel():
    from trainfit.core.memory.activations import attention_kind

    falcon = get_model("tiiuae/falcon-7b")  # one key/value head
    setup = TrainingSetup(method="lora", precision="bf16", attention="sdpa", device="cuda", mqa_kv_unrepeated=True)
    # transformers before 5.25 hands SDPA the single key head, which only its math path broadcasts
    # (scores kept); LitGPT repeat_interleaves the keys first, so SDPA runs its fused kernel
    assert attention_kind(falcon, setup) == "eager"
    assert attention_kind(falcon, dataclasses.replace(setup, model_code="litgpt")) == "sdpa"
