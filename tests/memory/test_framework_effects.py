"""Framework knobs (trainfit.core.memory.framework_effects): foreach AdamW's step temporary,
bitsandbytes before 0.43.2 keeping 4-bit inputs, FSDP units mixing frozen weights and adapters,
PEFT's fp32 upcast of a k-bit base, LitGPT's 16-bit chunked loss, FSDP's no_sync accumulation, and
Lightning's bitsandbytes plugin (quantised lm_head, fp16 quant state), transformers 5's fused MoE
experts, which bitsandbytes leaves 16-bit, and transformers < 4.52's reentrant checkpoint around FSDP
units, which holds every layer's input gradient.

Each effect is checked against a hand calculation from the model's shapes."""

import dataclasses
import json
import subprocess
import sys

import pytest

from trainfit.core.memory import estimate_memory
from trainfit.core.memory.activations import attention_kind, loss_bytes_per_token
from trainfit.core.memory.layer_activations import layer_bytes_per_token
from trainfit.core.memory.framework_effects import cached_kv_bytes_per_token, no_sync_gradient_bytes
from trainfit.core.memory.fsdp import root_params
from trainfit.core.memory.loss_kernels import loss_terms
from trainfit.core.memory.states import model_states
from trainfit.core.memory.stats import lora_stats, model_stats
from trainfit.core.runtime import (
    bnb_keeps_input_for,
    cache_under_checkpointing_for,
    checkpoint_around_units_for,
    experts_fused_for,
    logits_returned_fp32_for,
    logits_shift_copy_for,
    mqa_kv_unrepeated_for,
    runtime_of,
    transformers_knobs,
)
from trainfit.core.models.catalog import get_model
from trainfit.core.models.loader import spec_from_config
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.errors import BadInputError


@pytest.fixture(scope="module")
def llama():
    return get_model("meta-llama/Llama-3.1-8B")


def _phases(est) -> dict[str, float]:
    """The phase peaks the estimate notes, in GiB."""
    note = next(n for n in est.notes if n.startswith("tensor peak at the"))
    return {k.strip(): float(v) for k, v in (p.rsplit(" ", 1) for p in note.split(": ", 1)[1].split(", "))}


def test_foreach_adamw_holds_one_moment_more_at_the_step(llama):
    st = model_stats(llama)
    base = TrainingSetup(method="full", precision="bf16", micro_batch=1, seq_len=128)
    fused = estimate_memory(llama, base)
    foreach = estimate_memory(llama, dataclasses.replace(base, optimizer_impl="foreach"))
    # pure bf16: moments are bf16, so the sqrt temporary is 2 B x every parameter
    step_gib = 2 * st.total / 2**30
    assert _phases(foreach)["optimizer step"] == pytest.approx(_phases(fused)["optimizer step"] + step_gib, abs=0.01)
    assert foreach.devices[0].tensor_peak_bytes > fused.devices[0].tensor_peak_bytes
    names = {c.name for c in foreach.devices[0].components}
    assert "optimizer_step_temporary" in names


def test_foreach_temporary_is_sharded_and_absent_under_deepspeed(llama):
    st = model_stats(llama)
    fsdp = TrainingSetup(method="full", precision="bf16-mixed", num_gpus=4, zero_stage=3, fsdp_strategy="full-shard")
    a = _phases(estimate_memory(llama, fsdp))["optimizer step"]
    b = _phases(estimate_memory(llama, dataclasses.replace(fsdp, optimizer_impl="foreach")))["optimizer step"]
    assert b - a == pytest.approx(4 * st.total / 4 / 2**30, abs=0.01)  # fp32 moment, a quarter per GPU
    ds = TrainingSetup(method="full", precision="bf16-mixed", num_gpus=4, zero_stage=2)
    assert (_phases(estimate_memory(llama, ds)) ==
            _phases(estimate_memory(llama, dataclasses.replace(ds, optimizer_impl="foreach"))))


def test_old_bitsandbytes_keeps_every_4bit_layer_input(llama):
    st = model_stats(llama)
    lora = LoraSettings(rank=16, target_modules=["q_proj", "v_proj"])
    _, where = lora_stats(llama, lora.target_modules, lora.rank)
    q = TrainingSetup(method="qlora", precision="bf16", quant="nf4", lora=lora)
    new, _ = layer_bytes_per_token(llama, st, q, where)
    old, _ = layer_bytes_per_token(llama, st, dataclasses.replace(q, bnb_keeps_input=True), where)
    h, f = llama.hidden_size, llama.intermediate_size
    q_width = llama.num_heads * llama.head_dim
    # attention input, MLP input, o_proj input, down_proj input: 16-bit each (LLM.int8's term)
    assert old - new == 2 * (2 * h + q_width + f)
    int8, _ = layer_bytes_per_token(llama, st, dataclasses.replace(q, quant="int8"), where)
    assert int8 - layer_bytes_per_token(llama, st, dataclasses.replace(q, quant="int8", bnb_keeps_input=True),
                                        where)[0] == 0


@pytest.mark.parametrize("version,keeps", [("0.41.1", True), ("0.43.1", True), ("0.43.2", False),
                                           ("0.45.0.dev0", False), ("v0.42", True), ("1.0", False)])
def test_bitsandbytes_version_boundary(version, keeps):
    assert bnb_keeps_input_for(version) is keeps


@pytest.mark.parametrize("version,copies", [("4.37.2", True), ("4.39.0.dev0", True), ("4.48.1", True),
                                            ("4.49.0", False), ("v4.57", False), ("5.0.0", False)])
def test_transformers_version_boundary(version, copies):
    assert logits_shift_copy_for(version) is copies


def test_old_transformers_loss_copies_the_shifted_fp32_logits(llama):
    s = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings())
    tokens = 1024
    new = loss_terms(llama, s, tokens, head_trains=False)
    old = loss_terms(llama, dataclasses.replace(s, logits_shift_copy=True), tokens, head_trains=False)
    v = llama.vocab_size
    assert old.forward - new.forward == 4 * v * tokens  # the fp32 copy, in the loss forward only
    assert (old.saved, old.backward) == (new.saved, new.backward)
    assert "copies the shifted fp32 logits" in old.what


@pytest.mark.parametrize("version,fp32", [("4.37.2", True), ("4.45.2", True), ("4.46.0", False), ("4.48.1", False)])
def test_transformers_returned_fp32_logits_before_4_46(version, fp32):
    assert logits_returned_fp32_for(version) is fp32


def test_before_4_46_the_forward_frees_the_16bit_logits_it_upcast(llama):
    s = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings(), logits_shift_copy=True)
    tokens = 1024
    v = llama.vocab_size
    v448 = loss_terms(llama, s, tokens, head_trains=False)
    v437 = loss_terms(llama, dataclasses.replace(s, logits_returned_fp32=True), tokens, head_trains=False)
    assert v448.forward == (2 + 4 + 4) * v * tokens  # bf16 logits (kept by the caller), fp32 upcast, copy
    assert v437.forward == (4 + 4) * v * tokens  # fp32 logits and their copy only


def test_a_loop_that_keeps_the_output_holds_its_logits_through_backward(llama):
    s = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings(), micro_batch=2, seq_len=1024,
                      grad_checkpointing="full")
    tokens = 2048
    dropped = estimate_memory(llama, s)
    kept = estimate_memory(llama, dataclasses.replace(s, output_kept=True))
    v = llama.vocab_size
    p0, p1 = _phases(dropped), _phases(kept)
    for phase in ("loss backward", "layer backward", "optimizer step"):
        assert (p1[phase] - p0[phase]) * 2**30 == pytest.approx(2 * v * tokens, abs=0.01 * 2**30)  # bf16 logits; notes round to 0.01 GiB
    assert p1["forward"] == p0["forward"]
    older = estimate_memory(llama, dataclasses.replace(s, output_kept=True, logits_returned_fp32=True,
                                                       logits_shift_copy=True))
    assert (_phases(older)["loss backward"] - p0["loss backward"]) * 2**30 == pytest.approx(4 * v * tokens, abs=0.01 * 2**30)
    if kept.devices[0].tensor_peak_bytes > dropped.devices[0].tensor_peak_bytes:
        names = [c.name for c in kept.devices[0].components]
        assert "kept_output" in names


def test_old_gpt_bigcode_loss_runs_on_16bit_logits_unless_autocast():
    bigcode = spec_from_config(dict(model_type="gpt_bigcode", n_embd=2048, n_head=16, n_layer=24, n_inner=8192,
                                    vocab_size=49280, n_positions=2048, multi_query=True))
    s = TrainingSetup(precision="bf16", logits_shift_copy=True)
    tokens = 1024
    t = loss_terms(bigcode, s, tokens, head_trains=True)
    v = bigcode.vocab_size
    # logits, their shifted copy and log_softmax's output, all bf16; no fp32 anywhere
    assert (t.saved, t.forward, t.backward) == (2 * v * tokens, 4 * v * tokens, 4 * v * tokens)
    assert "no fp32 upcast" in t.what
    current = loss_terms(bigcode, dataclasses.replace(s, logits_shift_copy=False), tokens, head_trains=True)
    assert current.saved == 4 * v * tokens  # 4.49+: ForCausalLMLoss upcasts for every architecture
    autocast = loss_terms(bigcode, dataclasses.replace(s, precision="bf16-mixed"), tokens, head_trains=True)
    assert autocast.saved == 4 * v * tokens  # autocast runs log_softmax in fp32


def test_fsdp_mixed_units_keep_gradients_for_every_decoder_weight(llama):
    st = model_stats(llama)
    lora = LoraSettings(rank=8, target_modules=["q_proj", "v_proj"])
    params, _ = lora_stats(llama, lora.target_modules, lora.rank)
    s = TrainingSetup(method="lora", precision="bf16", lora=lora, num_gpus=2, zero_stage=3, fsdp_strategy="full-shard")
    apart = model_states(llama, st, s, params)
    mixed = model_states(llama, st, dataclasses.replace(s, fsdp_mixed_units=True), params)
    assert apart.gradients == pytest.approx(params * 4 / 2)
    assert mixed.gradients == pytest.approx((st.total - root_params(st)) * 2 / 2)
    # in a layer's backward, unsharded gradients in the 16-bit compute dtype: FSDP2 the layer's and the
    # previous one's reduce-scatter input, FSDP1 the layer's alone
    assert mixed.gathered - apart.gathered == pytest.approx(2 * st.per_layer * 2)
    flat = dataclasses.replace(s, fsdp_flat_params=True)
    assert (model_states(llama, st, dataclasses.replace(flat, fsdp_mixed_units=True), params).gathered
            - model_states(llama, st, flat, params).gathered) == pytest.approx(st.per_layer * 2)


def test_peft_kbit_upcast_makes_the_rest_fp32_unless_sharded(llama):
    st = model_stats(llama)
    lora = LoraSettings()
    params, _ = lora_stats(llama, lora.target_modules, lora.rank)
    q = TrainingSetup(method="qlora", precision="bf16", quant="nf4", lora=lora)
    kept = model_states(llama, st, q, params)
    upcast = model_states(llama, st, dataclasses.replace(q, kbit_upcast=True), params)
    assert upcast.weights - kept.weights == pytest.approx(2 * (st.total - st.linear))
    with_ckpt = dataclasses.replace(q, grad_checkpointing="full")
    a = estimate_memory(llama, with_ckpt)
    b = estimate_memory(llama, dataclasses.replace(with_ckpt, kbit_upcast=True))
    assert b.devices[0].tensor_peak_bytes > a.devices[0].tensor_peak_bytes
    sharded = dataclasses.replace(q, num_gpus=2, zero_stage=3, fsdp_strategy="full-shard")
    assert (model_states(llama, st, sharded, params).weights
            == model_states(llama, st, dataclasses.replace(sharded, kbit_upcast=True), params).weights)


def test_chunked_16bit_loss_keeps_two_16bit_logits_and_no_fp32(llama):
    s = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings(), loss="chunked-16bit")
    tokens = 1024
    t = loss_terms(llama, s, tokens, head_trains=False)
    v = llama.vocab_size
    assert t.saved == 2 * 2 * v * tokens
    assert t.backward == 2 * 2 * v * 128
    standard = loss_terms(llama, dataclasses.replace(s, loss="standard"), tokens, head_trains=False)
    assert t.saved + t.backward < standard.saved + standard.backward


def test_fsdp_no_sync_keeps_every_trained_unit_unsharded_between_micro_batches(llama):
    st = model_stats(llama)
    full = TrainingSetup(method="full", precision="bf16", num_gpus=4, zero_stage=3, fsdp_strategy="full-shard",
                         grad_accum=4, grad_checkpointing="full")
    synced = _phases(estimate_memory(llama, full))
    no_sync = _phases(estimate_memory(llama, dataclasses.replace(full, fsdp_no_sync=True)))
    # accumulation micro-steps: the whole model's bf16 gradient instead of a quarter of it
    # (bench/fsdp_no_sync_cpu.py); no layer's gradient is being reduced in a forward
    extra_gib = (2 * st.total - 2 * st.total / 4) / 2**30
    assert no_sync["forward"] == pytest.approx(synced["forward"] + extra_gib, abs=0.01)
    # at the step both hold shards (the last micro-batch reduce-scatters) and nothing gathered
    assert no_sync["optimizer step"] == pytest.approx(synced["optimizer step"], abs=0.01)
    # LoRA: adapters in their own units keep only themselves; inside the frozen layer's unit, every
    # decoder weight (LitGPT's Blocks)
    lora = dataclasses.replace(full, method="lora", lora=LoraSettings())
    trainable, _ = lora_stats(llama, lora.lora.target_modules, lora.lora.rank)
    assert no_sync_gradient_bytes(st, dataclasses.replace(lora, fsdp_no_sync=True), trainable) == 4 * trainable
    mixed = dataclasses.replace(lora, fsdp_no_sync=True, fsdp_mixed_units=True)
    assert no_sync_gradient_bytes(st, mixed, trainable) == 2 * (st.total - root_params(st))
    one_micro = dataclasses.replace(full, grad_accum=1)
    with pytest.raises(BadInputError, match="--grad-accum 2"):
        estimate_memory(llama, dataclasses.replace(one_micro, fsdp_no_sync=True))


def test_fsdp_holds_the_lm_head_gradient_unsharded_until_the_root_unit_reduces(llama):
    full = TrainingSetup(method="full", precision="bf16", num_gpus=8, zero_stage=3, fsdp_strategy="full-shard",
                         grad_accum=4, micro_batch=1, seq_len=512, grad_checkpointing="full")
    est = estimate_memory(llama, full)
    comps = {c.name: c.bytes for c in est.devices[0].components}
    assert est.notes[0].startswith("tensor peak at the layer backward")
    head = llama.vocab_size * llama.hidden_size * 2  # bf16, unsharded
    assert comps["lm_head_gradient"] == head
    assert comps["gradients"] == pytest.approx(model_stats(llama).total * 2 / 8)  # the accumulated shards
    # under no_sync it accumulates into the root unit's unsharded gradient: nothing apart
    no_sync = estimate_memory(llama, dataclasses.replace(full, fsdp_no_sync=True))
    assert "lm_head_gradient" not in {c.name for c in no_sync.devices[0].components}


def test_fsdp_no_sync_reduce_scatters_once_per_step():
    from trainfit.core.speed.comm import communication
    from trainfit.core.speed.rates import DeviceRates

    rates = DeviceRates(kind="gpu", name="test", architecture="ada", count=2, peak_flops={"bf16": 300e12},
                        measured=False, ceiling=0.7, half_hidden=1.0, half_tokens=1.0,
                        memory_bandwidth_bytes_per_s=1e12, memory_efficiency=0.8, op_overhead_seconds=1e-5,
                        link_kind="pcie-p2p", link_bytes_per_s=25e9, pcie_bytes_per_s=25e9,
                        host_bandwidth_bytes_per_s=50e9, tdp_watts=450.0)
    s = TrainingSetup(method="full", precision="bf16", num_gpus=2, zero_stage=3, fsdp_strategy="full-shard",
                      grad_accum=8, grad_checkpointing="full")
    kw = dict(n_stored=1e9, trainable=1e9, micro_s=0.01, bwd_share=0.6, network_bytes_per_s=0.0)
    each = communication(s, rates, **kw).seconds
    once = communication(dataclasses.replace(s, fsdp_no_sync=True), rates, **kw).seconds
    ring, latency = 0.5, 2 * 20e-6  # (N - 1) / N; 2 (N - 1) hops of 20 us
    # seven of the eight micro-batches skip the 2 GB bf16 reduce-scatter (too long to hide in 0.01 s)
    assert each - once == pytest.approx(7 * (ring * 2e9 / 25e9 + latency), rel=1e-6)


@pytest.mark.parametrize("kw,needle", [
    (dict(method="full", num_gpus=2, zero_stage=2, grad_accum=4, fsdp_no_sync=True), "--fsdp full-shard"),
    (dict(method="full", optimizer="sgd", optimizer_impl="foreach"), "--optimizer-impl foreach"),
    (dict(method="lora", lora=LoraSettings(), bnb_keeps_input=True), "--bitsandbytes-version"),
    (dict(method="lora", lora=LoraSettings(), fsdp_mixed_units=True), "--fsdp full-shard"),
    (dict(method="full", num_gpus=2, zero_stage=3, fsdp_strategy="full-shard", fsdp_mixed_units=True), "--method lora"),
    (dict(method="lora", lora=LoraSettings(), kbit_upcast=True), "--kbit-upcast"),
    (dict(method="lora", lora=LoraSettings(), precision="bf16-mixed", autocast_16bit_weights=True),
     "--autocast-16bit-weights"),
    (dict(method="lora", lora=LoraSettings(), quantize_lm_head=True), "--quantize-lm-head"),
    (dict(method="qlora", quant="gptq", lora=LoraSettings(), quantize_lm_head=True), "--quantize-lm-head"),
    (dict(method="qlora", quant="int8", lora=LoraSettings(), bnb_fp16_quant_state=True), "--bnb-fp16-quant-state"),
])
def test_framework_knobs_refused_where_they_do_not_apply(llama, kw, needle):
    with pytest.raises(BadInputError, match=needle.replace("+", r"\+")):
        estimate_memory(llama, TrainingSetup(**kw))


def test_quantised_lm_head_is_four_bit_and_becomes_the_largest_dequantised_weight(llama):
    st = model_stats(llama)
    q = TrainingSetup(method="qlora", quant="nf4", precision="bf16", lora=LoraSettings(), micro_batch=1, seq_len=256)
    params, _ = lora_stats(llama, q.lora.target_modules, q.lora.rank)
    plain = model_states(llama, st, q, params)
    head_q = model_states(llama, st, dataclasses.replace(q, quantize_lm_head=True), params)
    head = llama.vocab_size * llama.hidden_size  # 128256 x 4096, untied in Llama 3.1 8B
    assert plain.weights - head_q.weights == pytest.approx(head * (2 - 0.5))
    assert head_q.quant_overhead - plain.quant_overhead == pytest.approx(head / 64 * 4)  # one fp32 absmax per 64
    assert plain.dequant_transient == st.largest_linear * 2  # the MLP's 14336 x 4096 weight
    assert head_q.dequant_transient == head * 2
    # int8: one fp32 scale per output row, the vocabulary's rows added
    i8 = dataclasses.replace(q, quant="int8", method="lora")
    assert (model_states(llama, st, dataclasses.replace(i8, quantize_lm_head=True), params).quant_overhead
            - model_states(llama, st, i8, params).quant_overhead) == pytest.approx(llama.vocab_size * 4)
    # bitsandbytes before 0.43.2 keeps the quantised lm_head's input too (one bf16 hidden state per token)
    old = dataclasses.replace(q, bnb_keeps_input=True)
    kept = (_phases(estimate_memory(llama, dataclasses.replace(old, quantize_lm_head=True)))["layer backward"]
            - _phases(estimate_memory(llama, old))["layer backward"]) * 2**30
    saved = (head * 0.5 + head / 64 * 4) - head * 2  # the weights' change, then the kept input
    assert kept == pytest.approx(saved + 2 * llama.hidden_size * 256, abs=0.01 * 2**30)  # phases: 2 decimals
    from trainfit.core.memory.activations import final_norm_bytes_per_token
    per_token = (final_norm_bytes_per_token(llama, dataclasses.replace(old, quantize_lm_head=True), False)
                 - final_norm_bytes_per_token(llama, old, False))
    assert per_token == 2 * llama.hidden_size
    assert final_norm_bytes_per_token(llama, dataclasses.replace(q, quantize_lm_head=True), False) == (
        final_norm_bytes_per_token(llama, q, False))  # bitsandbytes >= 0.43.2 keeps no input


def test_quantise_lm_head_leaves_a_tied_head_with_the_embeddings():
    tied = get_model("Qwen/Qwen2.5-0.5B")
    assert tied.tie_embeddings
    q = TrainingSetup(method="qlora", quant="nf4", lora=LoraSettings(), micro_batch=1, seq_len=128)
    a, b = estimate_memory(tied, q), estimate_memory(tied, dataclasses.replace(q, quantize_lm_head=True))
    assert a.devices[0].tensor_peak_bytes == b.devices[0].tensor_peak_bytes
    assert any("tied to the embeddings" in n for n in b.notes)


def test_fp16_quant_state_holds_the_dequantised_weight_twice_under_bf16(llama):
    st = model_stats(llama)
    q = TrainingSetup(method="qlora", quant="nf4", precision="bf16", lora=LoraSettings(), micro_batch=1, seq_len=256)
    params, _ = lora_stats(llama, q.lora.target_modules, q.lora.rank)
    fp16_state = dataclasses.replace(q, bnb_fp16_quant_state=True)
    assert model_states(llama, st, fp16_state, params).dequant_transient == 2 * model_states(
        llama, st, q, params).dequant_transient
    # fp16 compute: dequantize_4bit already returns the compute dtype, no second copy
    fp16 = dataclasses.replace(q, precision="fp16")
    assert (model_states(llama, st, dataclasses.replace(fp16, bnb_fp16_quant_state=True), params).dequant_transient
            == model_states(llama, st, fp16, params).dequant_transient)
    est = estimate_memory(llama, fp16_state)
    comp = next(c for c in est.devices[0].components if c.name == "dequant_transient")
    assert "bf16 cast" in comp.what


def test_fp16_quant_state_costs_one_cast_per_weight_and_pass(llama):
    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.speed import device_rates, predict_step
    from trainfit.core.speed import flops as F

    hw = resolve_hardware("a100-80gb")
    q = TrainingSetup(method="qlora", quant="nf4", precision="bf16", lora=LoraSettings(), micro_batch=1, seq_len=512)
    a = predict_step(llama, q, hw).micro_step_seconds
    b = predict_step(llama, dataclasses.replace(q, bnb_fp16_quant_state=True), hw).micro_step_seconds
    rates = device_rates(hw, "cuda")
    bw = rates.memory_bandwidth_bytes_per_s * rates.memory_efficiency
    # forward + backward: 2 passes, 4 bytes (read fp16, write bf16) per stored weight
    assert b - a == pytest.approx(2 * F.matmul_params_stored(llama) * 4.0 / bw, rel=1e-6)


def test_cli_flags_and_bad_version():
    run = [sys.executable, "-m", "trainfit", "estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora",
           "--hardware", "rtx-3060"]
    ok = subprocess.run(run + ["--bitsandbytes-version", "0.41.1", "--kbit-upcast", "--autocast-16bit-weights",
                               "--precision", "bf16", "--json"], capture_output=True, text=True)
    assert ok.returncode in (0, 3), ok.stderr
    setup = json.loads(ok.stdout)["setup"]
    assert setup["bnb_keeps_input"] is True and setup["kbit_upcast"] is True and setup["autocast_16bit_weights"] is True
    assert setup["optimizer_impl"] == "auto" and setup["fsdp_mixed_units"] is False
    assert setup["quantize_lm_head"] is False and setup["bnb_fp16_quant_state"] is False
    lightning = subprocess.run(run + ["--quantize-lm-head", "--bnb-fp16-quant-state", "--json"],
                               capture_output=True, text=True)
    assert lightning.returncode in (0, 3), lightning.stderr
    doc = json.loads(lightning.stdout)
    assert doc["setup"]["quantize_lm_head"] is True and doc["setup"]["bnb_fp16_quant_state"] is True
    bad = subprocess.run(run + ["--bitsandbytes-version", "latest"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "--bitsandbytes-version: 'latest' is not a version number" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert setup["logits_shift_copy"] is False  # --hardware: a current transformers release
    old_tf = subprocess.run(run + ["--transformers-version", "4.48.1", "--json"], capture_output=True, text=True)
    assert old_tf.returncode in (0, 3), old_tf.stderr
    assert json.loads(old_tf.stdout)["setup"]["logits_shift_copy"] is True
    assert json.loads(old_tf.stdout)["setup"]["logits_returned_fp32"] is False
    kept = subprocess.run(run + ["--transformers-version", "4.40.0", "--output-kept", "--json"],
                          capture_output=True, text=True)
    assert kept.returncode in (0, 3), kept.stderr
    kept_setup = json.loads(kept.stdout)["setup"]
    assert kept_setup["output_kept"] is True and kept_setup["logits_returned_fp32"] is True
    bad_tf = subprocess.run(run + ["--transformers-version", "next"], capture_output=True, text=True)
    assert bad_tf.returncode == 2 and "--transformers-version: 'next' is not a version number" in bad_tf.stderr


@pytest.mark.parametrize("version,fused", [("4.48.1", False), ("4.57.3", False), ("5.0.0", True), ("5.24", True)])
def test_transformers_5_fuses_the_experts(version, fused):
    assert experts_fused_for(version) is fused


def test_bitsandbytes_leaves_transformers_5_fused_experts_16bit():
    """transformers 5 holds Mixtral's experts as 3-D parameters, which bitsandbytes' nn.Linear
    replacement skips (bitsandbytes#1849): under nf4 they stay bf16, and PEFT's k-bit preparation
    makes them fp32. transformers 4's per-expert nn.Linear are quantised, one de-quantised at a time."""
    mixtral = get_model("mistralai/Mixtral-8x7B-v0.1")
    st = model_stats(mixtral)
    q = TrainingSetup(method="qlora", quant="nf4", precision="bf16", lora=LoraSettings())
    fused, v4 = model_states(mixtral, st, q, 0), model_states(mixtral, st, dataclasses.replace(q, experts_fused=False), 0)
    assert st.experts > 0.9 * st.linear  # the experts are the bulk of the quantisable weights
    assert fused.weights - v4.weights == pytest.approx(st.experts * (2 - 0.5))
    assert fused.quant_overhead == pytest.approx((st.linear - st.experts) / 64 * 4)
    assert v4.quant_overhead == pytest.approx(st.linear / 64 * 4)
    # de-quantisation transient: one expert's down_proj (ffn x hidden) in transformers 4; no expert in 5
    assert v4.dequant_transient == 2 * mixtral.intermediate_size * mixtral.hidden_size
    assert fused.dequant_transient == 2 * st.largest_module
    upcast = model_states(mixtral, st, dataclasses.replace(q, kbit_upcast=True), 0)
    assert upcast.weights - fused.weights == pytest.approx((st.total - (st.linear - st.experts)) * 2)
    dense = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings())
    assert model_states(mixtral, st, dense, 0).weights == st.total * 2  # no quantisation, no change
    llama = get_model("meta-llama/Llama-3.1-8B")
    ls = model_stats(llama)
    assert ls.experts == 0 and model_states(llama, ls, q, 0).weights == model_states(
        llama, ls, dataclasses.replace(q, experts_fused=False), 0).weights
    est = estimate_memory(mixtral, q)
    assert any("bitsandbytes#1849" in n for n in est.notes)
    assert "fused MoE experts" in {c.name: c.what for c in est.devices[0].components}["weights"]


def test_cli_transformers_4_quantises_the_experts():
    run = [sys.executable, "-m", "trainfit", "estimate", "mistralai/Mixtral-8x7B-v0.1", "--method", "qlora",
           "--quant", "nf4", "--hardware", "a100-80gb", "--json"]
    now, old = (subprocess.run(run + extra, capture_output=True, text=True)
                for extra in ([], ["--transformers-version", "4.48.1"]))
    assert now.returncode == 3 and old.returncode == 0, (now.stderr, old.stderr)
    assert json.loads(now.stdout)["setup"]["experts_fused"] is True
    assert json.loads(old.stdout)["setup"]["experts_fused"] is False


def test_runner_prepares_a_quantised_base_without_the_fp32_cast():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from trainfit.train.trainer_setup import prepare_quantized_base

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    prepare_quantized_base(model, gradient_checkpointing=True)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # PEFT would make these fp32
    assert not any(p.requires_grad for p in model.parameters())
    out = model.get_input_embeddings()(torch.tensor([[1, 2]]))
    assert out.requires_grad  # reentrant checkpointing needs an input with a gradient
    assert model.is_gradient_checkpointing


@pytest.mark.parametrize("version,around", [("4.37.2", True), ("4.48.1", True), ("4.51.3", True), ("4.52.0", False),
                                            ("5.24", False)])
def test_transformers_before_4_52_checkpoints_the_fsdp_unit_call(version, around):
    assert checkpoint_around_units_for(version) is around


def test_reentrant_checkpoint_around_frozen_fsdp_units_holds_every_layer_input_gradient():
    """A 70B QLoRA on 2 GPUs, FSDP full shard (as fms-acceleration ran Llama 2 70B): with transformers < 4.52's
    placement, the layer backward holds n - 1 input gradients (bf16 hidden states) beside the n layer
    inputs, up to the last layer's recompute."""
    llama70 = get_model("meta-llama/Llama-3.1-70B")
    base = TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16", micro_batch=2, seq_len=4096,
                         grad_checkpointing="full", num_gpus=2, zero_stage=3, fsdp_strategy="full-shard",
                         attention="flash", lora=LoraSettings(rank=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                       "o_proj"]))
    around = dataclasses.replace(base, reentrant_checkpoint_around_fsdp_units=True)
    assert runtime_of(around).held_layer_input_grads and not runtime_of(base).held_layer_input_grads
    held = (llama70.num_layers - 1) * 2 * llama70.hidden_size * 2 * 4096
    assert _phases(estimate_memory(llama70, around))["layer backward"] == pytest.approx(
        _phases(estimate_memory(llama70, base))["layer backward"] + held / 2**30, abs=0.01)
    est = estimate_memory(llama70, around)
    acts = {c.name: c.what for c in est.devices[0].components}["activations"]
    assert "79 layer-input gradients held by FSDP's reshard hooks" in acts
    # only frozen units under FSDP with the whole layer checkpointed: a trained unit (full training,
    # adapters inside the layer's unit) reshards after its gradient, DeepSpeed has no such hook
    for other in (dataclasses.replace(around, method="full", quant="none", lora=None),
                  dataclasses.replace(around, quant="none", method="lora", fsdp_mixed_units=True),
                  dataclasses.replace(around, fsdp_strategy="none"),
                  dataclasses.replace(around, grad_checkpointing="none")):
        assert not runtime_of(other).held_layer_input_grads, other


def test_cli_transformers_version_sets_the_checkpoint_placement():
    run = [sys.executable, "-m", "trainfit", "estimate", "meta-llama/Llama-3.1-8B", "--method", "lora",
           "--hardware", "2x a100-80gb", "--fsdp", "full-shard", "--grad-checkpointing", "full", "--json"]
    old, new = (subprocess.run(run + ["--transformers-version", v], capture_output=True, text=True)
                for v in ("4.48.1", "4.52.0"))
    assert old.returncode == new.returncode == 0, (old.stderr, new.stderr)
    assert json.loads(old.stdout)["setup"]["reentrant_checkpoint_around_fsdp_units"] is True
    assert json.loads(new.stdout)["setup"]["reentrant_checkpoint_around_fsdp_units"] is False


def test_autocast_over_a_16bit_layernorm_model_with_4bit_linears_runs_an_fp32_stream(llama):
    santacoder = get_model("bigcode/gpt_bigcode-santacoder")  # nn.LayerNorm, tied 49k vocabulary
    q = TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16", lora=LoraSettings(target_modules=["c_attn"]),
                      micro_batch=4, seq_len=2048, grad_checkpointing="full", logits_shift_copy=True)
    auto = dataclasses.replace(q, autocast_16bit_weights=True)
    plain, under = estimate_memory(santacoder, q).devices[0], estimate_memory(santacoder, auto).devices[0]
    ckpt = {d.name: d for d in plain.components}["activations"], {d.name: d for d in under.components}["activations"]
    assert "b*s*h*2 B" in ckpt[0].what and "b*s*h*4 B" in ckpt[1].what  # checkpointed layer inputs in fp32
    tokens, v = 4 * 2048, santacoder.vocab_size
    plain_loss = loss_terms(santacoder, q, tokens, head_trains=False)
    auto_loss = loss_terms(santacoder, auto, tokens, head_trains=False)
    assert auto_loss.saved > plain_loss.saved  # log_softmax's saved output is fp32 under autocast
    assert auto_loss.saved - plain_loss.saved == pytest.approx(tokens * v * 2, rel=0.01)
    # RMSNorm models cast the norm output back: their stream stays 16-bit, only the loss follows autocast
    ql = dataclasses.replace(q, lora=LoraSettings(), logits_shift_copy=False)
    assert (layer_bytes_per_token(llama, model_stats(llama), ql, None)
            == layer_bytes_per_token(llama, model_stats(llama), dataclasses.replace(ql, autocast_16bit_weights=True),
                                     None))


@pytest.mark.parametrize("version,kept", [("4.48.1", True), ("4.52.4", True), ("4.53.0", False), ("5.24", False)])
def test_transformers_before_4_53_leaves_the_cache_on_under_checkpointing(version, kept):
    assert cache_under_checkpointing_for(version) is kept
    assert transformers_knobs(version)["cache_under_checkpointing"] is kept


def test_gpt_bigcode_cache_under_checkpointing_keeps_every_layers_c_attn_output_through_the_forward():
    """SantaCoder full fine-tune, pure bf16, checkpointed (fms-acceleration's baseline): each layer's
    key/value is a view of its fused c_attn output (q + k + v wide), kept by the returned cache until the
    loss; the Trainer drops the output before backward, so only the forward phase grows."""
    santacoder = get_model("bigcode/gpt_bigcode-santacoder")
    base = TrainingSetup(method="full", precision="bf16", micro_batch=8, seq_len=2048, grad_checkpointing="full",
                         attention="flash", logits_shift_copy=True)
    kept = dataclasses.replace(base, cache_under_checkpointing=True)
    width = santacoder.num_heads * santacoder.head_dim + 2 * santacoder.head_dim  # multi-query: one kv head
    assert width == 2304
    per_token = cached_kv_bytes_per_token(santacoder, kept, 2)
    assert per_token == santacoder.num_layers * width * 2
    before, after = _phases(estimate_memory(santacoder, base)), _phases(estimate_memory(santacoder, kept))
    assert after["forward"] == pytest.approx(before["forward"] + per_token * 8 * 2048 / 2**30, abs=0.01)
    assert after["loss backward"] == before["loss backward"]
    comps = {c.name: c for c in estimate_memory(santacoder, kept).devices[0].components}
    assert comps["kv_cache"].bytes == pytest.approx(per_token * 8 * 2048, rel=1e-6)
    # other architectures turn use_cache off themselves; no checkpointing: the attention keeps q, k, v anyway
    llama = get_model("meta-llama/Llama-3.1-8B")
    assert cached_kv_bytes_per_token(llama, kept, 2) == 0
    assert cached_kv_bytes_per_token(santacoder, dataclasses.replace(kept, grad_checkpointing="none"), 2) == 0


def test_own_forward_loss_under_autocast_copies_the_16bit_logits():
    """gpt_bigcode's own loss (transformers < 4.49) shifts the 16-bit logits before autocast casts them to
    fp32 for cross_entropy: the copy is 2 B per vocabulary entry, not the fp32 4 B of ForCausalLMLoss."""
    santacoder = get_model("bigcode/gpt_bigcode-santacoder")
    auto = TrainingSetup(method="full", precision="bf16-mixed", micro_batch=1, seq_len=512, logits_shift_copy=True)
    assert runtime_of(auto).legacy_loss_under_autocast(santacoder)
    assert not runtime_of(auto).legacy_loss_under_autocast(get_model("meta-llama/Llama-3.1-8B"))
    assert not runtime_of(dataclasses.replace(auto, precision="bf16")).legacy_loss_under_autocast(santacoder)
    v = santacoder.vocab_size
    saved, fwd, _ = loss_bytes_per_token(santacoder, auto)
    assert (saved, fwd) == (4 * v, 2 * v + 4 * v + 2 * v)  # log_softmax; logits, fp32 cast, 16-bit shifted copy


def test_own_forward_loss_never_returns_fp32_logits():
    """transformers < 4.46 upcast the returned logits in Llama-style forwards; gpt_bigcode's own forward
    never did, so its autocast loss is the same before and after 4.46."""
    santacoder = get_model("bigcode/gpt_bigcode-santacoder")
    old = TrainingSetup(method="full", precision="bf16-mixed", micro_batch=1, seq_len=512,
                        **transformers_knobs("4.45.2"))
    new = dataclasses.replace(old, **transformers_knobs("4.48.1"))
    assert loss_bytes_per_token(santacoder, old) == loss_bytes_per_token(santacoder, new)


def test_a_kept_output_keeps_its_cache_through_backward():
    santacoder = get_model("bigcode/gpt_bigcode-santacoder")
    base = TrainingSetup(method="full", precision="bf16", micro_batch=8, seq_len=2048, grad_checkpointing="full",
                         attention="flash", logits_shift_copy=True, cache_under_checkpointing=True)
    kept = dataclasses.replace(base, output_kept=True)
    cache = cached_kv_bytes_per_token(santacoder, base, 2) * 8 * 2048 / 2**30
    logits = 2 * santacoder.vocab_size * 8 * 2048 / 2**30  # the kept bf16 logits
    diff = _phases(estimate_memory(santacoder, kept))["loss backward"] - _phases(
        estimate_memory(santacoder, base))["loss backward"]
    assert diff == pytest.approx(cache + logits, abs=0.02)


def test_fsdp1_is_the_hf_trainers_fsdp_before_transformers_5():
    assert transformers_knobs("4.48.1")["fsdp_flat_params"] is True
    assert transformers_knobs("5.0.0")["fsdp_flat_params"] is False


def test_fsdp1_root_gradient_at_the_embeddings_backward():
    """FSDP1 builds the root unit's flat gradient by concatenation at the end of backward: the
    lm_head's gradient, the embedding's and the whole root's concatenation alive at once
    (bench/fsdp_flat_root_cpu.py measures it on CPU: -23.5 % without the term, +1.6 % with it)."""
    from trainfit.core.memory import estimate_memory
    from trainfit.core.models.catalog import get_model

    gemma = get_model("google/gemma-2b")
    per_param = TrainingSetup(method="full", precision="bf16", optimizer="adamw", micro_batch=1, seq_len=512,
                              grad_accum=4, grad_checkpointing="full", num_gpus=4, zero_stage=3,
                              fsdp_strategy="full-shard", fsdp_no_sync=True, device="cuda")
    flat = dataclasses.replace(per_param, fsdp_flat_params=True)
    a, b = (estimate_memory(gemma, s, None) for s in (per_param, flat))
    comps = {c.name: c.bytes for c in b.devices[0].components}
    embed = gemma.vocab_size * gemma.hidden_size
    head = 0 if gemma.tie_embeddings else embed
    assert comps["fsdp_root_gradient"] == head * 2 + (embed + head) * 2
    assert b.devices[0].tensor_peak_bytes > a.devices[0].tensor_peak_bytes
    assert any("backward end" in n and "tensor peak at the backward end" in n for n in b.notes)


@pytest.mark.parametrize("version,unrepeated", [("4.48.1", True), ("5.24", True), ("5.24.0", True), ("5.25.0", False),
                                                ("5.25", False), ("6.0.0", False)])
def test_transformers_before_5_25_hands_sdpa_falcons_one_key_value_head(version, unrepeated):
    assert mqa_kv_unrepeated_for(version) is unrepeated
    assert transformers_knobs(version)["mqa_kv_unrepeated"] is unrepeated


def _tiny_falcon_7b():
    """tests/models/test_architecture_memory.py's falcon-7b-full-fp32 case: 4 query heads, one key/value head."""
    config = {"model_type": "falcon", "hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 3,
              "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False, "alibi": False,
              "bias": False, "vocab_size": 1024, "num_kv_heads": 71, "ffn_hidden_size": 512}
    spec = dataclasses.replace(spec_from_config(config, origin="falcon-7b"), stored_dtype="float32")
    return spec, TrainingSetup(method="full", precision="fp32", device="cpu", micro_batch=2, seq_len=256)


def test_falcon_multi_query_attention_runs_sdpas_fused_kernel_from_transformers_5_25():
    """transformers 5.25's FalconAttention goes through sdpa_attention_forward, which repeats the one
    key/value head to every query head; 5.24's called SDPA with it unrepeated, which only the math path
    takes, saving the scores like eager. Both figures are the live-tensor counter's within 6 % on CPU
    (31,985,936 B under 5.24.0, 27,095,264 B under 5.25.0)."""
    spec, setup = _tiny_falcon_7b()
    assert (spec.num_heads, spec.num_kv_heads) == (4, 1)
    old = dataclasses.replace(setup, **transformers_knobs("5.24.0"))
    new = dataclasses.replace(setup, **transformers_knobs("5.25.0"))
    assert attention_kind(spec, old) == "eager" and attention_kind(spec, new) == "sdpa" == attention_kind(spec, setup)
    peak = {name: estimate_memory(spec, s).devices[0].tensor_peak_bytes
            for name, s in (("5.24", old), ("5.25", new), ("default", setup))}
    assert peak == {"5.24": 31_911_936, "5.25": 25_645_056, "default": 25_645_056}
    assert peak["5.24"] == pytest.approx(31_985_936, rel=0.06) and peak["5.25"] == pytest.approx(27_095_264, rel=0.06)
    # multi-head and grouped layouts never took the math path: the version changes nothing there
    grouped = dataclasses.replace(spec, num_kv_heads=2)
    assert (estimate_memory(grouped, old).devices[0].tensor_peak_bytes
            == estimate_memory(grouped, new).devices[0].tensor_peak_bytes)


def test_falcon_7b_cli_default_is_the_current_transformers_and_the_old_release_on_request():
    run = [sys.executable, "-m", "trainfit", "estimate", "tiiuae/falcon-7b", "--method", "full",
           "--hardware", "h100-80gb", "--micro-batch", "1", "--seq-len", "2048", "--json"]
    peaks = {}
    for extra in ([], ["--runtime", "transformers_version=5.24.0"], ["--transformers-version", "5.25.0"]):
        done = subprocess.run(run + extra, capture_output=True, text=True)
        assert done.returncode in (0, 3), done.stderr
        doc = json.loads(done.stdout)
        peaks[" ".join(extra)] = (doc["setup"]["mqa_kv_unrepeated"], doc["devices"][0]["tensor_peak_bytes"])
    default, old, new = peaks.values()
    assert default == new and default[0] is False and old[0] is True and old[1] > new[1]
