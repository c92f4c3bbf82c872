"""Inference memory: weights, KV cache, and the largest transient of prefill or decoding.

KV cache (HF DynamicCache): 2 (K and V) x layers x batch x tokens x kv_heads x head_dim x bytes,
tokens = prompt + generated; sliding-window layers keep at most `window` tokens (Mistral: all
layers; Gemma-2: every other layer). The cache grows by torch.cat, so one layer's K (or V) is
briefly held twice. Prefill runs one layer at a time over the whole prompt: q/k/v, the attention
output (eager: the b x heads x s x s scores in fp32 and their 16-bit copy) and the MLP's inner
tensors; generate() computes logits for the last position only (logits_to_keep=1) and upcasts
them to fp32. Sources: transformers cache_utils.py / generation/utils.py; llm-analysis
(cli99) inference memory (weights + KV + max(one layer, logits)).
"""

from __future__ import annotations

from trainfit.core.memory_types import MemoryComponent
from trainfit.core.models.spec import ModelSpec

C = MemoryComponent


def kv_cache_bytes(model: ModelSpec, batch: int, tokens: int, kv_bytes: int) -> tuple[float, float]:
    """(whole cache, one layer's cache) in bytes."""
    per_tok_layer = 2 * model.num_kv_heads * model.head_dim * kv_bytes
    window = model.sliding_window
    if window is None or window >= tokens:
        layers_full, layers_swa = model.num_layers, 0
    elif model.capabilities.alternating_sliding_window:
        layers_swa = model.num_layers // 2
        layers_full = model.num_layers - layers_swa
    else:
        layers_full, layers_swa = 0, model.num_layers
    swa_tokens = min(tokens, window or tokens)
    total = batch * per_tok_layer * (layers_full * tokens + layers_swa * swa_tokens)
    one = batch * per_tok_layer * (tokens if layers_full else swa_tokens)
    return total, one


def inference_components(model: ModelSpec, st, setup, states) -> tuple[list[MemoryComponent], list[str]]:
    """(components at the peak, notes) of generation: weights, the key/value cache and the larger of the
    prefill's and a decode step's temporaries."""
    element_bytes = 4 if setup.precision == "fp32" else 2
    batch, prompt_tokens, generated_tokens = setup.micro_batch, setup.seq_len, setup.generate_tokens
    kv_all, kv_layer = kv_cache_bytes(model, batch, prompt_tokens + generated_tokens, element_bytes)
    kv_prompt, _ = kv_cache_bytes(model, batch, prompt_tokens, element_bytes)
    hidden, query_width = model.hidden_size, model.num_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    tokens = batch * prompt_tokens
    # One layer over the prompt: normed input, q/k/v (+ GQA repeat for eager), attention output,
    # the MLP's gate/act/up alive together (3 x ffn), residual.
    attn = element_bytes * tokens * (2 * hidden + 2 * query_width + 2 * kv_width)
    if setup.attention == "eager" or model.capabilities.attention_softcap:
        # scores, the masked/scaled copy and the fp32 softmax coexist (+ its 16-bit copy).
        attn += (tokens * model.num_heads * prompt_tokens * (8 + (element_bytes if element_bytes != 4 else 0))
                 + element_bytes * tokens * 2 * query_width)
    # Inner MLP tensors alive together; measured on CPU (bench/memory_accuracy.py): SwiGLU 4 x ffn,
    # the python gelu_new formula 5 x ffn, single-op activations 3 x ffn.
    inner = 4 if model.gated_mlp else (5 if model.activation == "gelu_new" else 3)
    mlp = element_bytes * tokens * inner * st.ffn_width + element_bytes * tokens * hidden
    logits = batch * model.vocab_size * (element_bytes + 4)
    prefill = max(attn, mlp) + logits
    decode = kv_layer / 2 + logits  # torch.cat: the old and the grown K (or V) of one layer
    weights = states.weights + states.quant_overhead
    p_prefill = weights + kv_prompt + prefill + states.dequant_transient
    p_decode = weights + kv_all + decode + states.dequant_transient
    at_prefill = p_prefill >= p_decode
    per_param = element_bytes if setup.quant == "none" else "quantised"
    comps = [C("weights", int(states.weights), f"params x {per_param} B", True)]
    if states.quant_overhead:
        comps.append(C("quant_overhead", int(states.quant_overhead), "quantisation scales (absmax / row scales)", True))
    kv = kv_prompt if at_prefill else kv_all
    kv_tokens = prompt_tokens if at_prefill else prompt_tokens + generated_tokens
    comps.append(C("kv_cache", int(kv), f"2 x {model.num_layers} layers x {batch} x {kv_tokens} tokens "
                   f"x {model.num_kv_heads} kv heads x {model.head_dim} x {element_bytes} B", True))
    comps.append(C("activations", int(prefill if at_prefill else decode),
                   "prefill: one layer's q/k/v/MLP temporaries + last-token logits" if at_prefill
                   else "decode: one layer's cache copy during torch.cat + logits", True))
    if states.dequant_transient:
        comps.append(C("dequant_transient", int(states.dequant_transient), "largest quantised weight de-quantised", True))
    return comps, [f"inference peak during {'prefill' if at_prefill else 'decoding'}"]
