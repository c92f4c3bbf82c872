"""TrainingSetup: the knobs of one training (or inference) configuration.

Shared by the memory model, the speed/cost model, the planner and the run config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

# The one method vocabulary. "full" trains every weight of a given model (SFT); "pretrain" starts
# from random weights; "dpo" trains on preference pairs (full, or LoRA when `lora` is set).
Method = Literal["pretrain", "full", "lora", "qlora", "dpo", "inference"]
METHODS: tuple[str, ...] = get_args(Method)
TRAIN_METHODS: tuple[str, ...] = tuple(m for m in METHODS if m != "inference")
# Supervised fine-tuning on instruction rows: every weight, LoRA adapters, or adapters on a 4-bit base.
SFT_METHODS: tuple[str, ...] = ("full", "lora", "qlora")
# Names people use for the same thing: supervised fine-tuning of every weight is "full".
METHOD_ALIASES = {"sft": "full"}
# The one default method of estimate, plan and cloud: full fine-tuning. plan and cloud fall back to
# LoRA, then QLoRA, where it does not fit (plan's "auto" names that same rule); estimate estimates
# the setting asked and names the nearest one that fits.
DEFAULT_METHOD = "full"
PrecisionMode = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp16"]
Optimizer = Literal["adamw", "adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit", "sgd", "sgd-momentum",
                    "adafactor", "lion"]
Checkpointing = Literal["none", "full", "selective"]
Attention = Literal["eager", "sdpa", "flash"]
Offload = Literal["none", "optimizer", "optimizer+params"]
# PyTorch FSDP's sharding strategies ("none": not FSDP; DeepSpeed ZeRO or DDP by zero_stage). Multi-node
# HYBRID_SHARD is full-shard with hybrid_shard on (trainfit.core.memory.fsdp).
FsdpStrategy = Literal["none", "full-shard", "shard-grad-op", "no-shard"]
# FSDP strategy -> the ZeRO stage that shards the same states (zero_stage holds it alongside).
FSDP_EQUIVALENT_STAGE = {"full-shard": 3, "shard-grad-op": 2, "no-shard": 0}
# nf4 / nf4-dq / int8: bitsandbytes, quantised while loading; gptq / awq: pre-quantised 4-bit checkpoints
# (group size 128), loaded as they were published (trainfit.core.memory.quant_formats).
Quant = Literal["none", "nf4", "nf4-dq", "int8", "gptq", "awq"]
PREQUANTISED = ("gptq", "awq")  # checkpoints stored quantised (4-bit, group 128: core/memory/quant_formats.py)
# How the causal-LM loss meets the logits (trainfit.core.memory.loss_kernels): "standard" materialises
# batch x seq x vocab logits; "chunked" (torchtune) upcasts them to fp32 one piece at a time; "fused"
# (Liger) holds one chunk of them at a time; "chunked-16bit" keeps every chunk's 16-bit logits but
# never upcasts them to fp32 (LitGPT).
LossKernel = Literal["standard", "chunked", "fused", "chunked-16bit"]
# How torch's AdamW steps (trainfit.core.runtime): "auto" is what trainfit runs.
OptimizerImpl = Literal["auto", "fused", "foreach", "for-loop"]
ModelCode = Literal["transformers", "litgpt"]
Device = Literal["cuda", "rocm", "mps", "cpu", "xpu"]


def parse_method(value: object, *, key: str = "--method", allowed: tuple[str, ...] = METHODS) -> Method:
    """A method name from the one vocabulary (aliases accepted); BadInputError naming `key` otherwise."""
    from trainfit.errors import BadInputError, short_repr

    name = METHOD_ALIASES.get(value, value) if isinstance(value, str) else value
    if name not in allowed:
        aliases = [a for a, m in METHOD_ALIASES.items() if m in allowed]
        valid = ", ".join(list(allowed) + [f"{a} (= {METHOD_ALIASES[a]})" for a in aliases])
        raise BadInputError(f"{key}: {short_repr(value)} is not a method (valid: {valid})")
    return name  # type: ignore[return-value]


def method_trains_adapters(method: str, *, lora_given: bool) -> bool:
    """LoRA adapters train on a frozen base: lora, qlora, or DPO given LoRA settings. The one test
    of it (TrainingSetup.trains_adapters, the run config, the knobs and the exporters ask here)."""
    return method in ("lora", "qlora") or (method == "dpo" and lora_given)


def default_precision(*, frozen_base: bool, half: Literal["bf16", "fp16"] | None, on_cpu: bool) -> PrecisionMode:
    """What practitioners run. `half` is the 16-bit type the device computes fast (None: none).

    Every weight trains: AMP with fp32 master weights. A frozen base (LoRA, QLoRA, inference) on
    a GPU: loaded in 16-bit, PEFT keeping the adapters in fp32. CPUs autocast to bf16 when they
    have it and keep fp32 weights.
    """
    if half is None:
        return "fp32"
    if frozen_base and not on_cpu:
        return half
    return "bf16-mixed" if half == "bf16" else "fp16-mixed"


@dataclass(frozen=True)
class MethodVariant:
    """A method plus how its weights are held, as the planner's fallback chains name it
    (core.plan.variants): "dpo+lora" is DPO with LoRA adapters, "dpo+qlora" the same on a 4-bit
    NF4 base, "inference+int8" / "inference+nf4" serve 8- / 4-bit weights; a bare method ("qlora")
    holds its weights as that method does."""

    method: Method
    adapters: bool  # LoRA adapters train on a frozen base
    quant: Quant  # how the base weights are held


def parse_variant(variant: str) -> MethodVariant:
    """The one reading of a variant name ("dpo+qlora" -> dpo, adapters, nf4-dq)."""
    method, _, held = variant.partition("+")
    if method == "inference":  # served weights: "inference+int8", "inference+nf4"
        quant = {"int8": "int8", "nf4": "nf4-dq"}.get(held, "none")
    else:  # QLoRA: NF4 with double quantisation (Dettmers et al. 2023), SFT or DPO
        quant = "nf4-dq" if "qlora" in (method, held) else "none"
    adapters = method_trains_adapters(method, lora_given=bool(held))
    return MethodVariant(method, adapters=adapters, quant=quant)  # type: ignore[arg-type]


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.05
    # Module names as in the model ("q_proj", ...) or "all-linear".
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def __hash__(self) -> int:  # setups are dict keys in the planner; the list is never mutated
        targets = self.target_modules
        return hash((self.rank, self.alpha, self.dropout, targets if isinstance(targets, str) else tuple(targets)))


@dataclass(frozen=True)
class TrainingSetup:
    method: Method = "full"
    precision: PrecisionMode = "bf16-mixed"
    optimizer: Optimizer = "adamw"
    micro_batch: int = 1
    seq_len: int = 512
    grad_accum: int = 1
    grad_checkpointing: Checkpointing = "none"
    attention: Attention = "sdpa"
    lora: LoraSettings | None = None  # required for lora / qlora
    quant: Quant = "none"  # weight quantisation (qlora: nf4 / nf4-dq / int8; inference too)
    num_gpus: int = 1  # data-parallel ranks on every node together (the world size)
    # Machines the num_gpus are spread over, equally (num_gpus / num_nodes GPUs each). Changes the
    # communication time (the network between nodes) and, with hybrid_shard, the memory.
    num_nodes: int = 1
    zero_stage: int = 0  # DeepSpeed ZeRO 0..3 (FSDP: NO_SHARD=0, SHARD_GRAD_OP=2, FULL_SHARD=3)
    # Hybrid sharding (FSDP HYBRID_SHARD, "HSDP"): with zero_stage 3, shard over the GPUs of one
    # node and replicate across nodes. Memory as sharding over one node's GPUs; across nodes only the
    # gradient all-reduce of each shard travels. No effect on one node or below stage 3.
    hybrid_shard: bool = False
    offload: Offload = "none"
    device: Device = "cuda"
    # DPO: the reference model is frozen; with LoRA it is the base with adapters disabled.
    dpo_reference: Literal["separate", "lora-base", "precomputed"] = "separate"
    # Inference: tokens generated after the prompt (seq_len is the prompt length).
    generate_tokens: int = 0
    # Sharding / offload knobs (modelled in trainfit.core.memory.fsdp, knob_effects and
    # states; refused combinations in trainfit.core.knob_rules).
    # FSDP instead of DeepSpeed: zero_stage then holds the ZeRO-equivalent stage (full-shard 3,
    # shard-grad-op 2, no-shard 0) and offload "optimizer+params" is FSDP's CPUOffload.
    fsdp_strategy: FsdpStrategy = "none"
    # Saved activations moved to pinned CPU memory by autograd saved-tensor hooks (TRL / torchtune
    # activation offloading): about one layer's activations in flight on the GPU.
    activation_offload: bool = False
    # Each parameter stepped and its gradient freed during backward (torchtune optimizer_in_bwd).
    optimizer_in_backward: bool = False
    # Logits, DoRA and image knobs (modelled in trainfit.core.memory.loss_kernels,
    # dora and vision). The loss kernel changes memory and speed, not the loss.
    loss: LossKernel = "standard"
    # DoRA (PEFT use_dora=True): LoRA plus a trained magnitude per output feature of each adapted layer.
    dora: bool = False
    # Vision-language models: images per example and their side in pixels (0: the model's default
    # resolution); their tokens join the language model's sequence after seq_len text tokens.
    image_size: int = 0
    images_per_example: int = 0
    # How the framework that runs the setup behaves where frameworks differ; the defaults are what
    # trainfit's own runs do (read by trainfit.core.runtime).
    # AdamW's step: "auto" = torch's fused kernel on a GPU (what trainfit exports), the
    # per-parameter loop on a CPU; "foreach" (torch's choice on CUDA when neither is asked for)
    # holds one moment-sized temporary over all parameters at the step.
    optimizer_impl: OptimizerImpl = "auto"
    # bitsandbytes before 0.43.2 keeps each 4-bit linear's input for its backward.
    bnb_keeps_input: bool = False
    # FSDP with LoRA adapters inside their frozen layer's wrapped unit (use_orig_params=True):
    # gradients are kept for the whole unit, as if every weight in it trained.
    fsdp_mixed_units: bool = False
    # PEFT's prepare_model_for_kbit_training (what TRL's SFTTrainer calls for a bitsandbytes base)
    # casts every non-quantised weight to fp32, so the residual stream runs in fp32. trainfit's
    # runner, LitGPT, torchtune and fsdp_qlora keep them 16-bit; sharded QLoRA never casts.
    kbit_upcast: bool = False
    # A 16-bit model run under autocast (Transformers' torch_dtype=bfloat16 with --bf16, the usual
    # QLoRA recipe): nn.LayerNorm autocasts to fp32 and bitsandbytes' 4-bit linears return their
    # input's dtype, so a LayerNorm model's residual stream turns fp32; log_softmax runs in fp32.
    # trainfit's "bf16" is the same model without autocast; "bf16-mixed" loads fp32 weights.
    autocast_16bit_weights: bool = False
    # FSDP gradient accumulation under no_sync (the HF Trainer / Accelerate default, Lightning
    # Fabric's no_backward_sync, fsdp_qlora --no_sync): every unit keeps its unsharded gradient
    # until the last micro-batch. trainfit's runs reduce-scatter after every micro-batch
    # (Accelerate's sync_each_batch, written by export/training_args.py).
    fsdp_no_sync: bool = False
    # The output layer quantised too (Lightning Fabric's BitsandbytesPrecision replaces every
    # nn.Linear; Transformers' BitsAndBytesConfig keeps the lm_head 16-bit, as trainfit's runs do).
    quantize_lm_head: bool = False
    # 4-bit weights quantised from an fp16 copy (Lightning Fabric's BitsandbytesPrecision): with a
    # bf16 compute dtype each de-quantised weight is fp16 and cast again, two copies at once.
    bnb_fp16_quant_state: bool = False
    # transformers before 4.49: the causal-LM loss shifts the fp32 logits with
    # `logits[..., :-1, :].contiguous()`, a second fp32 copy beside the upcast during the loss forward
    # (4.49 pads the labels instead).
    logits_shift_copy: bool = False
    # transformers before 4.46: the model's forward upcasts the logits it returns to fp32 (the 16-bit
    # ones are freed at once); from 4.46 it returns them in the compute dtype.
    logits_returned_fp32: bool = False
    # transformers >= 5 stores each MoE layer's routed experts (and the router) as fused 3-D
    # parameters, which bitsandbytes' Linear4bit / Linear8bitLt replacement does not reach: under
    # --quant nf4 / int8 they stay 16-bit (bitsandbytes#1849). transformers 4 builds one nn.Linear
    # per expert, which bitsandbytes quantises.
    experts_fused: bool = True
    # transformers before 4.52 with its default reentrant checkpoint: each decoder layer's call is
    # checkpointed, which under FSDP is the FSDP unit's call. FSDP's reshard-only hook of a frozen
    # unit then holds the recomputed layer input and its gradient until backward ends (4.52's
    # GradientCheckpointingLayer checkpoints inside the unit).
    reentrant_checkpoint_around_fsdp_units: bool = False
    # FSDP1 (FullyShardedDataParallel: Accelerate's fsdp_version 1, Lightning's FSDPStrategy,
    # fsdp_qlora) flattens each unit's parameters into one FlatParameter, whose gradient autograd
    # assembles by concatenating its parts once the last one arrives: the root unit's lm_head
    # gradient waits through the whole backward, and the embedding's backward ends with every part
    # and their concatenation alive. FSDP2 (fully_shard, trainfit's runs on transformers >= 5) keeps
    # one gradient per parameter.
    fsdp_flat_params: bool = False
    # transformers before 4.53 leaves use_cache at the config's value under gradient checkpointing in
    # model code without its own override (gpt_bigcode): every layer's key/value, a view of its fused
    # c_attn output, is returned with the output and keeps that output alive until the loss.
    cache_under_checkpointing: bool = False
    # transformers before 5.25 runs Falcon's own attention, which hands SDPA a multi-query layer's one
    # key/value head unrepeated: only SDPA's math path broadcasts it, saving the scores as eager does.
    # 5.25 runs Falcon through the shared SDPA integration, which repeats the keys and values first.
    mqa_kv_unrepeated: bool = False
    # The training loop keeps the model's output (its logits) through backward and the optimizer
    # step: `outputs = model(**batch); outputs.loss.backward()` in a hand-written loop, fsdp_qlora's
    # train.py. The HF Trainer and trainfit's runner drop it before backward.
    output_kept: bool = False
    # The loop's names hold the previous micro-step's until the next forward returns (`logits =
    # model(x)`, `loss = ...`, no `del`: LitGPT's finetune scripts): its logits stay alive, and so
    # does every input bitsandbytes before 0.43.2 keeps on its autograd ctx, which backward does
    # not free. The HF Trainer and trainfit's runner drop both.
    previous_step_kept: bool = False
    # Whose modeling code runs the model: transformers with PEFT's LoRA layers (trainfit's runs),
    # or LitGPT's own GPT and LoRA classes: GELU-tanh as one op, q/k/v adapters through one
    # LoRAQKVLinear (one dropout, one stacked A), adapters in the training dtype (bf16-true).
    model_code: ModelCode = "transformers"
    # torch.compile over the model (torchtune's compile=True, TrainingArguments.torch_compile):
    # Inductor fuses each chain of elementwise ops (norm, rotary, activation x gate) into one kernel
    # that reads its inputs and writes its outputs once; the matmuls are unchanged. trainfit's runs
    # are eager. The memory model counts the eager tensors (Inductor may recompute some instead of
    # saving them: an upper bound), except the loss (standard, or torchtune's chunked), whose compiled
    # graph keeps the 16-bit logits instead of an fp32 log_softmax (core/memory/loss_kernels.py).
    torch_compile: bool = False

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.num_gpus

    @property
    def trains_adapters(self) -> bool:
        """LoRA adapters train on a frozen base: lora, qlora, or DPO with a LoRA config."""
        return method_trains_adapters(self.method, lora_given=self.lora is not None)

    @property
    def uses_deepspeed(self) -> bool:
        """A ZeRO stage without FSDP: DeepSpeed runs the setup (its own optimizer, 16-bit modules)."""
        return self.zero_stage >= 1 and self.fsdp_strategy == "none"

    @property
    def gpus_per_node(self) -> int:
        return max(1, self.num_gpus // max(1, self.num_nodes))

    @property
    def shard_group(self) -> int:
        """Ranks one ZeRO / FSDP shard is split over: one node's GPUs under hybrid sharding."""
        if self.hybrid_shard and self.num_nodes > 1 and self.zero_stage >= 3:
            return self.gpus_per_node
        return max(1, self.num_gpus)
