"""Closed forms of the memory model (ZeRO paper, QLoRA paper, KV cache)."""

import dataclasses

import pytest

from trainfit.core.memory import estimate_memory
from trainfit.core.memory.inference import kv_cache_bytes
from trainfit.core.memory.states import model_states, weight_bytes
from trainfit.core.memory.stats import model_stats
from trainfit.core.models.catalog import get_model
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.errors import BadInputError


@pytest.fixture(scope="module")
def llama7b():
    return get_model("meta-llama/Llama-3.1-8B")


def _states(spec, **kw):
    setup = TrainingSetup(**kw)
    return model_states(spec, model_stats(spec), setup, 0)


def test_adamw_mixed_precision_is_16_bytes_per_param(llama7b):
    """ZeRO paper (Rajbhandari et al. 2020, sec. 3.1): mixed-precision Adam = 16 B/param."""
    s = _states(llama7b, precision="bf16-mixed", optimizer="adamw")
    p = model_stats(llama7b).total
    assert s.weights + s.gradients + s.optimizer + s.master_weights == pytest.approx(16 * p)
    z = _states(llama7b, precision="bf16-mixed", optimizer="adamw", zero_stage=1, num_gpus=2)
    # ZeRO-1 on 2 GPUs: 16-bit weights + grads replicated, fp32 master/moments/grad partition halved.
    assert z.weights + z.gradients + z.optimizer + z.master_weights == pytest.approx((2 + 2 + 16 / 2) * p)


def test_zero2_on_two_gpus_halves_grads_and_optimizer(llama7b):
    z1 = _states(llama7b, zero_stage=2, num_gpus=1, offload="none")
    z2 = _states(llama7b, zero_stage=2, num_gpus=2)
    p = model_stats(llama7b).total
    # DeepSpeed: 2P + 18P/N (PR #5099): per GPU the sharded part halves.
    assert (z2.optimizer + z2.master_weights) == pytest.approx((z1.optimizer + z1.master_weights) / 2)
    assert z2.weights + z2.gradients + z2.optimizer + z2.master_weights == pytest.approx(2 * p + 18 * p / 2)


def test_zero3_shards_weights(llama7b):
    z3 = _states(llama7b, zero_stage=3, num_gpus=8)
    p = model_stats(llama7b).total
    assert z3.weights == pytest.approx(2 * p / 8)
    assert z3.gathered > 0


def test_nf4_bytes_as_bitsandbytes_stores_them(llama7b):
    """QLoRA paper (Dettmers et al. 2023): NF4 0.5 B + fp32 absmax per 64 (0.0625 B);
    double quantisation: uint8 per 64 + fp32 per 256 blocks = 8/64 + 32/(64*256) bits."""
    st = model_stats(llama7b)
    _, q_nf4, _ = weight_bytes(st, TrainingSetup(method="qlora", quant="nf4", precision="bf16"))
    _, q_dq, _ = weight_bytes(st, TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16"))
    assert q_nf4 == pytest.approx(st.linear * 4 / 64)
    assert q_dq * 8 / st.linear == pytest.approx(8 / 64 + 32 / (64 * 256))
    w, _, _ = weight_bytes(st, TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16"))
    # Embeddings and lm_head stay 16-bit.
    assert w == pytest.approx(st.linear / 2 + 2 * (st.total - st.linear))


def test_kv_cache_gqa_and_sliding_window():
    m = get_model("mistralai/Mistral-7B-v0.1") if _has("mistralai/Mistral-7B-v0.1") else None
    spec = m or get_model("meta-llama/Meta-Llama-3-8B")
    total, _ = kv_cache_bytes(spec, 1, 1000, 2)
    assert total == 2 * spec.num_layers * 1000 * spec.num_kv_heads * spec.head_dim * 2
    windowed = dataclasses.replace(spec, sliding_window=512)
    capped, _ = kv_cache_bytes(windowed, 1, 1000, 2)
    assert capped == pytest.approx(total * 512 / 1000)


def _has(name):
    try:
        get_model(name)
        return True
    except BadInputError:
        return False


def test_peak_timing_grad_accum_keeps_gradients(llama7b):
    one = estimate_memory(llama7b, TrainingSetup(grad_accum=1, seq_len=2048)).devices[0]
    acc = estimate_memory(llama7b, TrainingSetup(grad_accum=4, seq_len=2048)).devices[0]
    assert acc.tensor_peak_bytes > one.tensor_peak_bytes


def test_checkpointing_and_eager(llama7b):
    base = TrainingSetup(seq_len=4096, micro_batch=8)
    none = estimate_memory(llama7b, base).devices[0].tensor_peak_bytes
    ckpt = estimate_memory(llama7b, dataclasses.replace(base, grad_checkpointing="full")).devices[0].tensor_peak_bytes
    eager = estimate_memory(llama7b, dataclasses.replace(base, attention="eager")).devices[0].tensor_peak_bytes
    assert ckpt < none < eager


def test_offload_predicts_cpu_ram(llama7b):
    est = estimate_memory(llama7b, TrainingSetup(zero_stage=2, num_gpus=2, offload="optimizer"))
    names = [d.device for d in est.devices]
    assert names == ["cuda:0", "cpu"]
    assert est.devices[1].tensor_peak_bytes == pytest.approx(16 * model_stats(llama7b).total, rel=0.01)


def test_lora_on_missing_module_names_valid_ones(llama7b):
    with pytest.raises(BadInputError, match="q_proj"):
        estimate_memory(llama7b, TrainingSetup(method="lora", lora=LoraSettings(target_modules=["c_attn"])))


def test_components_state_their_formula(llama7b):
    est = estimate_memory(llama7b, TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16",
                                                 lora=LoraSettings()))
    dev = est.devices[0]
    assert dev.total_bytes > dev.tensor_peak_bytes
    assert sum(c.bytes for c in dev.components if c.in_tensor_peak) == dev.tensor_peak_bytes
    assert all(c.what for c in dev.components)
    assert {"weights", "quant_overhead", "lora", "optimizer"} <= {c.name for c in dev.components}
