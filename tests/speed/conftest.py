"""Model shapes used by the speed tests (as in the papers' / repos' configs)."""

from trainfit.core.models.spec import ModelSpec


def mpt(d: int, layers: int, heads: int) -> ModelSpec:
    """MPT (MosaicML LLM Foundry yamls): GELU MLP of 4d, ALiBi, tied embeddings, vocab 50368."""
    return ModelSpec(
        id=f"mpt-d{d}", architecture="mpt", vocab_size=50368, hidden_size=d, num_layers=layers, num_heads=heads,
        num_kv_heads=heads, head_dim=d // heads, intermediate_size=4 * d, activation="gelu", gated_mlp=False,
        tie_embeddings=True, position="alibi", max_position_embeddings=65536, norm="layernorm", qkv_bias=False,
        o_bias=False, mlp_bias=False, lm_head_bias=False,
    )  # fmt: skip


def llama(d: int, layers: int, heads: int, kv: int, ffn: int, vocab: int) -> ModelSpec:
    return ModelSpec(
        id=f"llama-d{d}", architecture="llama", vocab_size=vocab, hidden_size=d, num_layers=layers, num_heads=heads,
        num_kv_heads=kv, head_dim=d // heads, intermediate_size=ffn, activation="silu", gated_mlp=True,
        tie_embeddings=False, position="rope", max_position_embeddings=8192, norm="rmsnorm", qkv_bias=False,
        o_bias=False, mlp_bias=False, lm_head_bias=False,
    )  # fmt: skip


LLAMA2_7B = llama(4096, 32, 32, 32, 11008, 32000)  # meta-llama/Llama-2-7b-hf config.json
LLAMA2_13B = llama(5120, 40, 40, 40, 13824, 32000)  # meta-llama/Llama-2-13b-hf config.json
LLAMA2_70B = llama(8192, 80, 64, 8, 28672, 32000)  # meta-llama/Llama-2-70b-hf config.json
LLAMA3_8B = llama(4096, 32, 32, 8, 14336, 128256)  # meta-llama/Meta-Llama-3-8B config.json
