"""The runtime record: how the framework (and which version of it) that runs a setup behaves.

`runtime_of(setup)` reads the runtime knobs of a TrainingSetup (optimizer_impl, bnb_keeps_input,
kbit_upcast, autocast_16bit_weights, fsdp_no_sync, the fields a transformers release decides, ...)
once, into a frozen `Runtime` whose fields say what runs. The memory model (core/memory) and the
speed model (core/speed) both read it instead of interpreting those knobs themselves. The version rules that
turn a library release into those knobs (`transformers_knobs`, `bnb_keeps_input_for`) live here too.
Behaviours that also depend on the model's shape are methods of the record taking the ModelSpec.

trainfit's own runs are the defaults; the knobs describe what other tools do, so an estimate can be
made for the run a user will actually launch (and published measurements can be compared).

* AdamW's step (TrainingSetup.optimizer_impl). torch.optim.AdamW without foreach/fused picks the
  foreach implementation on CUDA (torch/optim/optimizer.py `_default_to_fused_or_foreach`, the
  default since torch 2.0; LitGPT and the HF Trainer's `adamw_torch` build it that way). The
  foreach step (`_multi_tensor_adam`) takes `torch._foreach_sqrt(exp_avg_sqs)` of every parameter
  of a device/dtype group at once before the addcdiv, so one second-moment-sized temporary is alive
  next to weights, gradients and both moments. The fused kernel (`fused=True`, what trainfit
  exports on a GPU: export/training_args.optim_name) and the per-parameter loop (torch's choice on a
  CPU) hold at most one parameter's worth. DeepSpeed steps with its own fused or CPU Adam.
* bitsandbytes' 4-bit matmul (TrainingSetup.bnb_keeps_input). `MatMul4Bit.forward` kept its input A
  on `ctx.tensors = (A, B)` whenever a gradient was needed, although backward never reads it;
  bitsandbytes 0.43.2 keeps `(None, B)` (commit 9e75374, "fix QLoRA mem bug: delete useless
  buffered activation", PR #1270, July 2024). Before that every 4-bit linear kept its input, as
  LLM.int8 still does: activations.py counts that term for both.
* FSDP units that mix frozen and trained parameters (TrainingSetup.fsdp_mixed_units). With
  use_orig_params=True FSDP allows a unit whose flat parameter holds frozen weights and adapters,
  but "the gradient memory usage will be higher than expected (namely, equivalent to not freezing
  those parameters)" (torch.distributed.fsdp docs, FullyShardedDataParallel): the flat gradient
  covers the whole unit. LitGPT wraps each transformer Block with its LoRA weights inside
  (Lightning-AI/litgpt#1417, #1538); PEFT's fsdp_auto_wrap_policy, which the HF Trainer applies to
  PEFT models and trainfit runs, wraps the adapters in units of their own.
* PEFT's k-bit preparation (TrainingSetup.kbit_upcast). `prepare_model_for_kbit_training` casts
  every 16-bit parameter that is not a bitsandbytes 4-bit weight to fp32 (peft/utils/other.py):
  embeddings, norms and the lm_head, so the embedding output and the residual stream are fp32
  while the quantised linears compute in 16 bits. TRL's SFTTrainer calls it for a bitsandbytes
  base and skips it for sharded QLoRA (FSDP / ZeRO-3 with a 16-bit quant storage), where a flat
  parameter must hold one dtype. trainfit's runner does the same preparation without the cast
  (train/trainer_setup.prepare_quantized_base), as LitGPT, torchtune and fsdp_qlora keep the 16-bit dtype:
  for Llama 3 8B the cast alone is 2.1 GB of fp32 embeddings and lm_head.
* Autocast over a 16-bit model (TrainingSetup.autocast_16bit_weights): Transformers' usual QLoRA
  recipe loads the model with torch_dtype=bfloat16 and trains with --bf16, which enables autocast.
  nn.LayerNorm is on autocast's fp32 list (torch.amp docs, "CUDA Ops that can autocast to
  float32"), so a LayerNorm model's norm outputs are fp32; bitsandbytes' Linear4bit casts its input
  to the compute dtype and its output back to the input's dtype (`out.to(inp_dtype)`,
  bitsandbytes/nn/modules.py 0.41-0.45), so the MLP's output projection returns fp32 and the
  residual add promotes the stream to fp32 from the first block on: the dtype flow of an fp32
  model under autocast (activations.dtype_bytes). RMSNorm models (Llama, Mistral, Qwen, Gemma) cast
  the norm output back to the input dtype themselves, so their stream stays 16-bit, as measured
  (fms-acceleration's Mistral 7B QLoRA allocated within 1 %). log_softmax is on the same fp32 list,
  so a transformers < 4.49 loss on 16-bit logits (own_forward_16bit_loss) runs in fp32 under it.
  fms-acceleration's SantaCoder QLoRA (--bf16, LayerNorm, 4-bit c_attn/c_fc/c_proj): allocated
  -56 % without this rule, -11 % with it.
* FSDP gradient accumulation without a reduce-scatter per micro-batch (TrainingSetup.fsdp_no_sync).
  Under `FullyShardedDataParallel.no_sync()` "FSDP will accumulate the full model gradients
  (instead of gradient shards) until the eventual sync" (torch.distributed.fsdp docs): every unit
  that trains keeps its unsharded gradient, in the dtype of its gathered flat parameter, from the
  first micro-batch to the last. The HF Trainer enters no_sync for every micro-batch but the last
  unless Accelerate's `sync_each_batch` is set (transformers trainer.py; Accelerate's
  gradient-synchronization guide: "no_sync requires additional GPU memory when using FSDP",
  accelerate#2531); Lightning Fabric's `no_backward_sync` and fsdp_qlora's `--no_sync` do the same.
  trainfit's exports set sync_each_batch (export/training_args.py), so its own runs keep shards.
* FSDP1's flat parameters (TrainingSetup.fsdp_flat_params). FullyShardedDataParallel gives the
  modules views of one FlatParameter per unit, so autograd forms the unit's gradient in the split's
  backward, concatenating the parts once the last one arrives. The root unit's last part is the
  embedding's, at the end of backward: the lm_head's gradient has waited since the loss, and it, the
  embedding's dense gradient and the concatenated root are alive at once (fsdp.flat_root_bytes;
  measured on CPU by bench/fsdp_flat_root_cpu.py). FSDP2 (fully_shard) keeps a gradient per
  parameter. The HF Trainer runs FSDP1 through Accelerate's default fsdp_version before
  transformers 5 (trainfit exports version 2 from 5 on), as do Lightning's FSDPStrategy and fsdp_qlora.
* Lightning Fabric's bitsandbytes plugin (TrainingSetup.quantize_lm_head, bnb_fp16_quant_state), which
  LitGPT's `--quantize bnb.*` uses (src/lightning/fabric/plugins/precision/bitsandbytes.py, unchanged
  on this point since it was added in 2023-09). Its module_init_context replaces `torch.nn.Linear`
  while the model is built, so the lm_head is quantised too (Transformers' BitsAndBytesConfig skips
  it: get_keys_to_not_convert). Its 4-bit `quantize` casts every weight with
  `.to(device=device, dtype=torch.half)` before `quantize_4bit`, so the QuantState's dtype is fp16:
  bitsandbytes' MatMul4Bit then runs `F.dequantize_4bit(B, quant_state).to(A.dtype)` in forward and
  backward (autograd/_functions.py, 0.41-0.43), which with a bf16 compute dtype holds the fp16
  de-quantised weight and its bf16 cast at once: two copies of the largest quantised weight, which
  for a quantised lm_head at a 128k vocabulary is 2 GB.
* The causal-LM loss of transformers before 4.49 (TrainingSetup.logits_shift_copy). ForCausalLMLoss
  (loss/loss_utils.py, 4.46-4.48) and the model forwards before it (modeling_llama.py 4.37.2) upcast
  the logits to fp32 and then copy the shifted logits, `logits[..., :-1, :].contiguous()`, before
  cross_entropy: a second fp32 logits-sized tensor during the loss forward. 4.49.0 pads the labels
  instead and shifts them. gpt_bigcode, bloom, falcon, gpt_neox, opt, mpt and dbrx computed their
  loss in their own forward on the 16-bit logits (no upcast) with the same copy, in 16 bits
  (own_forward_16bit_loss). fms-acceleration's reference runs pin 4.48.1: with the copy, their Mistral 7B
  LoRA peak allocated is predicted within 1 % (4.5-6.2 % under without it). Before 4.46 the forward
  itself upcast the logits it returns (modeling_llama.py 4.45.2: `self.lm_head(...).float()`), so
  the 16-bit logits are freed at once and the returned ones are fp32 (TrainingSetup.logits_returned_fp32).
* MoE experts under bitsandbytes (TrainingSetup.experts_fused). transformers 5 stores a layer's routed
  experts as fused 3-D parameters (experts.gate_up_proj / down_proj, e.g. MixtralExperts) and the
  router as a plain parameter; bitsandbytes' loading replaces nn.Linear / Conv1D modules only
  (integrations/bitsandbytes.py replace_with_bnb_linear), so with --quant nf4 / nf4-dq / int8 the
  experts, the bulk of an MoE's weights, stay in the load dtype ("silently skipped and stay full
  precision": bitsandbytes-foundation/bitsandbytes#1849, open in 2026-11; its fix, Experts4bit, is
  an unmerged pull request) - and PEFT's k-bit preparation then casts them to fp32 with the other
  16-bit parameters. transformers 4 builds one nn.Linear per expert (w1, w2, w3), which bitsandbytes
  quantises and de-quantises one at a time.
* Reentrant gradient checkpointing around FSDP units
  (TrainingSetup.reentrant_checkpoint_around_fsdp_units). Before 4.52 transformers checkpoints
  `decoder_layer.__call__` (modeling_llama.py 4.48.1: `self._gradient_checkpointing_func(
  decoder_layer.__call__, ...)`, reentrant unless gradient_checkpointing_kwargs says otherwise), and
  under FSDP1 that call is the FSDP unit's. The recompute in backward then runs FSDP's pre-forward on
  the checkpoint's detached input, a leaf: for a unit whose parameters are all frozen (LoRA / QLoRA
  with PEFT's wrap policy) FSDP registers its reshard-only hook with `register_multi_grad_hook` on
  that leaf (torch/distributed/fsdp/_runtime_utils.py), keeps the handle on the flat parameter until
  its end-of-backward callback, and the leaf's AccumulateGrad node keeps the leaf, so every layer's
  input and that input's gradient live until backward ends: one more hidden-state tensor per layer
  and token at the last layer's recompute. 4.52's GradientCheckpointingLayer checkpoints inside the
  unit, and a non-reentrant checkpoint registers the hook on the forward's own input, whose autograd
  node does not keep it (PEFT's run_peft_fsdp.sh passes --use_reentrant False, its QLoRA scripts
  True). Measured on CPU (bench/fsdp_reentrant_cpu.py, FSDP1 over gloo, PEFT LoRA): the reentrant
  checkpoint around the units holds 6.2 / 14.5 hidden states more than inside them at 8 / 16 layers
  (7 / 15 predicted), the non-reentrant one none; traced at Llama 2 70B's shapes
  (bench/held_grads_replay.py) 9.99 / 19.74 GiB at 2 / 4 x 4096 tokens (9.88 / 19.75 predicted).
  fms-acceleration's Llama 2 70B FSDP QLoRA (4.48.1) holds 1.2 MiB per token more than one GPU,
  80 layers x 8192 x 2 B. fsdp_qlora applies torch's checkpoint wrapper inside the units.
* Falcon's multi-query attention before transformers 5.25 (TrainingSetup.mqa_kv_unrepeated). Up to
  5.24 FalconAttention called scaled_dot_product_attention itself with the multi-query layout's one
  key/value head (models/falcon/modeling_falcon.py `_split_heads`, `fused_qkv[..., [-2], :]`), keys
  with fewer heads than the queries, which only SDPA's math path broadcasts: it saves the scores and
  probabilities as eager attention does (activations.attention_kind). 5.25 rewrote FalconAttention
  onto ALL_ATTENTION_FUNCTIONS (no FalconFlashAttention2, no `_split_heads`): integrations/
  sdpa_attention.py `sdpa_attention_forward` repeats the keys and values to every query head
  (`repeat_kv`, copies: Falcon's mask is always materialised, so `use_gqa_in_sdpa` is false), and
  SDPA keeps its fused kernel. Measured on CPU with the live-tensor counter (tests/models/
  test_architecture_memory.py, tiny falcon-7b, full fp32): 31,985,936 B peak under 5.24.0, 27,095,264 B
  under 5.25.0; the new decoder architecture (already broadcast before SDPA) and ALiBi falcon-rw
  (multi-head) measure the same under both.
* A training loop that keeps the model's output (TrainingSetup.output_kept): `outputs =
  model(**batch); accelerator.backward(outputs.loss)` (transformers' run_clm_no_trainer.py) or
  fsdp_qlora's train.py (`output = None` only after the optimizer step) hold the returned logits
  through the whole backward and the step; the HF Trainer's compute_loss returns the loss alone, so
  the output is freed before backward, as in trainfit's runner.
* A loop whose names hold the previous micro-step's until the next forward returns
  (TrainingSetup.previous_step_kept): LitGPT's finetune scripts assign `logits = model(...)` and
  `loss = chunked_cross_entropy(...)` each iteration with no `del`, so while the next forward runs
  the previous logits are alive, and the previous loss keeps its autograd graph. Backward freed
  that graph's saved tensors, but not what a custom autograd Function stored as a plain attribute:
  bitsandbytes' MatMul4Bit (before 0.43.2) and MatMul8bitLt keep their input on `ctx.tensors`, so
  every quantised layer's input of the previous step is still there (without checkpointing; a
  checkpointed layer's recomputed graph is gone after its backward). LitGPT's config-hub QLoRA runs
  (2024, bitsandbytes 0.42) need about twice the kept inputs of one step over their LoRA runs; the
  2023 resource tables, whose first iteration was the longest batch, need once.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup
from trainfit.versions import release_tuple

BNB_INPUT_FIX_VERSION = (0, 43, 2)
TRANSFORMERS_PADDED_LABELS_VERSION = (4, 49, 0)
TRANSFORMERS_FUSED_EXPERTS_VERSION = (5, 0, 0)
TRANSFORMERS_16BIT_LOGITS_VERSION = (4, 46, 0)
TRANSFORMERS_CHECKPOINT_LAYER_VERSION = (4, 52, 0)  # GradientCheckpointingLayer
# GradientCheckpointingLayer turns use_cache off in every layer (transformers#38913, in 4.53.0).
TRANSFORMERS_CHECKPOINT_DROPS_CACHE_VERSION = (4, 53, 0)
# trainfit exports FSDP2 (Accelerate fsdp_version 2) for transformers >= 5 and FSDP1 before, which
# is also Accelerate's default there (export/fsdp.py).
TRANSFORMERS_FSDP2_VERSION = (5, 0, 0)
# FalconAttention runs through the shared attention integrations (sdpa_attention_forward's repeat_kv)
TRANSFORMERS_FALCON_SHARED_ATTENTION_VERSION = (5, 25, 0)
BITSANDBYTES = ("nf4", "nf4-dq", "int8")  # quantised while loading, by replacing nn.Linear modules
BNB_QUANTS = ("nf4", "nf4-dq")
LM_HEAD_QUANTS = BITSANDBYTES  # bitsandbytes' layers, which a plugin can swap in for the lm_head
PEFT_PREPARED_QUANTS = BITSANDBYTES  # PEFT skips GPTQ (and AQLM, EETQ, HQQ, torchao)
# FSDP strategies that shard parameters (and so gradients) over the ranks.
SHARDED_STRATEGIES = ("full-shard", "shard-grad-op")


@dataclass(frozen=True)
class Runtime:
    """What the framework that runs a setup does, read once from its knobs (runtime_of)."""

    optimizer_impl: str  # the AdamW implementation that runs: 'fused', 'foreach' or 'for-loop'
    foreach_step_temporary: bool  # a foreach AdamW step holds one moment-sized temporary
    quantised_inputs_kept: bool  # every quantised linear keeps its 16-bit input for backward
    kbit_upcast: bool  # PEFT's k-bit preparation: non-quantised weights and the stream fp32
    autocast_over_4bit: bool  # autocast over a 16-bit model with bitsandbytes 4-bit linears
    lm_head_quantised: bool  # a bitsandbytes plugin quantises an untied lm_head too
    dequant_copies: int  # de-quantised copies of one 4-bit weight alive at once (1 or 2)
    fsdp_no_sync: bool  # micro-batches accumulate unsharded FSDP gradients
    held_layer_input_grads: bool  # every checkpointed layer's input gradient lives to backward's end
    previous_has_inputs: bool  # the previous step's graph still holds bitsandbytes' kept inputs
    kv_cache_under_checkpointing: bool  # a checkpointed transformers forward may keep its kv cache
    logits_returned_fp32: bool  # the forward upcasts the logits it returns (transformers < 4.46)
    legacy_16bit_loss_setup: bool  # a transformers < 4.49 own-forward loss in pure 16-bit precision
    legacy_autocast_loss_setup: bool  # the same loss under autocast
    # The knobs that are their own behaviour, as the setup sets them:
    experts_fused: bool  # MoE experts are fused 3-D parameters (transformers >= 5)
    logits_shift_copy: bool  # the causal-LM loss copies the shifted logits (transformers < 4.49)
    output_kept: bool  # the training loop keeps the model's output through backward and the step
    previous_step_kept: bool  # the loop's names hold the previous micro-step's output and loss
    fsdp_flat_params: bool  # FSDP1's flat parameters (FSDP2 keeps a gradient per parameter)
    fsdp_mixed_units: bool  # FSDP units hold frozen weights and adapters together
    mqa_kv_unrepeated: bool  # Falcon's one key/value head goes to SDPA unrepeated (transformers < 5.25)

    def fp32_stream_under_autocast(self, spec: ModelSpec) -> bool:
        """A 16-bit LayerNorm model under autocast with bitsandbytes 4-bit linears: the norm outputs are
        fp32 and each 4-bit linear returns its input's dtype, so the residual stream is fp32."""
        return self.autocast_over_4bit and spec.norm == "layernorm"

    def fp32_stream_over_16bit_weights(self, spec: ModelSpec) -> bool:
        """The residual stream is fp32 while the quantised linears compute in 16 bits: PEFT's k-bit
        preparation cast the embeddings and norms to fp32, or autocast's fp32 LayerNorm output runs
        through 4-bit linears. Saved activations (memory) and elementwise traffic (speed) follow it."""
        return self.kbit_upcast or self.fp32_stream_under_autocast(spec)

    def quantised_lm_head_params(self, spec: ModelSpec) -> int:
        """Weights of the lm_head that a bitsandbytes quantisation covers (TrainingSetup.quantize_lm_head):
        its own weight only; a head tied to the embeddings stays 16-bit with them."""
        if not self.lm_head_quantised or spec.tie_embeddings:
            return 0
        return spec.vocab_size * spec.hidden_size

    def kv_cache_kept(self, spec: ModelSpec) -> bool:
        """A checkpointed forward keeps the key/value cache (cache_under_checkpointing in model code
        without its own override)."""
        return self.kv_cache_under_checkpointing and spec.capabilities.cache_under_checkpointing

    def logits_upcast_by_forward(self, spec: ModelSpec) -> bool:
        """The model's forward returns fp32 logits: transformers < 4.46, except the architectures whose
        own forward computed the loss on the 16-bit logits (own_forward_loss)."""
        return self.logits_returned_fp32 and not own_forward_loss(spec)

    def legacy_loss_in_16bit(self, spec: ModelSpec) -> bool:
        """The loss of a transformers < 4.49 run (logits_shift_copy) is computed on 16-bit logits: the
        architecture's own forward skips the upcast, and in pure 16-bit precision no autocast runs
        log_softmax in fp32 (autocast_16bit_weights does)."""
        return self.legacy_16bit_loss_setup and spec.capabilities.own_forward_16bit_loss

    def legacy_loss_under_autocast(self, spec: ModelSpec) -> bool:
        """The same own-forward loss of a transformers < 4.49 run under autocast: the shifted copy is
        made of the 16-bit logits, and autocast then casts it to fp32 for cross_entropy."""
        return self.legacy_autocast_loss_setup and spec.capabilities.own_forward_16bit_loss


# The last setup read and its record: one estimate reads the same (frozen) setup a score of times.
_last_read: tuple[TrainingSetup, Runtime] | None = None


def runtime_of(setup: TrainingSetup) -> Runtime:
    """The runtime record of `setup`: each framework behaviour its knobs describe, resolved."""
    global _last_read
    last = _last_read
    if last is not None and last[0] is setup:
        return last[1]
    runtime = _read(setup)
    _last_read = (setup, runtime)
    return runtime


def _read(setup: TrainingSetup) -> Runtime:
    impl = _resolved_optimizer_impl(setup)
    sharded = setup.zero_stage >= 3 or setup.fsdp_strategy in SHARDED_STRATEGIES
    legacy_loss = setup.logits_shift_copy and setup.loss == "standard"
    return Runtime(
        optimizer_impl=impl,
        foreach_step_temporary=(setup.optimizer == "adamw" and impl == "foreach" and not setup.uses_deepspeed),
        quantised_inputs_kept=setup.quant == "int8" or (setup.bnb_keeps_input and setup.quant in BNB_QUANTS),
        kbit_upcast=(setup.kbit_upcast and setup.quant in PEFT_PREPARED_QUANTS and not sharded
                     and setup.method != "inference"),
        autocast_over_4bit=setup.autocast_16bit_weights and setup.quant in BNB_QUANTS,
        lm_head_quantised=setup.quantize_lm_head and setup.quant in LM_HEAD_QUANTS,
        dequant_copies=_dequant_copies(setup),
        fsdp_no_sync=(setup.fsdp_no_sync and setup.grad_accum > 1 and setup.fsdp_strategy in SHARDED_STRATEGIES),
        held_layer_input_grads=(setup.reentrant_checkpoint_around_fsdp_units and setup.grad_checkpointing == "full"
                                and setup.fsdp_strategy != "none" and setup.trains_adapters
                                and not setup.fsdp_mixed_units),
        previous_has_inputs=(setup.previous_step_kept and setup.grad_checkpointing == "none"
                             and setup.trains_adapters),
        kv_cache_under_checkpointing=(setup.cache_under_checkpointing and setup.grad_checkpointing != "none"
                                      and setup.method != "inference" and setup.model_code == "transformers"),
        logits_returned_fp32=setup.logits_returned_fp32,
        legacy_16bit_loss_setup=(legacy_loss and setup.precision in ("bf16", "fp16")
                                 and not setup.autocast_16bit_weights),
        legacy_autocast_loss_setup=(legacy_loss and (setup.precision.endswith("-mixed")
                                                     or setup.autocast_16bit_weights)),
        experts_fused=setup.experts_fused,
        logits_shift_copy=setup.logits_shift_copy,
        output_kept=setup.output_kept,
        previous_step_kept=setup.previous_step_kept,
        fsdp_flat_params=setup.fsdp_flat_params,
        fsdp_mixed_units=setup.fsdp_mixed_units,
        mqa_kv_unrepeated=setup.mqa_kv_unrepeated,
    )


def _resolved_optimizer_impl(setup: TrainingSetup) -> str:
    """The AdamW implementation that runs: 'auto' is fused on an accelerator, the loop on a CPU."""
    if setup.optimizer_impl != "auto":
        return setup.optimizer_impl
    return "for-loop" if setup.device == "cpu" else "fused"


def _dequant_copies(setup: TrainingSetup) -> int:
    """De-quantised copies of one 4-bit weight alive at once: 2 when the QuantState is fp16 and the
    compute dtype bf16 (the fp16 result and its cast), else 1."""
    bf16_compute = setup.precision in ("bf16", "bf16-mixed")
    return 2 if setup.bnb_fp16_quant_state and setup.quant in BNB_QUANTS and bf16_compute else 1


def own_forward_loss(spec: ModelSpec) -> bool:
    """The architecture computed its loss in its own forward before transformers 4.49, on the logits
    as the lm_head returned them: it never upcast them (ModelCapabilities.own_forward_16bit_loss)."""
    return spec.capabilities.own_forward_16bit_loss


# -- version rules: the knobs a library release decides -------------------------------------------

def bnb_keeps_input_for(version: str) -> bool:
    """True for a bitsandbytes release whose 4-bit matmul keeps its input (before 0.43.2);
    ValueError for a string that is not a release number."""
    return _release(version) < BNB_INPUT_FIX_VERSION


def _release(version: str) -> tuple[int, int, int]:
    return release_tuple(version, minor_required=True)


def logits_shift_copy_for(version: str) -> bool:
    """True for a transformers release whose causal-LM loss copies the shifted logits (before 4.49);
    ValueError for a string that is not a release number."""
    return _release(version) < TRANSFORMERS_PADDED_LABELS_VERSION


def logits_returned_fp32_for(version: str) -> bool:
    """True for a transformers release whose causal-LM forward returns fp32 logits (before 4.46)."""
    return _release(version) < TRANSFORMERS_16BIT_LOGITS_VERSION


def experts_fused_for(version: str) -> bool:
    """True for a transformers release that holds MoE experts as fused 3-D parameters (5.0 on)."""
    return _release(version) >= TRANSFORMERS_FUSED_EXPERTS_VERSION


def checkpoint_around_units_for(version: str) -> bool:
    """True for a transformers release whose gradient checkpointing wraps each decoder layer's call
    (before 4.52), which under FSDP is the unit's; reentrant is its default."""
    return _release(version) < TRANSFORMERS_CHECKPOINT_LAYER_VERSION


def cache_under_checkpointing_for(version: str) -> bool:
    """True for a transformers release in which gradient checkpointing leaves use_cache on in model
    code without its own override (before 4.53)."""
    return _release(version) < TRANSFORMERS_CHECKPOINT_DROPS_CACHE_VERSION


def fsdp_flat_params_for(version: str) -> bool:
    """True for a transformers release under which the HF Trainer runs FSDP1 (flat parameters):
    before 5, what trainfit's exports and Accelerate's default fsdp_version give."""
    return _release(version) < TRANSFORMERS_FSDP2_VERSION


def mqa_kv_unrepeated_for(version: str) -> bool:
    """True for a transformers release whose Falcon attention hands SDPA a multi-query layer's one
    key/value head unrepeated, which sends SDPA down its math path (before 5.25)."""
    return _release(version) < TRANSFORMERS_FALCON_SHARED_ATTENTION_VERSION


def transformers_knobs(version: str) -> dict[str, bool]:
    """The TrainingSetup fields a transformers release decides (ValueError for a non-release string)."""
    return dict(logits_shift_copy=logits_shift_copy_for(version),
                logits_returned_fp32=logits_returned_fp32_for(version),
                experts_fused=experts_fused_for(version),
                reentrant_checkpoint_around_fsdp_units=checkpoint_around_units_for(version),
                cache_under_checkpointing=cache_under_checkpointing_for(version),
                fsdp_flat_params=fsdp_flat_params_for(version),
                mqa_kv_unrepeated=mqa_kv_unrepeated_for(version))
