"""Sharding / offload knobs: FSDP strategies and CPU offload, ZeRO-3 on one GPU,
offload without ZeRO, activation offloading, optimizer in backward, paged 32-bit AdamW.

Each test checks the component that changes against a hand calculation from the model's
parameter counts (P = total, L = one decoder layer, E + H = embeddings + untied lm_head).
"""

import dataclasses
import json
import subprocess
import sys

import pytest

from trainfit.core.memory import estimate_memory
from trainfit.core.memory.fsdp import gathered_by_phase
from trainfit.core.memory.states import model_states
from trainfit.core.memory.stats import model_stats
from trainfit.core.models.catalog import get_model
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.errors import BadInputError

GIB = 2**30


@pytest.fixture(scope="module")
def llama():
    return get_model("meta-llama/Llama-3.1-8B")


def _states(spec, **kw):
    return model_states(spec, model_stats(spec), TrainingSetup(**kw), 0)


def _gpu(est):
    return {c.name: c.bytes for c in est.devices[0].components}


def _cpu(est):
    cpu = [d for d in est.devices if d.device == "cpu"]
    return {c.name: c.bytes for c in cpu[0].components} if cpu else {}


# --- 1. FSDP as its own choice -----------------------------------------------------------------

def test_fsdp_full_shard_states_and_floor(llama):
    st = model_stats(llama)
    p, layer, root = st.total, st.per_layer, st.embedding + st.lm_head
    s = _states(llama, num_gpus=8, zero_stage=3, fsdp_strategy="full-shard")
    # fp32 flat parameters sharded are the master weights: 4 + 4 (grads) + 8 (Adam) = 16 B / 8 GPUs
    assert s.weights == pytest.approx(4 * p / 8) and s.gradients == pytest.approx(4 * p / 8)
    assert s.optimizer == pytest.approx(8 * p / 8) and s.master_weights == 0 and s.buckets == 0
    # floor, in a layer's backward: root unit gathered (bf16) + current and prefetched layer + two layers'
    # bf16 gradients (FSDP2 holds the previous layer's reduce-scatter input)
    assert s.gathered == pytest.approx(2 * root + 2 * 2 * layer + 2 * 2 * layer)
    setup = TrainingSetup(num_gpus=8, zero_stage=3, fsdp_strategy="full-shard")
    phases = gathered_by_phase(st, setup)
    assert phases["layer backward"] == s.gathered
    assert phases["first layer backward"] == pytest.approx(2 * root + 3 * 2 * layer)  # none reduced before it
    assert phases["loss backward"] == pytest.approx(2 * root + 2 * layer)  # the last layer, prefetched
    assert phases["forward"] == pytest.approx(2 * root + 2 * 2 * layer)
    assert phases["optimizer step"] == 0  # every unit resharded after backward
    flat = gathered_by_phase(st, dataclasses.replace(setup, fsdp_flat_params=True))
    assert flat["layer backward"] == pytest.approx(2 * root + 3 * 2 * layer)  # FSDP1: no buffer held
    # DeepSpeed ZeRO-3 on the same GPUs holds 16-bit weights + fp32 master separately
    z = _states(llama, num_gpus=8, zero_stage=3)
    assert z.master_weights == pytest.approx(4 * p / 8) and z.weights == pytest.approx(2 * p / 8)


def test_fsdp_floor_is_not_total_over_n(llama):
    """On many GPUs the gathered units dominate: the per-GPU states stay above 16 P / N."""
    st = model_stats(llama)
    s = _states(llama, num_gpus=256, zero_stage=3, fsdp_strategy="full-shard")
    sharded = s.weights + s.gradients + s.optimizer
    assert sharded == pytest.approx(16 * st.total / 256)
    assert s.gathered > sharded  # 2.7 GiB of root + layers vs 0.47 GiB of shards


def test_fsdp_shard_grad_op_keeps_every_parameter_gathered(llama):
    st = model_stats(llama)
    s = _states(llama, num_gpus=8, zero_stage=2, fsdp_strategy="shard-grad-op")
    assert s.gathered == pytest.approx(2 * st.total + 2 * 2 * st.per_layer)
    assert s.weights == pytest.approx(4 * st.total / 8)


def test_fsdp_no_shard_is_ddp_memory_without_buckets(llama):
    st = model_stats(llama)
    s = _states(llama, num_gpus=4, zero_stage=0, fsdp_strategy="no-shard")
    assert s.weights + s.gradients + s.optimizer == pytest.approx(16 * st.total)
    assert s.buckets == 0 and s.gathered == pytest.approx(2 * st.total)  # bf16 compute copy
    ddp = _states(llama, num_gpus=4)
    assert ddp.buckets == pytest.approx(4 * st.total)


def test_fsdp_has_no_autocast_cache_and_names_its_floor(llama):
    est = estimate_memory(llama, TrainingSetup(num_gpus=8, zero_stage=2, fsdp_strategy="shard-grad-op",
                                               grad_checkpointing="full", micro_batch=4, seq_len=4096))
    gpu = _gpu(est)
    assert "autocast_weight_cache" not in gpu and "fsdp_gathered" in gpu


def test_fsdp_cpu_offload_on_one_gpu(llama):
    st = model_stats(llama)
    est = estimate_memory(llama, TrainingSetup(num_gpus=1, zero_stage=3, fsdp_strategy="full-shard",
                                               offload="optimizer+params"))
    gpu, cpu = _gpu(est), _cpu(est)
    assert gpu["weights"] == 0 and "optimizer" not in gpu and "master_weights" not in gpu
    # parameters (fp32), their gradients (fp32) and both Adam moments on the host: 16 B/param
    assert cpu["offload"] == pytest.approx(16 * st.total, rel=1e-6)
    # at its peak, a layer's backward: the root, two layers and two layers' gradients, all bf16
    assert gpu["fsdp_gathered"] == pytest.approx(2 * (st.embedding + st.lm_head) + 8 * st.per_layer, rel=1e-6)


# --- 2. ZeRO-3 on one GPU with offload (ZeRO-Infinity CPU) ---------------------------------------

def test_zero3_one_gpu_offload_params_is_modelled(llama):
    st = model_stats(llama)
    s = _states(llama, num_gpus=1, zero_stage=3, offload="optimizer+params")
    # DeepSpeed's estimate_zero3_model_states_mem_needs (cpu_offload_params): GPU = the gathered
    # layers only; CPU = 18 B/param (fp32 master 4 + moments 8 + fp32 grads 4 + 16-bit params 2).
    assert (s.weights, s.gradients, s.optimizer, s.master_weights) == (0, 0, 0, 0)
    assert s.gathered == pytest.approx(4 * st.per_layer)
    assert s.cpu == pytest.approx(18 * st.total)


def test_zero2_offload_keeps_no_gradient_partition_on_gpu(llama):
    """DeepSpeed estimate_zero2_model_states_mem_needs with cpu_offload: 2 B/param on the GPU."""
    st = model_stats(llama)
    s = _states(llama, num_gpus=1, zero_stage=2, offload="optimizer")
    assert s.weights == pytest.approx(2 * st.total) and s.gradients == 0 and s.optimizer == 0
    before = _states(llama, num_gpus=1, zero_stage=2)
    assert before.gradients == pytest.approx(6 * st.total)  # 16-bit grads + fp32 partition without offload


def test_deepspeed_has_no_autocast_weight_cache(llama):
    """Accelerate runs no autocast under DeepSpeed (native_amp off): the module itself is 16-bit."""
    setup = TrainingSetup(num_gpus=2, zero_stage=2, grad_checkpointing="full", micro_batch=8, seq_len=4096)
    assert "autocast_weight_cache" not in _gpu(estimate_memory(llama, setup))
    ddp = dataclasses.replace(setup, zero_stage=0)
    assert "autocast_weight_cache" in _gpu(estimate_memory(llama, ddp))


# --- 3. offload without ZeRO, and other refusals -----------------------------------------------

@pytest.mark.parametrize("kw, needle", [
    (dict(offload="optimizer"), "--zero 2 --offload optimizer"),
    (dict(offload="optimizer"), "paged-adamw-32bit"),
    (dict(offload="optimizer", zero_stage=3, num_gpus=2, fsdp_strategy="full-shard"), "--offload optimizer+params"),
    (dict(offload="optimizer+params", zero_stage=2, num_gpus=2, fsdp_strategy="shard-grad-op"), "--fsdp full-shard"),
    (dict(zero_stage=2, num_gpus=2, fsdp_strategy="full-shard"), "drop --zero"),
    (dict(zero_stage=3, num_gpus=1, fsdp_strategy="full-shard"), "shards nothing"),
    (dict(optimizer_in_backward=True, grad_accum=4), "--grad-accum 1"),
    (dict(optimizer_in_backward=True, zero_stage=2, num_gpus=2), "--gpus 1"),
    (dict(activation_offload=True, device="cpu"), "--activation-offload"),
])
def test_refusals_name_the_combination_to_use(llama, kw, needle):
    with pytest.raises(BadInputError, match=needle.replace("+", r"\+")):
        estimate_memory(llama, TrainingSetup(**kw))


# --- 4. activation offloading -------------------------------------------------------------------

def test_activation_offload_moves_layer_inputs_to_pinned_host_memory(llama):
    n, h = llama.num_layers, llama.hidden_size
    base = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings(), micro_batch=4, seq_len=8192,
                         grad_checkpointing="full")
    before = estimate_memory(llama, base)
    after = estimate_memory(llama, dataclasses.replace(base, activation_offload=True))
    tokens = 4 * 8192
    host = _cpu(after)["activation_offload"]
    # full checkpointing saves one bf16 hidden state per layer; all but two layers' move to the host
    assert host == (n - 2) * 2 * h * tokens
    assert _gpu(before)["activations"] - _gpu(after)["activations"] == host
    assert after.devices[0].tensor_peak_bytes < before.devices[0].tensor_peak_bytes


# --- 5. optimizer in backward --------------------------------------------------------------------

def test_optimizer_in_backward_keeps_only_the_largest_gradient(llama):
    st = model_stats(llama)
    s = _states(llama, optimizer_in_backward=True)
    assert s.gradients == pytest.approx(4 * st.largest_param)  # fp32 grads under bf16-mixed
    assert _states(llama).gradients == pytest.approx(4 * st.total)
    est = estimate_memory(llama, TrainingSetup(optimizer_in_backward=True))
    plain = estimate_memory(llama, TrainingSetup())
    assert plain.devices[0].tensor_peak_bytes - est.devices[0].tensor_peak_bytes > 10 * GIB
    assert any("clipping" in n for n in est.notes)


# --- 6. paged 32-bit AdamW -----------------------------------------------------------------------

def test_paged_adamw_32bit_keeps_fp32_moments(llama):
    st = model_stats(llama)
    paged = _states(llama, precision="bf16", optimizer="paged-adamw-32bit")
    torch_adamw = _states(llama, precision="bf16", optimizer="adamw")
    # bitsandbytes: fp32 states whatever the dtype, in managed memory for tensors of >= 1e5 elements
    assert paged.optimizer + paged.paged_optimizer == pytest.approx(8 * st.total)
    assert paged.optimizer == pytest.approx(8 * st.norms)
    assert torch_adamw.optimizer == pytest.approx(4 * st.total)  # torch AdamW: moments in the param dtype
    est = estimate_memory(llama, TrainingSetup(optimizer="paged-adamw-32bit"))
    assert any("paged" in n for n in est.notes)


# --- CLI -----------------------------------------------------------------------------------------

def _run(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", "estimate", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_flags():
    from trainfit.cli.cmd_estimate import estimate

    result, setup, _ = estimate("meta-llama/Llama-3.1-8B", hardware="8x a100-80gb", fsdp="full-shard")
    assert setup.fsdp_strategy == "full-shard" and setup.zero_stage == 3
    assert "fsdp_gathered" in _gpu(result)
    _, one, _ = estimate("meta-llama/Llama-3.1-8B", hardware="a100-80gb", zero=3, offload="optimizer+params", gpus=1)
    assert one.zero_stage == 3 and one.num_gpus == 1
    _, knobs, _ = estimate("Qwen/Qwen2.5-0.5B", hardware="a100-80gb", activation_offload=True,
                           optimizer_in_backward=True, optimizer="paged-adamw-32bit")
    assert knobs.activation_offload and knobs.optimizer_in_backward and knobs.optimizer == "paged-adamw-32bit"


def test_cli_json_and_refusal_exit_codes():
    ok = _run("Qwen/Qwen2.5-0.5B", "--hardware", "a100-80gb", "--fsdp", "full-shard", "--offload",
              "optimizer+params", "--activation-offload", "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["setup"]["fsdp_strategy"] == "full-shard" and doc["setup"]["activation_offload"] is True
    assert [d["device"] for d in doc["devices"]] == ["cuda:0", "cpu"]
    bad = _run("Qwen/Qwen2.5-0.5B", "--hardware", "a100-80gb", "--offload", "optimizer")
    assert bad.returncode == 2 and "--zero 2 --offload optimizer" in bad.stderr and "Traceback" not in bad.stderr


def test_fsdp_hybrid_shard_reuses_hybrid_shard(llama):
    """HYBRID_SHARD = full-shard + hybrid_shard: states sharded over one node's GPUs, not all."""
    st = model_stats(llama)
    s = _states(llama, num_gpus=16, num_nodes=2, zero_stage=3, fsdp_strategy="full-shard", hybrid_shard=True)
    assert s.weights == pytest.approx(4 * st.total / 8) and s.optimizer == pytest.approx(8 * st.total / 8)
    with pytest.raises(BadInputError, match="full-shard"):
        estimate_memory(llama, TrainingSetup(num_gpus=16, num_nodes=2, zero_stage=2, fsdp_strategy="shard-grad-op",
                                             hybrid_shard=True))


def test_human_header_names_the_engine():
    out = _run("Qwen/Qwen2.5-0.5B", "--hardware", "2x a100-80gb", "--fsdp", "full-shard", "--activation-offload")
    assert out.returncode == 0, out.stderr
    assert "FSDP full-shard" in out.stdout and "activation offload" in out.stdout


@pytest.mark.parametrize("engine", [dict(zero_stage=3), dict(zero_stage=3, fsdp_strategy="full-shard")])
def test_quantisation_scales_are_not_sharded(llama, engine):
    # bitsandbytes keeps absmax on the weight's QuantState, which neither FSDP nor ZeRO-3 shards.
    st = model_stats(llama)
    kw = dict(method="qlora", quant="nf4", lora=LoraSettings(), precision="bf16", **engine)
    one = _states(llama, **kw, num_gpus=1)
    four = _states(llama, **kw, num_gpus=4)
    assert four.quant_overhead == one.quant_overhead == pytest.approx(st.linear / 64 * 4)
    assert four.weights == pytest.approx(one.weights / 4)


def test_fsdp_gathers_a_quantised_layer_as_its_packed_storage(llama):
    """FSDP QLoRA shards and all-gathers the 4-bit storage (bitsandbytes quant_storage in bf16), not a
    16-bit copy: a layer's linear weights cost 0.5 B per parameter when gathered, its norms 2 B."""
    st = model_stats(llama)
    kw = dict(method="qlora", lora=LoraSettings(), precision="bf16", num_gpus=2, zero_stage=3,
              fsdp_strategy="full-shard")
    q = _states(llama, quant="nf4-dq", **kw)
    linear = st.linear / st.layers
    layer = linear * 0.5 + (st.per_layer - linear) * 2
    root = 2 * (st.embedding + st.lm_head)
    assert q.gathered == pytest.approx(root + 2 * layer)  # the adapters' units are not counted here
    full = _states(llama, **{**kw, "method": "lora", "quant": "none"})
    assert full.gathered > q.gathered + 2 * 1.4 * linear  # 16-bit units are 4x the packed ones


def test_fsdp_cpu_offload_keeps_the_quantisation_scales_on_the_gpu(llama):
    """CPUOffload moves FSDP's flat parameters; bitsandbytes' absmax lives on the QuantState, which
    is no parameter (fsdp_qlora quantises every Params4bit on its GPU, then moves only its data)."""
    kw = dict(method="qlora", quant="nf4-dq", lora=LoraSettings(), precision="bf16", num_gpus=2, zero_stage=3,
              fsdp_strategy="full-shard")
    resident = _states(llama, **kw)
    offloaded = _states(llama, **kw, offload="optimizer+params")
    assert offloaded.weights == 0 and offloaded.cpu > 0
    assert offloaded.quant_overhead == resident.quant_overhead > 0


# --- DPO's frozen reference under the engines -----------------------------------------------------
# TRL's DPOTrainer prepares the reference with the policy's engine (trl.models.utils.prepare_deepspeed /
# prepare_fsdp): DeepSpeed casts it to 16-bit and keeps ZeRO-3 (partitioned over the ranks, offload_param
# kept) or runs it at stage 0 (a whole copy); FSDP shards it like the policy.

def _ref(est):
    return _gpu(est).get("reference_model", 0)


@pytest.mark.parametrize("engine, per_gpu_bytes_per_param", [
    (dict(zero_stage=3), 2 / 4),  # 16-bit, partitioned over the 4 ranks
    (dict(zero_stage=2), 2),  # stage 0: a whole 16-bit copy on every GPU
    (dict(zero_stage=3, fsdp_strategy="full-shard"), 4 / 4),  # the loaded fp32 flat parameters, sharded
    (dict(), 4),  # DDP: the model's own fp32 copy (bf16-mixed), whole
])
def test_full_dpo_reference_is_held_like_the_engine_holds_it(llama, engine, per_gpu_bytes_per_param):
    p = model_stats(llama).total
    est = estimate_memory(llama, TrainingSetup(method="dpo", num_gpus=4, seq_len=256, **engine))
    assert _ref(est) == pytest.approx(per_gpu_bytes_per_param * p, rel=1e-6)


def test_full_dpo_reference_offloads_with_zero3_params(llama):
    p = model_stats(llama).total
    est = estimate_memory(llama, TrainingSetup(method="dpo", num_gpus=4, seq_len=256, zero_stage=3,
                                               offload="optimizer+params"))
    assert _ref(est) == 0
    # every rank's 16-bit shard on the one host: 4 x 2 P / 4
    assert _cpu(est)["reference_model"] == pytest.approx(2 * p, rel=1e-6)


def test_cli_full_dpo_on_four_a100s_shards_the_reference():
    out = _run("Qwen/Qwen2.5-14B-Instruct", "--method", "dpo", "--zero", "3", "--hardware", "4x a100-80gb", "--json")
    assert out.returncode in (0, 3), out.stderr
    gpu = {c["name"]: c["bytes"] for c in json.loads(out.stdout)["devices"][0]["components"]}
    assert gpu["reference_model"] == gpu["weights"]  # 16-bit, / 4 GPUs, like the policy's own weights
    assert gpu["weights"] == pytest.approx(2 * 14_770_033_664 / 4, rel=1e-6)


def test_zero3_gradients_are_partitioned_and_say_so():
    out = _run("Qwen/Qwen2.5-14B-Instruct", "--method", "dpo", "--zero", "3", "--hardware", "4x a100-80gb", "--json")
    comps = {c["name"]: c for c in json.loads(out.stdout)["devices"][0]["components"]}
    # DeepSpeed's 16-bit gradient partition + its fp32 one (states.py), each / 4 ranks
    assert comps["gradients"]["bytes"] == pytest.approx((2 + 4) * 14_770_033_664 / 4, rel=1e-6)
    assert "/ 4 GPUs (ZeRO-3)" in comps["gradients"]["what"]
