"""The model's own dropout (ModelSpec hidden/attention/embedding_dropout): read from config.json,
written into the config `train` builds, and counted as what each dropout keeps for its backward."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from trainfit.core.memory import estimate_memory
from trainfit.core.memory.model_dropout import hidden_sites
from trainfit.core.models.catalog import get_model
from trainfit.core.models.loader import spec_from_config
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.errors import BadInputError

FIXTURES = Path(__file__).resolve().parents[1] / "models" / "fixtures"
BENCH = Path(__file__).resolve().parents[2] / "bench"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _drop(spec) -> tuple[float, float, float]:
    return spec.hidden_dropout, spec.attention_dropout, spec.embedding_dropout


@pytest.mark.parametrize("name, expected", [
    ("gpt_bigcode-santacoder", (0.1, 0.1, 0.1)),  # resid_pdrop, attn_pdrop, embd_pdrop
    ("bert-base-uncased", (0.1, 0.1, 0.1)),  # hidden_dropout_prob (also the embeddings'), attention_probs_...
    ("t5-small", (0.1, 0.1, 0.1)),  # dropout_rate everywhere
    ("falcon-7b", (0.0, 0.0, 0.0)),
    ("bloom-560m", (0.0, 0.0, 0.0)),
    ("qwen-7b", (0.0, 0.0, 0.0)),
])
def test_config_dropout_is_read_and_matches_the_catalog(name, expected):
    spec = spec_from_config(_fixture(name), origin=name)
    assert _drop(spec) == expected
    catalog = next(m for m in (get_model(name),) if m)
    assert _drop(catalog) == expected


def test_absent_keys_take_transformers_defaults():
    gpt2 = spec_from_config(dict(model_type="gpt2", n_embd=64, n_head=4, n_layer=2, vocab_size=128), origin="c")
    assert _drop(gpt2) == (0.1, 0.1, 0.1)  # GPT2Config's defaults
    phi = spec_from_config(dict(model_type="phi", hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                intermediate_size=256, vocab_size=128), origin="c")
    assert _drop(phi) == (0.0, 0.0, 0.0)
    phi2 = spec_from_config(dict(model_type="phi", hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                 intermediate_size=256, vocab_size=128, resid_pdrop=0.1), origin="c")
    assert _drop(phi2) == (0.1, 0.0, 0.0)
    assert _drop(get_model("microsoft/phi-2")) == (0.1, 0.0, 0.0)
    assert _drop(get_model("gpt2")) == (0.1, 0.1, 0.1)
    assert _drop(get_model("meta-llama/Llama-3.1-8B")) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("value", [1.0, -0.1, "0.1", True])
def test_a_dropout_that_is_not_a_probability_is_refused_by_key(value):
    cfg = dict(model_type="gpt2", n_embd=64, n_head=4, n_layer=2, vocab_size=128, resid_pdrop=value)
    with pytest.raises(BadInputError, match="'resid_pdrop' must be a probability in \\[0, 1\\)"):
        spec_from_config(cfg, origin="config.json")


def test_the_built_config_carries_the_specs_dropout():
    pytest.importorskip("transformers")
    from trainfit.train.hf_config import build_hf_config

    gpt2 = get_model("gpt2")
    cfg = build_hf_config(gpt2)
    assert (cfg.resid_pdrop, cfg.attn_pdrop, cfg.embd_pdrop) == (0.1, 0.1, 0.1)
    off = build_hf_config(dataclasses.replace(gpt2, hidden_dropout=0.0, attention_dropout=0.0, embedding_dropout=0.0))
    assert (off.resid_pdrop, off.attn_pdrop, off.embd_pdrop) == (0.0, 0.0, 0.0)
    assert build_hf_config(get_model("microsoft/phi-2")).resid_pdrop == 0.1


def _peak(spec, setup) -> int:
    return estimate_memory(spec, setup).devices[0].tensor_peak_bytes


def _acts(spec, setup) -> int:
    return {c.name: c.bytes for c in estimate_memory(spec, setup).devices[0].components}["activations"]


def test_cuda_keeps_a_one_byte_mask_per_hidden_dropout():
    """GPT-2 on CUDA (fused native_dropout, fused SDPA): two residual dropouts per block and one on the
    embeddings, 1 B per element each; the attention dropout runs inside the kernel and keeps nothing."""
    gpt2 = get_model("gpt2")
    setup = TrainingSetup(method="full", precision="bf16-mixed", micro_batch=4, seq_len=1024, device="cuda")
    off = dataclasses.replace(gpt2, hidden_dropout=0.0, attention_dropout=0.0, embedding_dropout=0.0)
    tokens, h = 4 * 1024, gpt2.hidden_size
    assert _acts(gpt2, setup) - _acts(off, setup) == tokens * h * (2 * gpt2.num_layers + 1)
    assert hidden_sites(gpt2) == 2


def test_dropout_off_where_the_run_turns_it_off():
    """TRL's DPOTrainer disables dropout, LitGPT's models have none, checkpointed layers recompute theirs."""
    gpt2 = get_model("gpt2")
    off = dataclasses.replace(gpt2, hidden_dropout=0.0, attention_dropout=0.0, embedding_dropout=0.0)
    lora = LoraSettings(rank=8, dropout=0.0, target_modules=["c_attn"])
    for setup in (TrainingSetup(method="dpo", lora=lora, micro_batch=1, seq_len=256, device="cuda"),
                  TrainingSetup(method="lora", lora=lora, micro_batch=1, seq_len=256, device="cuda",
                                model_code="litgpt")):
        assert _peak(gpt2, setup) == _peak(off, setup)
    ckpt = TrainingSetup(method="full", micro_batch=2, seq_len=512, device="cuda", grad_checkpointing="full")
    # checkpointed: through the forward only the embedding dropout's mask stays (a layer's own masks
    # exist while it is recomputed in backward)
    assert _acts(gpt2, ckpt) - _acts(off, ckpt) == 2 * 512 * gpt2.hidden_size


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("precision, attention", [("fp32", "sdpa"), ("bf16-mixed", "eager")])
def test_cpu_live_peak_with_model_dropout_matches(precision, attention):
    """On CPU the noise tensors (input dtype) and, under SDPA, the math path that attention dropout forces:
    the live-tensor counter of bench/memory_accuracy.py on a tiny GPT-2 with all three dropouts at 0.1."""
    pytest.importorskip("transformers")
    bench = _bench("memory_accuracy")
    spec = bench.ARCHS["gpt2-dropout"]
    setup = bench._s(micro_batch=2, seq_len=256, precision=precision, attention=attention)
    measured = bench.measure(spec, setup)
    assert _peak(spec, setup) == pytest.approx(measured, rel=0.02)


def test_dropped_elements_count_every_site_and_the_materialised_scores():
    from trainfit.core.memory.model_dropout import dropped_elements_per_token

    gpt2 = get_model("gpt2")
    setup = TrainingSetup(method="full", micro_batch=1, seq_len=512)
    blocks = gpt2.num_layers * 2 * gpt2.hidden_size + gpt2.hidden_size
    assert dropped_elements_per_token(gpt2, setup, False) == blocks
    assert dropped_elements_per_token(gpt2, setup, True) == blocks + gpt2.num_layers * gpt2.num_heads * 512
    assert dropped_elements_per_token(gpt2, dataclasses.replace(setup, method="dpo"), True) == 0
    assert dropped_elements_per_token(get_model("meta-llama/Llama-3.1-8B"), setup, True) == 0


def test_speed_charges_the_model_dropout():
    """CPU: masks drawn at the profile's measured rate (again in a recompute); GPU: native_dropout's bytes."""
    from trainfit.core.memory.model_dropout import dropped_elements_per_token
    from trainfit.core.speed import flops as F
    from trainfit.core.speed.cpu import cpu_step
    from trainfit.core.speed.predict import predict_step
    from trainfit.core.speed.rates import gpu_spec_rates
    from trainfit.core.machines.gpu_catalog import get_gpu

    gpt2 = get_model("gpt2")
    off = dataclasses.replace(gpt2, hidden_dropout=0.0, attention_dropout=0.0, embedding_dropout=0.0)
    cpu = TrainingSetup(method="full", precision="fp32", micro_batch=2, seq_len=256, device="cpu")
    rates = _cpu_rates(dropout_ns=20.0)
    step = cpu_step(gpt2, cpu, rates, F.step_flops(gpt2, cpu), "fp32", rates.peak_flops["fp32"])
    dropped = dropped_elements_per_token(gpt2, cpu, True) * 2 * 256  # attention dropout: the math path
    assert step.dropout_seconds == pytest.approx(dropped * 20e-9)
    ckpt = dataclasses.replace(cpu, grad_checkpointing="full")
    assert cpu_step(gpt2, ckpt, rates, F.step_flops(gpt2, ckpt), "fp32", 1e11).dropout_seconds == pytest.approx(
        2 * dropped * 20e-9)
    assert predict_step(gpt2, cpu, rates).step_seconds > predict_step(off, cpu, rates).step_seconds + dropped * 20e-9
    gpu = dataclasses.replace(cpu, device="cuda", precision="bf16-mixed")
    a100 = gpu_spec_rates(get_gpu("a100-80gb"))
    assert predict_step(gpt2, gpu, a100).step_seconds > predict_step(off, gpu, a100).step_seconds


def _cpu_rates(dropout_ns: float):
    from trainfit.core.speed.rates import DeviceRates

    return DeviceRates(kind="cpu", name="test CPU", architecture="avx2", count=1, peak_flops={"fp32": 1e11, "bf16": 2e9},
                       measured=True, ceiling=0.8, half_hidden=64, half_tokens=64, memory_bandwidth_bytes_per_s=25e9,
                       memory_efficiency=0.8, op_overhead_seconds=1e-5, link_kind="none", link_bytes_per_s=0.0,
                       pcie_bytes_per_s=0.0, host_bandwidth_bytes_per_s=25e9, tdp_watts=None, cache_bytes=32 * 2**20,
                       dropout_seconds_per_element=dropout_ns * 1e-9)


def test_sites_follow_each_models_code():
    """GPT-NeoX drops its embeddings with hidden_dropout; Phi-3 never applies embd_pdrop; rotary falcon
    passes dropout_p=0 to SDPA, so its attention_dropout is not counted."""
    neox = spec_from_config(dict(model_type="gpt_neox", hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                 intermediate_size=256, vocab_size=128, hidden_dropout=0.1), origin="c")
    assert _drop(neox) == (0.1, 0.0, 0.1)
    phi3 = spec_from_config(dict(model_type="phi3", hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                 intermediate_size=256, vocab_size=128, embd_pdrop=0.1), origin="c")
    assert _drop(phi3) == (0.0, 0.0, 0.0)
    falcon = dict(_fixture("falcon-7b"), attention_dropout=0.1)
    assert spec_from_config(falcon, origin="falcon").attention_dropout == 0.0


def test_mps_keeps_noise_like_the_cpu():
    """ATen fuses dropout into a bool mask on CUDA and XPU tensors only."""
    from trainfit.core.memory.model_dropout import block_bytes_per_token, eager_scores_extra_bytes

    gpt2 = get_model("gpt2")
    mps = TrainingSetup(method="full", precision="fp32", micro_batch=1, seq_len=256, device="mps")
    cuda = dataclasses.replace(mps, device="cuda")
    h, f = gpt2.hidden_size, gpt2.intermediate_size
    assert block_bytes_per_token(gpt2, cuda, f, 4, True) == 2 * h * 1
    assert block_bytes_per_token(gpt2, mps, f, 4, True) == 2 * h * 4
    assert eager_scores_extra_bytes(gpt2, cuda, 4, False) == 1 + 4  # mask + the dropped copy
    assert eager_scores_extra_bytes(gpt2, mps, 4, False) == 4 + 4  # noise + the dropped copy


def test_lora_dropout_on_mps_keeps_noise_like_the_cpu():
    """PEFT's LoRA dropout goes through the same ATen dropout: a bool mask on CUDA, noise of the
    input dtype on MPS (one rule for the model's dropout and the adapters')."""
    from trainfit.core.memory.layer_activations import layer_bytes_per_token
    from trainfit.core.memory.stats import lora_stats, model_stats

    spec = dataclasses.replace(get_model("gpt2"), hidden_dropout=0.0, attention_dropout=0.0,
                               embedding_dropout=0.0)
    lora = LoraSettings(rank=8, dropout=0.1, target_modules=["c_attn"])
    cuda = TrainingSetup(method="lora", precision="fp32", micro_batch=1, seq_len=256, device="cuda", lora=lora)
    mps = dataclasses.replace(cuda, device="mps")
    _, where = lora_stats(spec, lora.target_modules, lora.rank)
    st = model_stats(spec)
    per_cuda, _ = layer_bytes_per_token(spec, st, cuda, where)
    per_mps, _ = layer_bytes_per_token(spec, st, mps, where)
    # one adapted module (c_attn) reading the hidden-width norm output: fp32 noise instead of a bool
    assert per_mps - per_cuda == (4 - 1) * spec.hidden_size
