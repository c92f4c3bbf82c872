"""estimate_memory: the per-device memory of one training or inference setup, with its parts.

Peak timing (where other calculators go wrong):
* the loss backward (grad of log_softmax + grad of logits, 12 B x vocab per token) happens while
  every saved activation is still alive;
* the first optimizer step allocates the states while all gradients are alive;
* with gradient accumulation gradients stay alive through the next micro-batch's forward;
* under autocast, the 16-bit copies of trained weights are cached for the whole forward and
  kept by autograd until each layer's backward.
The tensor peak is the largest of the phase peaks; margins (context, fragmentation, NCCL) sit on
top of it in `total_bytes`.
"""

from __future__ import annotations

import dataclasses

from trainfit.core.memory import activations as act
from trainfit.core.memory.checks import check_setup
from trainfit.core.memory.framework_effects import (cached_kv_bytes_per_token, no_sync_gradient_bytes,
                                                    returned_logits_bytes, step_temporary_bytes)
from trainfit.core.memory.fsdp import (SHARDED_STRATEGIES, flat_root_bytes, fsdp_shards, gathered_by_phase,
                                       gathered_what, no_sync_applies)
from trainfit.core.memory.inference import inference_components
from trainfit.core.memory.knob_effects import offload_activations
from trainfit.core.memory import dora, loss_kernels, model_dropout, quant_formats, vision
from trainfit.core.memory.overheads import (ACTIVATION_PHASES, STEP_PHASES, cpu_capacity, gpu_capacity, margins,
                                           phase_pool_bytes, required_bytes)
from trainfit.core.memory.paged_states import paged_note, paged_what
from trainfit.core.memory.states import model_states, trained_param_bytes
from trainfit.core.memory.stats import lora_stats, model_stats
from trainfit.core import knob_rules  # a module: knob_rules imports core.memory in turn
from trainfit.core.memory_types import DeviceMemory, MemoryComponent, MemoryEstimate
from trainfit.core.model_spec import ModelSpec
from trainfit.core.profile import HardwareProfile
from trainfit.core.runtime import BNB_QUANTS, runtime_of
from trainfit.core.setup import LoraSettings, TrainingSetup

C = MemoryComponent

# transformers refuses SDPA/flash for these (attention soft-capping), so eager is what runs.
EAGER_ONLY = ("gemma2", "bloom")  # bloom: BloomPreTrainedModel has no SDPA path


def estimate_memory(model: ModelSpec, setup: TrainingSetup,
                    hardware: HardwareProfile | None = None) -> MemoryEstimate:
    """Memory per device for `setup` on `model`; capacities from `hardware` when given."""
    knob_rules.check_knobs(setup, model)  # first: its messages name the combination to use (offload without ZeRO, FSDP)
    check_setup(model, setup)
    text_tokens = setup.seq_len
    setup = vision.with_image_tokens(model, setup)  # image tokens join the language model's sequence
    untied = setup.model_code == "litgpt" and model.tie_embeddings
    if untied:
        # LitGPT's GPT has an lm_head of its own: its checkpoint conversion copies a tied embedding
        # into lm_head.weight (scripts/convert_hf_checkpoint.py), so both are held and trained apart.
        model = dataclasses.replace(model, tie_embeddings=False)
    st = model_stats(model)
    lora = setup.lora
    uses_lora = setup.trains_adapters
    if uses_lora and lora is None:
        lora = LoraSettings()
    lora_params, where = (lora_stats(model, lora.target_modules, lora.rank) if uses_lora and lora
                          else (0, None))
    if uses_lora and setup.lora is None:
        setup = _with_lora(setup, lora)
    notes: list[str] = []
    if untied:
        notes.append("LitGPT keeps a copy of the tied embeddings as its own lm_head: counted apart")
    if setup.seq_len != text_tokens:
        notes.append(vision.image_note(model, setup, text_tokens))
    host_comps: list[MemoryComponent] = []  # pinned CPU memory of activation offloading
    if model.architecture in EAGER_ONLY and setup.attention != "eager":
        setup = dataclasses.replace(setup, attention="eager")
        notes.append(f"{model.architecture} supports only eager attention in transformers: estimated with eager")
    if setup.quantize_lm_head and model.tie_embeddings:  # knob_rules refused it for a non-bitsandbytes quant
        notes.append("the lm_head is tied to the embeddings: it stays 16-bit with them (--quantize-lm-head "
                     "quantises an lm_head of its own)")
    if quant_formats.experts_left_dense(st, setup):
        notes.append(quant_formats.dense_experts_text(st))
    lora_params += dora.magnitude_params(model, setup)  # DoRA's trained magnitudes (fp32, like the adapters)
    states = model_states(model, st, setup, lora_params)
    phase_pool = 0.0  # what the caching allocator holds across phases, free-running (overheads.margins)
    if setup.method == "inference":
        comps, notes = inference_components(model, st, setup, states)
        trainable = 0
    else:
        comps, phase_pool = _training_components(model, st, setup, states, where, notes, host_comps)
        trainable = states.trainable
    peak = sum(c.bytes for c in comps if c.in_tensor_peak)
    device = setup.device
    gpu_name = None
    arch = None
    if hardware is not None and hardware.gpus:
        arch = hardware.gpus[0].architecture
        gpu_name = hardware.gpus[0].name
    total_comps = comps + margins(device, peak, architecture=arch, num_gpus=setup.num_gpus,
                                  training=setup.method != "inference", zero_stage=setup.zero_stage,
                                  phase_pool=phase_pool)
    if states.paged_optimizer:
        total_comps.append(C("paged_optimizer", int(states.paged_optimizer), paged_what(setup), False))
    total = sum(c.bytes for c in total_comps)
    label = "cpu" if device == "cpu" else f"{'mps' if device == 'mps' else 'cuda'}:0"
    capacity = None
    if hardware is not None:
        capacity = cpu_capacity(hardware) if device == "cpu" else gpu_capacity(hardware)
        if capacity is None:
            notes.append(unknown_capacity_note(hardware, device))
    devices = [DeviceMemory(label, int(peak), int(total), capacity, total_comps,
                            required_bytes(device, int(total), total_comps))]
    if devices[0].spilled_bytes:
        host_comps.append(C("paged_optimizer", devices[0].spilled_bytes, "paged optimizer states the driver "
                            "evicts from the card to CPU RAM (managed memory)", True))
    host_bytes = sum(c.bytes for c in host_comps)
    if (states.cpu or host_bytes) and device != "cpu":
        cpu_comps = [C("offload", int(states.cpu), states.cpu_what, True)] if states.cpu else []
        cpu_comps += host_comps
        cpu_peak = int(states.cpu) + host_bytes
        if states.cpu:
            cpu_comps.append(C("framework_overhead", int(0.5 * states.cpu),
                               "pinned staging buffers and CPU Adam working copies: 50 % (DeepSpeed uses 1.5x)",
                               False))
        devices.append(DeviceMemory("cpu", cpu_peak, int(1.5 * states.cpu) + host_bytes,
                                    cpu_capacity(hardware) if hardware is not None else None, cpu_comps))
    if setup.num_gpus > 1:
        notes.append(f"per GPU figures; all {setup.num_gpus} GPUs hold the same amount under data parallelism")
    if states.paged_optimizer:
        notes.append(paged_note(devices[0]))
    if setup.optimizer_in_backward:
        notes.append("optimizer in backward: no gradient clipping over the whole model is possible "
                     "(each parameter is stepped before the others' gradients exist)")
    if gpu_name:
        notes.append(f"capacity: {gpu_name}")
    return MemoryEstimate(model.id, st.total, trainable, devices, notes)


def unknown_capacity_note(hardware, device: str) -> str:
    """Why a device's capacity is unknown: an unknown size is "not known", never 0 GiB."""
    if device == "cpu":
        why = hardware.memory.unavailable.get("usable_bytes", "not reported")
        return f"usable RAM unknown ({why}): no fit verdict"
    if not hardware.gpus:
        return f"the hardware has no {device} device: capacity unknown"
    gpu = hardware.gpus[0]
    if gpu.unified_memory or device == "mps":
        why = hardware.memory.unavailable.get("total_bytes", "not reported")
        return f"unified memory size of {gpu.name} unknown ({why}): no fit verdict"
    why = gpu.unavailable.get("vram_total_bytes", "not reported")
    return f"memory of {gpu.name} unknown ({why}): no fit verdict"


def _with_lora(setup: TrainingSetup, lora: LoraSettings) -> TrainingSetup:
    return dataclasses.replace(setup, lora=lora)


PEAK_NOTE = "tensor peak at the "  # the note that names the phase of the tensor peak


def peak_phase(notes: list[str]) -> str | None:
    """The phase the estimate puts the tensor peak in (its note), None for estimates without phases."""
    return next((n.split(";")[0].removeprefix(PEAK_NOTE) for n in notes if n.startswith(PEAK_NOTE)), None)


def _training_components(model: ModelSpec, st, setup: TrainingSetup, states, where, notes: list[str],
                         host_comps: list[MemoryComponent]) -> tuple[list[MemoryComponent], float]:
    full = where is None
    dpo = setup.method == "dpo"
    seqs = setup.micro_batch * (2 if dpo else 1)  # DPO: chosen + rejected
    tokens = seqs * setup.seq_len
    per_tok, core = act.layer_bytes_per_token(model, st, setup, where)
    scores = act.eager_scores_bytes(model, setup, tokens, setup.seq_len)
    layer = per_tok * tokens + scores
    n = model.num_layers
    r, a, mixed = act.dtype_bytes(model, setup)
    ckpt = setup.grad_checkpointing
    recompute = 0.0
    if ckpt == "full":
        # One hidden-state input per layer kept; one layer recomputed at a time during backward.
        saved_layers = n * r * model.hidden_size * tokens
        recompute = layer
        ckpt_what = f"full checkpointing: {n} layer inputs (b*s*h*{r} B) + one layer recomputed"
    elif ckpt == "selective":
        saved_layers = n * (layer - core * tokens - scores) + (core * tokens + scores)
        ckpt_what = "selective checkpointing: attention core recomputed, one layer's core alive"
    else:
        saved_layers = n * layer
        ckpt_what = f"{n} layers x {per_tok:.0f} B/token x {tokens} tokens" + (
            " + eager scores" if scores else "")
    drop = max(model.hidden_dropout, model.attention_dropout, model.embedding_dropout)
    if drop and model_dropout.runs(model, setup):
        ckpt_what += f"; with the model's own dropout (p={drop:g} in its config: masks kept for backward)"
    # Reentrant checkpoints around frozen FSDP units: each layer's input gradient is held too, up to
    # the last layer's recompute (framework_effects.held_layer_input_grads).
    input_grads = (n - 1) * r * model.hidden_size * tokens if runtime_of(setup).held_layer_input_grads else 0.0
    if input_grads:
        notes.append(f"transformers < 4.52 checkpoints each FSDP unit's call (reentrant): FSDP's reshard hooks "
                     f"hold every layer's input gradient until backward ends ({input_grads / 2**30:.2f} GiB); "
                     "gradient_checkpointing_kwargs={'use_reentrant': False} or transformers >= 4.52 avoids it")
    if setup.activation_offload:
        saved_layers, host = offload_activations(saved_layers, n, setup)
        host_comps.append(host)
        ckpt_what += "; offloaded to pinned CPU memory, 2 layers' worth on the GPU"
    final = act.final_norm_bytes_per_token(model, setup, full) * tokens
    final += vision.tower_saved_bytes(model, setup, seqs)
    if dpo:
        # TRL selective_log_softmax keeps the logits (fp32: for logsumexp; 16-bit: per-row
        # log_softmax outputs); its backward holds the gather grad, the per-row grads stacked
        # and the slice grad: 3 logits-sized tensors (calibrated on CPU, bench/memory_accuracy).
        loss_saved, loss_fwd, loss_bwd = a * model.vocab_size, a * model.vocab_size, 3 * a * model.vocab_size
        loss_saved, loss_fwd, loss_bwd = loss_saved * tokens, loss_fwd * tokens, loss_bwd * tokens
        loss_what = f"logits + loss: {tokens} tokens x vocab {model.vocab_size} (fp32 log_softmax, its grads)"
    else:
        lt = loss_kernels.loss_terms(model, setup, tokens, head_trains=full)
        loss_saved, loss_fwd, loss_bwd, loss_what = lt.saved, lt.forward, lt.backward, lt.what
    # autocast caches the 16-bit copy of every trained weight that a matmul reads; under FSDP and
    # DeepSpeed no autocast casts the model's own weights (act.engine_runs_autocast), so there is no
    # cache (FSDP's 16-bit gathered layers are counted in its gather floor).
    # Fused MoE experts run as a grouped matmul autocast does not cast (activations.expert_weight_bytes):
    # no 16-bit copy of them exists (measured on CPU: Mixtral under bf16 autocast +4.5 % -> exact).
    uncast = st.experts if setup.experts_fused else 0
    cache = 2.0 * (st.linear - uncast + (st.lm_head or st.embedding)) if (
        mixed and full and act.engine_runs_autocast(setup)) else 0.0
    # Frozen quantised / 16-bit base: one weight de-quantised (or cast) at a time.
    transient = states.dequant_transient
    # DoRA's weight-norm temporaries exist only inside a layer's forward, one layer at a time.
    dora_tmp = dora.forward_transient_bytes(model, setup)
    weights = states.weights + states.quant_overhead + states.lora
    ref = 0.0
    if dpo and setup.dpo_reference == "separate":
        if full:
            ref, ref_host = _full_reference_bytes(model, st, setup)
            if ref_host:
                host_comps.append(C("reference_model", int(ref_host), "frozen DPO reference's parameter shards, "
                                    "offloaded like the policy's (all ranks on this host)", True))
        else:
            ref = states.weights + states.quant_overhead
    g_acc = states.gradients if setup.grad_accum > 1 else 0.0
    if no_sync_applies(setup):
        # FSDP no_sync: unsharded gradients between micro-batches (framework_effects.py)
        g_acc = no_sync_gradient_bytes(st, setup, states.trainable)
    emb_grad_tmp = (model.vocab_size * model.hidden_size * (4 if r == 4 else 2)
                    * (2 if model.tie_embeddings else 1)) if full else 0.0
    # The lm_head (or tied embedding) gradient exists before any layer is recomputed.
    head_grad = (model.vocab_size * model.hidden_size * (4 if r == 4 else 2)) if full else 0.0
    # Under FSDP the root unit (embeddings, lm_head) reduce-scatters only after the embedding's
    # backward, the last of the step: a trained lm_head's unsharded gradient is held next to the
    # sharded accumulated ones through every layer's backward (bench/fsdp_no_sync_cpu.py, sync). Under
    # FSDP2's no_sync it accumulates into the root's unsharded gradient, which g_acc already holds;
    # FSDP1 holds it apart either way, waiting for the root's other parts (flat_root_bytes).
    sharded = full and setup.fsdp_strategy in SHARDED_STRATEGIES
    flat = sharded and setup.fsdp_flat_params
    head_apart = sharded and (flat or not no_sync_applies(setup))
    held_grads = g_acc + head_grad if head_apart else max(g_acc, head_grad)
    # The gradients alive when backward ends: the unsharded ones of every unit under no_sync.
    end_grads = max(states.gradients, g_acc)
    # FSDP1 at the embedding's backward: the lm_head's gradient, the embedding's and their
    # concatenation into the root's flat gradient, all at once (bench/fsdp_flat_root_cpu.py).
    root_cat = flat_root_bytes(st, setup, head_grad if not model.tie_embeddings else 0.0) if flat else 0.0
    base = weights + ref + states.optimizer + states.master_weights + states.buckets
    # What sharding holds gathered in each phase: FSDP's changes through the step (fsdp.gathered_by_phase);
    # ZeRO-3's current and prefetched block are counted in every phase.
    gathered = gathered_by_phase(st, setup) or dict.fromkeys(
        ACTIVATION_PHASES + STEP_PHASES + ("first layer backward",), states.gathered)
    acts = saved_layers + final + cache
    # Reference forward (no_grad) of DPO: logits for all chosen+rejected tokens, one layer's temps.
    ref_fwd = 0.0
    if dpo and setup.dpo_reference != "precomputed":
        ref_fwd = a * model.vocab_size * tokens + layer / 2
    # torch's foreach AdamW: one moment-sized temporary over all parameters (framework_effects.py).
    step_tmp = step_temporary_bytes(setup, states.optimizer)
    # A loop that keeps the model's output holds its logits from the loss to the step (framework_effects).
    kept = returned_logits_bytes(model, setup, a) * tokens if setup.output_kept and not dpo else 0.0
    previous = act.previous_step_bytes(model, st, setup, a, tokens)
    # The key/value cache a checkpointed forward returns (framework_effects.cached_kv_bytes_per_token):
    # 4-bit linears return their input's dtype, the stream's, others the compute dtype.
    kv_cache = cached_kv_bytes_per_token(model, setup, r if setup.quant in BNB_QUANTS else a) * tokens
    kv_kept = kv_cache if setup.output_kept else 0.0  # the kept output holds its cache too
    phases = {
        "forward": acts + loss_saved + loss_fwd + transient + dora_tmp + previous + kv_cache + g_acc,
        "loss backward": acts + loss_saved + loss_bwd + transient + kept + kv_kept + g_acc,
        "optimizer step": states.gradients + step_tmp + kept + kv_kept,
        # The embedding backward (embedding_dense_backward) builds a dense vocab x hidden grad
        # while every other grad is alive; tied embeddings add it to the lm_head's grad in place
        # (measured on CPU: two such tensors for tied, one for untied).
        "backward end": end_grads + emb_grad_tmp + root_cat + kept,
        "layer backward": held_grads + saved_layers + input_grads + final + recompute + cache + kept,
        "reference forward": ref_fwd + g_acc,
    }
    phases = {name: base + gathered[name] + more for name, more in phases.items()}
    # The backward runs the layers last to first: before the k-th, k-1 layers' saved tensors (or
    # checkpoints) are gone and their gradients have arrived (sharded under ZeRO / FSDP; FSDP2 then
    # also holds a second layer's unsharded gradient, fsdp.gathered_by_phase). The phase is linear
    # in k from the second layer on, so it is at its most at the first, second or last layer: the
    # last where a layer's gradient outweighs what it saved, as in a checkpointed full fine-tune
    # (measured on CPU: bench/fsdp_phases_cpu.py, tests/memory/test_layer_backward.py).
    layer_grad = 0.0 if g_acc or setup.optimizer_in_backward or not n else (
        states.gradients * (st.per_layer / st.total if full and st.total else 1.0 / n))
    first_layer = phases["layer backward"] - gathered["layer backward"] + gathered["first layer backward"]

    def layer_backward(k: int) -> float:
        if k == 1:
            return first_layer
        return (first_layer - gathered["first layer backward"] + gathered["layer backward"]
                - (k - 1) * saved_layers / n + (k - 1) * layer_grad)

    k_peak = max(sorted({1, 2, n} if n > 1 else {1}), key=layer_backward)
    phases["layer backward"] = layer_backward(k_peak)
    done_layers = k_peak - 1  # layers whose backward ran before the phase's peak
    if not done_layers:
        gathered["layer backward"] = gathered["first layer backward"]
    where_peak = max(phases, key=phases.get)
    notes.append(f"{PEAK_NOTE}{where_peak}; phases (GiB): "
                 + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in phases.items()))
    pool = phase_pool_bytes(phases, resident=base + min(gathered.values()) + g_acc)
    comps = [
        C("weights", int(states.weights), _weights_what(setup, model, st), True),
    ]
    if states.quant_overhead:
        comps.append(C("quant_overhead", int(states.quant_overhead), _quant_what(setup), True))
    if states.lora:
        per = trained_param_bytes(setup)
        dtype = "fp32" if per == 4 else "16-bit, LitGPT's bf16-true"
        comps.append(C("lora", int(states.lora), f"adapters r={setup.lora.rank}: {states.trainable:,} params x {per} B ({dtype})", True))
    if ref:
        comps.append(C("reference_model", int(ref), _reference_what(setup), True))
    if states.master_weights:
        comps.append(C("master_weights", int(states.master_weights), "fp32 master copy (4 B/param, sharded by ZeRO)", True))
    if states.optimizer:
        comps.append(C("optimizer", int(states.optimizer), _opt_what(setup), True))
    if gathered[where_peak] and setup.fsdp_strategy != "none":
        comps.append(C("fsdp_gathered", int(gathered[where_peak]), gathered_what(st, setup, where_peak), True))
    elif states.gathered:
        comps.append(C("zero3_gathered", int(states.gathered), "ZeRO-3: current + prefetched decoder block, 16-bit", True))
    if states.buckets:
        comps.append(C("grad_buckets", int(states.buckets), "DDP flat gradient buckets / ZeRO reduce bucket (hidden^2)", True))
    if kept and where_peak not in ("forward", "reference forward"):
        comps.append(C("kept_output", int(kept), "the model output's logits, kept by the training loop until "
                       "after the optimizer step", True))
    at_step = where_peak == "optimizer step"
    grads_at_peak = {"optimizer step": states.gradients, "backward end": end_grads}.get(where_peak, g_acc)
    if grads_at_peak:
        comps.append(C("gradients", int(grads_at_peak), _grad_what(setup, states, at_step=at_step), True))
    if where_peak == "optimizer step" and step_tmp:
        comps.append(C("optimizer_step_temporary", int(step_tmp), "foreach AdamW: sqrt of every second moment "
                       "at once (torch._foreach_sqrt), one moment's size", True))
    if where_peak == "backward end":
        comps.append(C("embedding_grad", int(emb_grad_tmp), "dense vocab x hidden grad of the embedding backward", True))
        if root_cat:
            comps.append(C("fsdp_root_gradient", int(root_cat), "FSDP1: the root unit's flat gradient concatenated "
                           "from its parts, with the lm_head's gradient that waited for it", True))
    if where_peak in ("optimizer step", "backward end"):
        return comps, pool
    if where_peak == "reference forward":
        comps.append(C("reference_forward", int(ref_fwd), "reference logits (2*b*s*vocab) + one layer's temporaries, no_grad", True))
        return comps, pool
    if where_peak == "layer backward":
        held_what = f" + {n - 1} layer-input gradients held by FSDP's reshard hooks" if input_grads else ""
        left = saved_layers * (n - done_layers) / n
        comps.append(C("activations", int(left + input_grads + final + recompute),
                       ckpt_what + held_what + (f"; {done_layers} layer(s) done (their backward ran)" if done_layers
                                                else ""), True))
        if cache:
            comps.append(C("autocast_weight_cache", int(cache), "autocast's 16-bit copies of trained weights", True))
        if head_apart and g_acc:
            comps.append(C("lm_head_gradient", int(head_grad), "lm_head gradient, unsharded until the FSDP root "
                           "unit's reduce-scatter at the end of backward", True))
        elif not g_acc and head_grad:
            comps.append(C("gradients", int(head_grad), "lm_head gradient, alive before layers recompute", True))
        if done_layers and layer_grad:
            comps.append(C("finished_layer_gradients", int(done_layers * layer_grad),
                           f"gradients of the {done_layers} layer(s) whose backward ran first"
                           + (" (sharded, back from their reduce-scatter)" if setup.shard_group > 1 and
                              setup.zero_stage >= 2 else ""), True))
        return comps, pool
    comps.append(C("activations", int(saved_layers + final), ckpt_what, True))
    if cache:
        comps.append(C("autocast_weight_cache", int(cache), "autocast's 16-bit copies of trained weights: 2 B/param", True))
    loss_extra = loss_fwd if where_peak == "forward" else loss_bwd
    comps.append(C("logits", int(loss_saved + loss_extra), loss_what, True))
    if transient:
        comps.append(C("dequant_transient", int(transient), "largest quantised weight de-quantised to 16-bit"
                       + (" (fp16, and its bf16 cast)" if runtime_of(setup).dequant_copies == 2 else ""), True))
    if dora_tmp and where_peak == "forward":
        comps.append(C("dora_transient", int(dora_tmp), "DoRA: B@A, the cast weight and W + s*BA of the largest "
                       "adapted layer (its forward)", True))
    if kv_cache and where_peak == "forward":
        comps.append(C("kv_cache", int(kv_cache), f"key/value cache of {n} checkpointed layers (use_cache left on "
                       "before transformers 4.53), each a view keeping its whole c_attn output", True))
    if previous and where_peak == "forward":
        comps.append(C("previous_step", int(previous), "the previous micro-step's logits"
                       + (" and the inputs bitsandbytes kept on its autograd ctx" if runtime_of(setup).previous_has_inputs else "")
                       + ", held by the loop's names until this forward returns", True))
    return comps, pool


def _full_reference_bytes(model: ModelSpec, st, setup: TrainingSetup) -> tuple[float, float]:
    """(per GPU, per host) bytes of a full fine-tune's DPO reference, a frozen copy of the base model.
    TRL's DPOTrainer hands it to the policy's engine (trl.models.utils.prepare_deepspeed / prepare_fsdp):
    * DeepSpeed: deepspeed.initialize casts it to the engine's 16-bit dtype (DeepSpeedEngine.
      _configure_distributed_model); under ZeRO-3 it keeps stage 3, so it is partitioned over the ranks
      like the policy's weights (offload_param included); any other stage becomes 0, a whole copy per GPU;
    * FSDP wraps it like the policy: sharded flat parameters in the loaded dtype, offloaded with them;
    * with neither, it is the model's own copy (its dtype, whole on every GPU)."""
    if (setup.uses_deepspeed and setup.zero_stage == 3) or setup.fsdp_strategy != "none":
        on_gpu = model_states(model, st, dataclasses.replace(setup, offload="none"), 0).weights
        if setup.offload == "optimizer+params":
            return 0.0, on_gpu * setup.gpus_per_node
        return on_gpu, 0.0
    if setup.uses_deepspeed:
        return st.total * (4.0 if setup.precision == "fp32" else 2.0), 0.0
    return st.total * (4.0 if setup.precision in ("fp32", "bf16-mixed", "fp16-mixed") else 2.0), 0.0


def _reference_what(setup: TrainingSetup) -> str:
    what = "frozen DPO reference: a second copy of the base weights"
    dtype = "fp32" if setup.precision == "fp32" else "16-bit"
    if setup.uses_deepspeed and setup.zero_stage == 3:
        return what + f", {dtype} / {setup.shard_group} GPUs (ZeRO-3 partitions it like the policy)"
    if setup.fsdp_strategy != "none" and fsdp_shards(setup) > 1:
        return what + f" / {fsdp_shards(setup)} GPUs (FSDP shards it like the policy)"
    if setup.uses_deepspeed:
        return what + f", {dtype}, whole on every GPU (TRL prepares it with ZeRO stage 0)"
    return what


def _weights_what(setup: TrainingSetup, model: ModelSpec, st) -> str:
    if setup.quant in quant_formats.PREQUANTISED:
        return quant_formats.describe(setup.quant)[0]
    rest = "fp32 (PEFT k-bit preparation)" if runtime_of(setup).kbit_upcast else "16-bit"
    head_q = runtime_of(setup).quantised_lm_head_params(model) > 0
    quantised, kept = ("linear weights and lm_head", "embeddings, norms") if head_q else (
        "linear weights", "embeddings, norms, lm_head")
    if quant_formats.experts_left_dense(st, setup):
        kept += ", fused MoE experts and routers"
    if setup.quant in ("nf4", "nf4-dq"):
        return f"{quantised} NF4 (0.5 B/param); {kept} in {rest}"
    if setup.quant == "int8":
        return f"{quantised} int8 (1 B/param); {kept} in {rest}"
    b = 4 if setup.precision in ("fp32", "bf16-mixed", "fp16-mixed") else 2
    if setup.fsdp_strategy != "none":
        shards = "" if setup.fsdp_strategy == "no-shard" else f" / {setup.shard_group} GPUs"
        return f"params x {b} B{shards} (FSDP {setup.fsdp_strategy}: sharded flat parameters are the master copy)"
    if setup.zero_stage >= 1 and setup.precision.endswith("-mixed"):
        b = 2
    return f"params x {b} B" + (f" / {setup.num_gpus} GPUs (ZeRO-3)" if setup.zero_stage == 3 else "")


def _quant_what(setup: TrainingSetup) -> str:
    if setup.quant in quant_formats.PREQUANTISED:
        return quant_formats.describe(setup.quant)[1]
    if setup.quant == "nf4":
        return "NF4 absmax: one fp32 per 64 weights (0.0625 B/param)"
    if setup.quant == "nf4-dq":
        return "double-quantised absmax: uint8 per 64 weights + fp32 per 256 blocks (0.0159 B/param)"
    return "LLM.int8 row scales: one fp32 per output row"


def _opt_what(setup: TrainingSetup) -> str:
    shard = f" / {setup.num_gpus} (ZeRO-{setup.zero_stage})" if setup.zero_stage >= 1 else ""
    if setup.fsdp_strategy != "none":
        shard = "" if setup.fsdp_strategy == "no-shard" else f" / {setup.shard_group} (FSDP {setup.fsdp_strategy})"
    adamw = ("(8 B/param fp32)" if trained_param_bytes(setup) == 4
             else "(4 B/param: 16-bit moments of 16-bit parameters)")
    return {
        "adamw": f"AdamW: 2 moments x param dtype {adamw}",
        "adamw-8bit": "8-bit AdamW: 2 x (1 B + fp32 absmax per 256) per param",
        "paged-adamw-8bit": "paged 8-bit AdamW: 2 x (1 B + fp32 absmax per 256) per param",
        "paged-adamw-32bit": "paged 32-bit AdamW (bitsandbytes): 2 fp32 moments (8 B/param), pageable to CPU RAM",
        "sgd": "SGD: no state",
        "sgd-momentum": "SGD momentum buffer: 1 x param dtype",
        "adafactor": "Adafactor: factored second moments (rows + cols per matrix)",
        "lion": "Lion: 1 momentum x param dtype",
    }[setup.optimizer] + shard


def _grad_what(setup: TrainingSetup, states, *, at_step: bool) -> str:
    if setup.optimizer_in_backward:
        return "optimizer in backward: at most the largest parameter's gradient alive"
    if no_sync_applies(setup) and not at_step:
        return ("unsharded gradients of every trained FSDP unit, kept across accumulation micro-steps "
                "(FSDP no_sync: no reduce-scatter until the last micro-batch)")
    why = "alive at the optimizer step" if setup.grad_accum == 1 else "kept across accumulation micro-steps"
    shard = f" / {setup.shard_group} GPUs (ZeRO-{setup.zero_stage})" if (
        setup.uses_deepspeed and setup.zero_stage >= 2 and setup.shard_group > 1) else ""
    return f"gradients of {states.trainable:,} trainable params{shard} ({why})"
