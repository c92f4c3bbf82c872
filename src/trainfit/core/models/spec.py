"""ModelSpec: every shape that memory and FLOPs of a transformer depend on.

Built from the model catalog (`data/models.yaml`), a local config.json / model directory, or a
pretraining shape. Parameter counts must equal what transformers reports for the same config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainfit.core.models.capabilities import ModelCapabilities, capabilities_of

Activation = Literal["silu", "gelu", "gelu_tanh", "relu", "gelu_new"]
NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rope", "learned", "alibi", "none"]
StoredDtype = Literal["float32", "float16", "bfloat16", "int8", "int4", "fp8"]


@dataclass(frozen=True)
class VisionTowerSpec:
    """A VLM's vision encoder (e.g. Qwen2-VL's ViT) and its projector/merger."""

    params: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    tokens_per_image: int  # visual tokens handed to the language model per image (default res)
    patches_per_image: int  # patches the vision tower itself processes per image


@dataclass(frozen=True)
class ModelSpec:
    id: str  # hub id as on the model hub: "Qwen/Qwen2.5-7B-Instruct"; or "local:<path>", "shape:125m"
    architecture: str  # transformers model_type: "llama", "qwen2", "mistral", "gpt2", "phi", ...
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    activation: Activation
    gated_mlp: bool  # SwiGLU/GeGLU: gate, up and down projections
    tie_embeddings: bool
    position: PositionKind
    max_position_embeddings: int
    norm: NormKind
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    lm_head_bias: bool
    # Mixture of experts: 0 experts means dense.
    num_experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate_size: int | None = None
    sliding_window: int | None = None
    vision: VisionTowerSpec | None = None
    stored_dtype: StoredDtype = "bfloat16"
    # Exact count when read from safetensors headers; else computed from the shapes.
    exact_params: int | None = None
    aliases: list[str] = field(default_factory=list)
    source: str = ""  # where the shapes come from (URL of config.json, local path, "shape")
    family: str = ""  # catalog family ("qwen2.5", "llama3.1", "pythia", ...); "" outside the catalog
    # Attention and MLP read the same block input (phi, falcon's parallel_attn): one residual add.
    parallel_attention: bool = False
    # LayerNorms per block where the family varies it (falcon: 1 parallel, 2 with
    # new_decoder_architecture or sequential blocks); 0 = the architecture's fixed count.
    block_norms: int = 0
    # Encoder-decoder (T5 / mT5): of the num_layers blocks, how many are decoder blocks (with
    # cross-attention); the rest are encoder blocks. 0 for decoder-only and encoder-only models.
    decoder_layers: int = 0
    # T5 relative position buckets (one buckets x heads table in the first encoder and decoder block).
    relative_attention_buckets: int = 0
    # BERT / RoBERTa segment (token type) embeddings; 0 where the model has none.
    type_vocab_size: int = 0
    # The model's own dropout probabilities as its config.json sets them (core/models/dropout_config.py):
    # on each block's attention / MLP output, on the attention probabilities, on the embeddings.
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0

    @property
    def capabilities(self) -> ModelCapabilities:
        """What the architecture does differently (core/models/capabilities.py). A property, not a
        field: never serialised, never given in a catalog entry or a saved spec."""
        return capabilities_of(self.architecture)
