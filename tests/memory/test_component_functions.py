"""Each memory component function on its own, on a tiny Llama-like model whose figures are worked
out by hand below: 2 layers, hidden 64, 4 heads of 16 (no key groups), SwiGLU width 128, vocab 1000,
untied lm_head.

Parameters: per layer q, k, v, o 4 x 64 x 64 = 16384, gate, up, down 3 x 64 x 128 = 24576 and two
RMSNorms 128: 41088; embeddings and lm_head 64000 each, final norm 64: 210240 in all."""

from __future__ import annotations

import dataclasses

import pytest

from trainfit.core.memory.gradients import gradient_bytes
from trainfit.core.memory.layer_activations import (attention_core_bytes, layer_bytes_per_token, layer_of,
                                                    mlp_terms, norm_bytes, norm_terms)
from trainfit.core.memory.loss import loss_bytes
from trainfit.core.memory.optimizer_states import optimizer_state_bytes
from trainfit.core.memory.phases import phase_peaks, training_parts
from trainfit.core.memory.saved_activations import activation_bytes
from trainfit.core.memory.states import model_states
from trainfit.core.memory.stats import model_stats
from trainfit.core.memory.step import training_step
from trainfit.core.memory.transients import transient_bytes
from trainfit.core.memory.weights import reference_model_bytes, weights_bytes
from trainfit.core.memory import estimate_memory
from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import runtime_of
from trainfit.core.setup import TrainingSetup

PER_LAYER = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64
PARAMS = 2 * PER_LAYER + 2 * 1000 * 64 + 64
VOCAB, HIDDEN = 1000, 64


@pytest.fixture(scope="module")
def tiny():
    return ModelSpec(id="shape:tiny-llama", architecture="llama", vocab_size=VOCAB, hidden_size=HIDDEN,
                     num_layers=2, num_heads=4, num_kv_heads=4, head_dim=16, intermediate_size=128,
                     activation="silu", gated_mlp=True, tie_embeddings=False, position="rope",
                     max_position_embeddings=256, norm="rmsnorm", qkv_bias=False, o_bias=False,
                     mlp_bias=False, lm_head_bias=False)


def _step(spec, **knobs):
    setup = TrainingSetup(**{"method": "full", "precision": "fp32", "micro_batch": 2, "seq_len": 32,
                             "device": "cuda", "attention": "sdpa", **knobs})
    st = model_stats(spec)
    return training_step(spec, st, setup, model_states(spec, st, setup, 0), None)


def test_the_hand_count_of_parameters(tiny):
    st = model_stats(tiny)
    assert (st.total, st.per_layer) == (PARAMS, PER_LAYER) == (210240, 41088)


def test_weights_are_four_bytes_a_parameter_in_fp32(tiny):
    assert weights_bytes(_step(tiny)) == 4 * PARAMS


def test_a_separate_dpo_reference_is_a_second_copy_of_the_weights(tiny):
    assert reference_model_bytes(_step(tiny)) == (0.0, 0.0)  # not DPO: no reference
    assert reference_model_bytes(_step(tiny, method="dpo", dpo_reference="separate")) == (4 * PARAMS, 0.0)


def test_fp32_adamw_holds_two_moments_and_foreach_one_more_for_its_step(tiny):
    fused = optimizer_state_bytes(_step(tiny))
    assert (fused.optimizer_bytes, fused.master_weights_bytes, fused.step_temporary_bytes) == (8 * PARAMS, 0, 0)
    foreach = optimizer_state_bytes(_step(tiny, optimizer_impl="foreach"))
    assert foreach.step_temporary_bytes == 4 * PARAMS  # torch._foreach_sqrt of every second moment


def test_gradients_by_the_time_they_are_alive(tiny):
    grads = gradient_bytes(_step(tiny))
    assert grads.accumulated_bytes == 0.0  # no accumulation: nothing kept across micro-steps
    assert grads.lm_head_bytes == grads.embedding_temporary_bytes == VOCAB * HIDDEN * 4
    assert grads.at_backward_end_bytes == 4 * PARAMS
    assert grads.per_layer_bytes == pytest.approx(4 * PER_LAYER)
    accumulating = gradient_bytes(_step(tiny, grad_accum=2))
    assert accumulating.accumulated_bytes == 4 * PARAMS and accumulating.per_layer_bytes == 0.0


def test_one_layer_part_by_part(tiny):
    layer = layer_of(tiny, model_stats(tiny), _step(tiny).setup, None)
    # RMSNorm: fp32 input 4h, rsqrt 4 B, the normalised output for its weight's gradient 4h
    assert norm_bytes(layer) == 4 * 64 + 4 + 4 * 64
    # two norms, each output saved once for its readers (no autocast: one shared fp32 tensor)
    assert norm_terms(layer) == [2 * 516, 4 * 64, 4 * 64]
    # SDPA: q, k, v and the output (4 B x 64 each) and a fp32 logsumexp per head
    assert attention_core_bytes(layer) == 4 * (2 * 64 + 2 * 64) + 4 * 4
    # SwiGLU: gate, act(gate), up and their product, 4 B x 128 each
    assert mlp_terms(layer) == ([4 * 4 * 128, 0.0], [])
    assert layer_bytes_per_token(tiny, model_stats(tiny), layer.setup, None) == (1032 + 512 + 1040 + 2048, 1040)


def test_activations_under_checkpointing(tiny):
    tokens = 2 * 32
    plain = activation_bytes(_step(tiny))
    assert plain.layer_bytes == 4632 * tokens
    assert plain.saved_layers_bytes == 2 * 4632 * tokens and plain.recompute_bytes == 0.0
    full = activation_bytes(_step(tiny, grad_checkpointing="full"))
    # one fp32 hidden state per layer kept, one layer recomputed at a time
    assert full.saved_layers_bytes == 2 * 4 * HIDDEN * tokens
    assert full.recompute_bytes == plain.layer_bytes
    assert full.what.startswith("full checkpointing: 2 layer inputs")
    assert full.autocast_cache_bytes == 0.0  # fp32: no autocast, no 16-bit weight copies


def test_autocast_caches_16bit_copies_of_the_trained_weights(tiny):
    mixed = activation_bytes(_step(tiny, precision="bf16-mixed"))
    st = model_stats(tiny)
    assert mixed.autocast_cache_bytes == 2.0 * (st.linear + st.lm_head)


def test_dpo_loss_keeps_logits_and_three_logits_sized_grads(tiny):
    loss = loss_bytes(_step(tiny, method="dpo", micro_batch=1))
    tokens = 2 * 32  # chosen + rejected
    assert (loss.saved, loss.forward, loss.backward) == (4 * VOCAB * tokens, 4 * VOCAB * tokens,
                                                         3 * 4 * VOCAB * tokens)


def test_the_standard_loss_saves_fp32_log_softmax_and_holds_two_grads_in_backward(tiny):
    loss = loss_bytes(_step(tiny))
    tokens = 2 * 32
    assert loss.saved == 4 * VOCAB * tokens
    assert loss.backward == 8 * VOCAB * tokens


def test_transients(tiny):
    step = _step(tiny, output_kept=True)
    tmp = transient_bytes(step, layer_bytes=1000.0)
    assert tmp.kept_output_bytes == 4 * VOCAB * 64  # the returned fp32 logits, every token
    assert tmp.dequant_bytes == 0.0 and tmp.reference_forward_bytes == 0.0 and tmp.kv_cache_bytes == 0.0
    dpo = transient_bytes(_step(tiny, method="dpo", micro_batch=1), layer_bytes=1000.0)
    assert dpo.reference_forward_bytes == 4 * VOCAB * 64 + 500.0  # reference logits + half a layer


def test_the_optimizer_step_phase_holds_weights_gradients_and_states(tiny):
    step = _step(tiny)
    peaks = phase_peaks(step, training_parts(step))
    assert peaks.phases["optimizer step"] == 16 * PARAMS  # 4 weights + 4 gradients + 8 moments
    assert peaks.peak_phase == max(peaks.phases, key=peaks.phases.get)


def test_margins_sit_on_top_of_the_tensor_peak(tiny):
    device = estimate_memory(tiny, _step(tiny).setup).devices[0]
    assert device.tensor_peak_bytes == sum(c.bytes for c in device.components if c.in_tensor_peak)
    assert device.total_bytes == sum(c.bytes for c in device.components)
    assert device.total_bytes > device.tensor_peak_bytes  # CUDA context and allocator margins


def test_the_runtime_record_reads_each_knob_once(tiny):
    assert runtime_of(TrainingSetup(device="cpu")).optimizer_impl == "for-loop"
    assert runtime_of(TrainingSetup(device="cuda")).optimizer_impl == "fused"
    qlora = TrainingSetup(method="qlora", quant="nf4", precision="bf16", bnb_fp16_quant_state=True)
    assert runtime_of(qlora).dequant_copies == 2
    assert runtime_of(dataclasses.replace(qlora, bnb_fp16_quant_state=False)).dequant_copies == 1
    assert runtime_of(TrainingSetup(fsdp_strategy="full-shard", fsdp_no_sync=True, grad_accum=4,
                                    num_gpus=2)).fsdp_no_sync


def test_the_runtime_record_follows_the_setup_it_is_asked_for():
    cpu, cuda = TrainingSetup(device="cpu"), TrainingSetup(device="cuda")
    assert runtime_of(cpu) is runtime_of(cpu)  # read once, however often an estimate asks
    assert [runtime_of(s).optimizer_impl for s in (cpu, cuda, cpu)] == ["for-loop", "fused", "for-loop"]
