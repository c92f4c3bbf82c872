"""Model states: weights, gradients, optimizer states, master weights; quantised weights; ZeRO.

Sources:
* ZeRO (Rajbhandari et al. 2020, arXiv 1910.02054): mixed-precision Adam = 2+2+12 = 16 B/param;
  per GPU with N ranks: stage 1 optimizer/N, stage 2 + gradients/N, stage 3 + parameters/N.
  DeepSpeed keeps an fp32 gradient partition as well (estimate_zero2_model_states_mem_needs:
  2*P + 18*P/N, DeepSpeed PR #5099), which is what we count for stages 1-3.
* PyTorch AMP (stage 0, no DeepSpeed): fp32 weights + fp32 grads + 2 fp32 Adam moments = 16 B.
* QLoRA (Dettmers et al. 2023, arXiv 2305.14314) and bitsandbytes' Params4bit/QuantState:
  NF4 packs 2 weights per byte with one fp32 absmax per 64-weight block; double quantisation
  stores the absmax as uint8 with one fp32 scale per 256 absmax values (+ a 256-entry fp32
  code table per tensor). LLM.int8 (Dettmers et al. 2022): int8 weights + one fp32 scale per
  output row (SCB). Embeddings, norms and lm_head stay in the compute dtype.
* GPTQ / AWQ pre-quantised 4-bit checkpoints (group 128): core/memory/quant_formats.py.
* 8-bit optimizers (Dettmers et al. 2021, arXiv 2110.02861): uint8 states, block-wise with one
  fp32 absmax per 256 values. Adafactor (Shazeer & Stern 2018): row + column second moments
  for matrices, full for vectors, no first moment by default. Lion (Chen et al. 2023): one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainfit.core.memory.fsdp import fsdp_shards, gathered_bytes, root_params
from trainfit.core.memory.paged_states import paged_state_bytes
from trainfit.core.memory.quant_formats import (experts_left_dense, group_index_bytes, metadata_bytes_per_param,
                                                packed_bytes_per_param, quantised_linear_params)
from trainfit.core.memory.stats import ModelStats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import runtime_of
from trainfit.core.setup import PREQUANTISED, TrainingSetup

NF4_BLOCK = 64
DQ_BLOCK = 256
OPT8_BLOCK = 256


@dataclass(frozen=True)
class States:
    weights: float  # base model weights on each GPU (frozen or trained)
    quant_overhead: float  # absmax / scales of quantised weights
    lora: float  # adapter weights
    gradients: float
    optimizer: float
    master_weights: float  # fp32 copy kept by DeepSpeed / fp16 optimizers
    gathered: float  # ZeRO-3 parameters gathered for the current + prefetched block
    buckets: float  # DDP gradient buckets / ZeRO reduce buckets
    cpu: float  # bytes on the host with CPU offload (whole node, all ranks)
    cpu_what: str
    trainable: int
    dequant_transient: float
    # Optimizer states in managed memory (bitsandbytes' paged optimizers, paged_states.py): outside
    # the caching allocator and `optimizer`, evicted to CPU RAM when the card runs short.
    paged_optimizer: float = 0.0


def optimizer_bytes_per_param(setup: TrainingSetup, param_bytes: int) -> float:
    o = setup.optimizer
    if o == "adamw":
        return 2 * param_bytes
    if o in ("adamw-8bit", "paged-adamw-8bit"):
        return 2 * (1 + 4 / OPT8_BLOCK)
    if o == "paged-adamw-32bit":
        # bitsandbytes' 32-bit optimizers keep both moments in fp32 whatever the parameter dtype
        # (Optimizer2State.init_state, optim_bits=32).
        return 8.0
    if o == "sgd":
        return 0.0
    if o in ("sgd-momentum", "lion"):
        return float(param_bytes)
    return 0.0  # adafactor handled with shapes in adafactor_bytes


def adafactor_bytes(spec: ModelSpec, st: ModelStats, trainable: int, rank: int | None) -> float:
    """Factored second moments: rows + cols per matrix (fp32), full size for vectors."""
    if rank:
        # LoRA A (r x in) and B (out x r): rows + cols = in + out + 2r per module, and the
        # module has r * (in + out) parameters, so about trainable / r.
        return 4 * trainable / rank
    h, n = spec.hidden_size, spec.num_layers
    ffn = spec.intermediate_size
    per_layer = 4 * (h + spec.num_heads * spec.head_dim) + 3 * (h + ffn) * (1 + spec.num_experts)
    emb = spec.vocab_size + h
    return 4 * (n * per_layer + emb * (1 if spec.tie_embeddings else 2) + st.norms)


def base_weight_bytes(setup: TrainingSetup) -> int:
    """Bytes per base-model weight that is not quantised, in training: fp32 masters under mixed
    precision; under a quantised base, fp32 where PEFT's k-bit preparation casts the rest
    (core/runtime.py), else 16-bit."""
    p = setup.precision
    if setup.quant == "none":
        return 4 if p in ("fp32", "bf16-mixed", "fp16-mixed") else 2
    return 4 if p == "fp32" or runtime_of(setup).kbit_upcast else 2


def weight_bytes(st: ModelStats, setup: TrainingSetup, spec: ModelSpec | None = None) -> tuple[float, float, float]:
    """(weights, quantisation overhead, largest de-quantised weight) of the base model."""
    p = setup.precision
    dense = base_weight_bytes(setup)
    if setup.method == "inference" and p.endswith("-mixed"):
        dense = 2  # inference loads the checkpoint in the 16-bit dtype
    if setup.quant == "none":
        return st.total * dense, 0.0, 0.0
    # Lightning's plugin quantises the lm_head too
    head = runtime_of(setup).quantised_lm_head_params(spec) if spec else 0
    # MoE experts: quantised per expert (transformers 4's nn.Linear each), or left 16-bit with the
    # rest when transformers >= 5 fuses them (quant_formats.experts_left_dense).
    dense_experts = experts_left_dense(st, setup)
    linear = quantised_linear_params(st, setup) + head
    largest = max(st.largest_module, 0 if dense_experts else st.expert_weight, head)
    rest = (st.total - linear) * dense
    if setup.quant == "int8":
        rows = st.linear_out_rows - (st.expert_out_rows if dense_experts else 0) + (spec.vocab_size if head else 0)
        return linear * 1 + rest, rows * 4, largest * 2
    if setup.quant in PREQUANTISED:  # GPTQ / AWQ 4-bit, group 128 (core/memory/quant_formats.py)
        meta = st.linear * metadata_bytes_per_param() + (group_index_bytes(spec, setup.quant) if spec else 0.0)
        return st.linear * packed_bytes_per_param() + rest, meta, st.largest_linear * 2
    blocks = linear / NF4_BLOCK
    if setup.quant == "nf4":
        overhead = blocks * 4
    else:
        overhead = blocks * 1 + (blocks / DQ_BLOCK) * 4
    # An fp16 QuantState under bf16 compute: the de-quantised weight and its cast (core/runtime.py)
    return linear * 0.5 + rest, overhead, largest * 2 * runtime_of(setup).dequant_copies


def trained_param_bytes(setup: TrainingSetup) -> int:
    """Bytes per trained parameter (and per AdamW moment). PEFT keeps adapters in fp32
    (autocast_adapter_dtype=True) whatever the base dtype; LitGPT's bf16-true / fp16-true builds them
    in the 16-bit dtype like the rest; full training keeps the precision's parameter dtype."""
    sixteen = setup.precision in ("bf16", "fp16")
    if setup.trains_adapters:
        return 2 if setup.model_code == "litgpt" and sixteen else 4
    return 2 if sixteen else 4


def model_states(spec: ModelSpec, st: ModelStats, setup: TrainingSetup, lora_params: int) -> States:
    states = _states(spec, st, setup, lora_params)
    if not states.optimizer:
        return states
    # Sharding and offload scale every state alike, so the paged share of the whole model's states
    # is the paged share of what each GPU keeps.
    whole = states.trainable * optimizer_bytes_per_param(setup, trained_param_bytes(setup))
    share = min(1.0, paged_state_bytes(spec, setup, states.trainable) / whole) if whole else 0.0
    return replace(states, optimizer=states.optimizer * (1 - share), paged_optimizer=states.optimizer * share)


def _states(spec: ModelSpec, st: ModelStats, setup: TrainingSetup, lora_params: int) -> States:
    n = setup.shard_group  # ranks a ZeRO shard is split over: one node's GPUs under hybrid sharding
    host_ranks = setup.gpus_per_node  # ranks whose offloaded states share one host's RAM
    z = setup.zero_stage
    w, qover, deq = weight_bytes(st, setup, spec)
    if setup.method == "inference":
        return States(w, qover, 0, 0, 0, 0, 0, 0, 0, "", 0, deq)
    lora_mode = setup.trains_adapters
    pbytes = trained_param_bytes(setup)
    if lora_mode:
        trainable = lora_params
        lora_w = trainable * float(pbytes)
    else:
        trainable = st.total
        lora_w = 0.0
    deepspeed = setup.uses_deepspeed  # FSDP keeps fp32 flat parameters (fsdp.py)
    if deepspeed and not lora_mode and setup.precision.endswith("-mixed"):
        # DeepSpeed bf16/fp16: 16-bit weights and grads, fp32 master + fp32 grad partition.
        w = st.total * 2.0
        grads16 = st.total * 2.0
        master = st.total * 4.0
        grads32 = st.total * 4.0
    else:
        grads16 = 0.0
        master = 0.0
        grads32 = trainable * float(pbytes)
    if setup.optimizer == "adafactor":
        opt = adafactor_bytes(spec, st, trainable, setup.lora.rank if lora_mode and setup.lora else None) * (pbytes / 4)
    else:
        opt = trainable * optimizer_bytes_per_param(setup, pbytes)
    if setup.fsdp_strategy != "none":
        return _fsdp_states(st, setup, w, qover, deq, lora_w, trainable, pbytes, opt, lora_mode)
    if setup.optimizer_in_backward:
        grads32 = _in_backward_gradient(st, trainable, pbytes)
    # Sharding (per GPU).
    gathered = buckets = 0.0
    if setup.num_gpus > 1 and z == 0:
        buckets = grads32  # DDP keeps its own flat buckets unless gradient_as_bucket_view=True
    if z >= 1:
        opt /= n
        master /= n
    if z >= 2:
        grads32 /= n
        grads16 /= n
        buckets = spec.hidden_size ** 2 * 2.0  # HF "auto" reduce_bucket_size = hidden^2
    elif z == 1:
        grads32 /= n
    if z == 3:
        w_sharded = (w if not lora_mode else w) / n
        block_bytes = st.per_layer * (2 if lora_mode or setup.precision != "fp32" else 4)
        gathered = 2 * block_bytes  # current block + prefetched next one (+ their grads briefly)
        w = w_sharded
        if lora_mode:
            lora_w /= n
    cpu = 0.0
    cpu_what = ""
    if setup.offload in ("optimizer", "optimizer+params"):
        # The whole node's ranks share the host: optimizer + master + fp32 grads of all shards.
        cpu = (opt + master + grads32) * host_ranks
        cpu_what = "optimizer states, fp32 master weights and fp32 gradients (all ranks on this host)"
        opt = master = 0.0
        grads32 = 0.0 if deepspeed and grads16 else grads32
        if deepspeed and z >= 2:
            # ZeRO-Offload stage 2/3: each reduced gradient partition is copied into the fp32 CPU
            # partition; the GPU keeps only the reduce bucket (DeepSpeed's own estimators:
            # estimate_zero2_model_states_mem_needs with cpu_offload = 2 B/param on the GPU, stage 3
            # = largest layer + 2 B/param / N, or the largest layer alone with offload_param).
            grads16 = 0.0
        if setup.offload == "optimizer+params":
            cpu += w * host_ranks
            cpu_what += " + 16-bit parameters"
            w = 0.0
    grads = grads16 + grads32
    return States(w, qover, lora_w, grads, opt, master, gathered, buckets,  # scales unsharded (see _fsdp_states)
                  cpu, cpu_what, trainable, deq)


def _in_backward_gradient(st: ModelStats, trainable: int, pbytes: int) -> float:
    """Optimizer in backward: each parameter is stepped and its gradient freed as soon as it is
    made, so at most the largest parameter's gradient is alive (torchtune optimizer_in_bwd)."""
    return float(min(trainable, st.largest_param) * pbytes)


def _fsdp_states(st: ModelStats, setup: TrainingSetup, w: float, qover: float, deq: float, lora_w: float,
                 trainable: int, pbytes: int, opt: float, lora_mode: bool) -> States:
    """PyTorch FSDP (trainfit.core.memory.fsdp): sharded flat parameters in their own dtype are the
    master weights; gradients sharded in that dtype; no DDP buckets; the floor is the gathered units."""
    n = fsdp_shards(setup)
    grads = trainable * float(pbytes) / n
    mixed_units = lora_mode and runtime_of(setup).fsdp_mixed_units
    if mixed_units:
        # Adapters inside their frozen layer's unit (core/runtime.py): the flat gradient covers
        # every decoder weight, in the flat parameter's dtype; the root unit (embeddings, lm_head)
        # holds no adapter and keeps none.
        grads = (st.total - root_params(st)) * (w / st.total if st.total else 0.0) / n
    gathered = gathered_bytes(st, setup)
    # A quantised weight's scales (bitsandbytes' QuantState absmax, LLM.int8's SCB, GPTQ/AWQ scale
    # buffers) are neither parameters nor sharded buffers: every rank keeps all of them (fsdp_qlora
    # train.py: "FSDP only syncs parameters and buffers, so the quant_state isn't copied").
    w, lora_w, opt = w / n, lora_w / n, opt / n
    cpu, cpu_what = 0.0, ""
    if setup.offload == "optimizer+params":
        # CPUOffload moves the flat parameters only: the quantisation scales stay on every GPU (fsdp_qlora
        # train.py quantises each Params4bit on its GPU, then moves only its data to the CPU or meta).
        cpu = (w + lora_w + grads + opt) * setup.gpus_per_node
        cpu_what = ("FSDP CPU offload: sharded parameters, their gradients and optimizer states "
                    "(all ranks on this host)")
        w = lora_w = grads = opt = 0.0
    return States(w, qover, lora_w, grads, opt, 0.0, gathered, 0.0, cpu, cpu_what, trainable, deq)
