"""FLOPs of one training (or inference) step, counted from the model's shapes.

Accounting (Kaplan et al. 2020, arXiv 2001.08361 §2.1; Korthikanti et al. 2022, arXiv 2205.05198
§4 / appendix; Chinchilla, Hoffmann et al. 2022, arXiv 2203.15556 appendix F):

* a matmul with an (in x out) weight costs 2*in*out FLOPs per token in the forward pass;
* the backward pass costs twice the forward: one matmul for the activation gradient and one for
  the weight gradient. Training a dense model therefore costs ~6*N FLOPs per token;
* attention scores (Q K^T) and the weighted sum (A V) cost 2*2*s*(heads*head_dim) per token and
  layer in the forward, i.e. 12*L*s*h per token for forward+backward. A causal kernel that skips
  masked blocks (flash / SDPA) does half of that; an eager softmax computes the full square;
* frozen weights (LoRA / QLoRA) need the activation gradient but no weight gradient: 4*N instead
  of 6*N, plus 6x the adapter parameters;
* full gradient checkpointing re-runs the forward once (+2*N); selective checkpointing re-runs
  only the attention core (Korthikanti §5);
* DPO (Rafailov et al. 2023, arXiv 2305.18290) trains the policy on chosen and rejected
  sequences and runs the frozen reference forward on both (unless the reference log-probs were
  precomputed).

Norms, activations, residual adds and softmax are not FLOPs here: they are memory-bound, and
`elementwise_elements_per_token_layer` counts the elements they touch (costed by bytes in
`predict.py` and `cpu.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup

@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one micro-batch on one device, split by where they are spent."""

    forward_flops: float  # one forward pass of the trained model (all sequences of the micro-batch)
    backward_flops: float  # activation + weight gradients
    recompute_flops: float  # gradient checkpointing re-forward
    reference_flops: float  # DPO reference forward
    tokens: int  # tokens processed per micro-batch (DPO: chosen + rejected)

    @property
    def total_flops(self) -> float:
        return self.forward_flops + self.backward_flops + self.recompute_flops + self.reference_flops


def layer_linear_dims(spec: ModelSpec) -> dict[str, tuple[int, int, int]]:
    """(in, out, count per token) of each linear of one block; MoE experts counted as active ones."""
    q_dim = spec.num_heads * spec.head_dim
    kv_dim = spec.num_kv_heads * spec.head_dim
    dims = {
        "q_proj": (spec.hidden_size, q_dim, 1),
        "k_proj": (spec.hidden_size, kv_dim, 1),
        "v_proj": (spec.hidden_size, kv_dim, 1),
        "o_proj": (q_dim, spec.hidden_size, 1),
    }
    if spec.num_experts > 0:
        ffn = spec.moe_intermediate_size or spec.intermediate_size
        active = spec.experts_per_token + spec.shared_experts
        dims["router"] = (spec.hidden_size, spec.num_experts, 1)
    else:
        ffn, active = spec.intermediate_size, 1
    if spec.gated_mlp:
        dims["gate_proj"] = (spec.hidden_size, ffn, active)
    dims["up_proj"] = (spec.hidden_size, ffn, active)
    dims["down_proj"] = (ffn, spec.hidden_size, active)
    return dims


# Elements touched per token per layer by the memory-bound ops of one forward: RMSNorm/LayerNorm
# with an fp32 upcast (~2 x 12h), residual adds (2 x 3h), rotary on q and k, activation x gate.
ELEMENTWISE_PER_HIDDEN = 30.0
ELEMENTWISE_PER_FFN = 6.0
ELEMENTWISE_PER_QKV = 6.0
EAGER_ELEMENTS = (ELEMENTWISE_PER_HIDDEN, ELEMENTWISE_PER_FFN, ELEMENTWISE_PER_QKV)
# The same ops fused by torch.compile (Inductor), each chain one kernel that reads its inputs and
# writes its outputs once: an RMSNorm reads x and writes y (2h, against ~12h eager), a residual add
# reads two and writes one (3h, unchanged), rotary reads and writes q and k (2 per element, against
# ~6 for eager's slices, negation, concatenation, products and sum), SiLU(gate) x up reads two and
# writes one (3 per element, against ~6 for eager's two kernels).
COMPILED_PER_HIDDEN = 10.0
COMPILED_PER_FFN = 3.0
COMPILED_PER_QKV = 2.0
COMPILED_ELEMENTS = (COMPILED_PER_HIDDEN, COMPILED_PER_FFN, COMPILED_PER_QKV)


def active_ffn_width(spec: ModelSpec) -> int:
    """MLP width a token passes through (MoE: the active experts together)."""
    ffn = spec.moe_intermediate_size or spec.intermediate_size
    return ffn * ((spec.experts_per_token + spec.shared_experts) if spec.num_experts else 1)


def elementwise_elements_per_token_layer(spec: ModelSpec, compiled: bool = False) -> float:
    """Elements the norms, residuals, rotary and activations of one layer touch per token (forward),
    eager or fused by torch.compile."""
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_hidden, per_ffn, per_qkv = COMPILED_ELEMENTS if compiled else EAGER_ELEMENTS
    return per_hidden * spec.hidden_size + per_ffn * active_ffn_width(spec) + per_qkv * qkv


def cross_attention_params(spec: ModelSpec) -> int:
    """T5 / mT5 decoder blocks' EncDecAttention q, k, v, o weights (0 for other families).

    Counted as if every token passed through them: the encoder-decoder estimate treats source
    and target as sequences of seq_len tokens each (trainfit.core.memory.activations)."""
    inner = spec.num_heads * spec.head_dim
    return spec.decoder_layers * 4 * spec.hidden_size * inner


def matmul_params_per_token(spec: ModelSpec) -> float:
    """Weights each token multiplies through: all blocks' linears (active experts) + the LM head."""
    per_layer = sum(i * o * c for i, o, c in layer_linear_dims(spec).values())
    return float(per_layer * spec.num_layers + cross_attention_params(spec) + spec.hidden_size * spec.vocab_size)


def matmul_params_stored(spec: ModelSpec) -> float:
    """Linear weights held in memory (every expert of an MoE), i.e. what a full pass reads."""
    dims = layer_linear_dims(spec)
    per_layer = 0
    for name, (i, o, c) in dims.items():
        if spec.num_experts > 0 and name in ("gate_proj", "up_proj", "down_proj"):
            c = spec.num_experts + spec.shared_experts
        per_layer += i * o * c
    head = 0 if spec.tie_embeddings else spec.hidden_size * spec.vocab_size
    return float(per_layer * spec.num_layers + cross_attention_params(spec) + head
                 + spec.hidden_size * spec.vocab_size)


def lora_params_per_token(spec: ModelSpec, targets: list[str] | str, rank: int) -> float:
    """Adapter weights a token passes through: r*(in+out) per targeted linear (A and B).

    Uses the shared module layout (trainfit.core.models.params), so LoRA FLOPs and LoRA memory agree.
    `targets` is LoraSettings.target_modules as is: a list of names or the string "all-linear".
    """
    from trainfit.core.models.params import canonical_targets, lora_params

    return float(lora_params(spec, canonical_targets(targets), rank))


def attention_core_flops_per_token(spec: ModelSpec, context: int, causal_skip: bool) -> float:
    """Forward FLOPs of Q K^T and A V for one token attending to `context` positions, all layers.

    A sliding window caps the context. With a causal kernel that skips masked blocks the average
    token attends to half the sequence.
    """
    if spec.sliding_window:
        context = min(context, spec.sliding_window)
    effective = context / 2 if causal_skip else context
    # T5's decoder blocks attend twice: to themselves and (cross-attention) to the encoder output.
    layers = spec.num_layers + spec.decoder_layers
    return 4.0 * layers * effective * spec.num_heads * spec.head_dim


def causal_skip(setup: TrainingSetup) -> bool:
    """Flash and SDPA kernels skip fully masked blocks; eager attention computes the full square."""
    return setup.attention in ("flash", "sdpa")


def step_flops(spec: ModelSpec, setup: TrainingSetup) -> StepFlops:
    """FLOPs of one micro-batch (setup.micro_batch sequences of setup.seq_len) on one device."""
    seqs = setup.micro_batch * (2 if setup.method == "dpo" else 1)
    tokens = seqs * setup.seq_len
    n_mm = matmul_params_per_token(spec)
    attn = attention_core_flops_per_token(spec, setup.seq_len, causal_skip(setup))
    adapters = 0.0
    if setup.trains_adapters:
        lora = setup.lora
        if lora is not None:
            adapters = lora_params_per_token(spec, lora.target_modules, lora.rank)
    frozen = setup.trains_adapters

    fwd_per_token = 2.0 * (n_mm + adapters) + attn
    if setup.method == "inference":
        return StepFlops(fwd_per_token * tokens, 0.0, 0.0, 0.0, tokens)
    if frozen:
        # Activation gradients through every weight, weight gradients only for the adapters.
        bwd_per_token = 2.0 * n_mm + 4.0 * adapters + 2.0 * attn
    else:
        bwd_per_token = 4.0 * (n_mm + adapters) + 2.0 * attn
    if setup.grad_checkpointing == "full":
        recompute_per_token = fwd_per_token
    elif setup.grad_checkpointing == "selective":
        recompute_per_token = attn
    else:
        recompute_per_token = 0.0
    reference = 0.0
    if setup.method == "dpo" and setup.dpo_reference != "precomputed":
        reference = 2.0 * n_mm + attn  # frozen reference: plain forward, no adapters
    return StepFlops(
        forward_flops=fwd_per_token * tokens,
        backward_flops=bwd_per_token * tokens,
        recompute_flops=recompute_per_token * tokens,
        reference_flops=reference * tokens,
        tokens=tokens,
    )


def decode_flops_per_token(spec: ModelSpec, context: int) -> float:
    """Forward FLOPs to generate one token with a KV cache of `context` positions."""
    return 2.0 * matmul_params_per_token(spec) + attention_core_flops_per_token(spec, context, False)


def model_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """'Model FLOPs' of training one token (MFU convention: 3x forward, no recompute, full attention)."""
    return 3.0 * (2.0 * matmul_params_per_token(spec) + attention_core_flops_per_token(spec, seq_len, False))
