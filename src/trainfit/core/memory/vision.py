"""Images in a vision-language model: their tokens in the language model's sequence, and the vision
tower's saved activations.

Qwen2-VL (Wang et al. 2024, arXiv 2409.12191, section 2.1; Qwen/Qwen2-VL-7B-Instruct
preprocessor_config.json: patch_size 14, merge_size 2, temporal_patch_size 2, min_pixels 3136,
max_pixels 12845056; read 2026-11-23): an image is resized so each side is a multiple of
14 x 2 = 28 pixels (transformers' smart_resize), cut into 14 x 14 patches that the ViT
processes, and each 2 x 2 group of patches is merged into one token for the language model:
tokens = (H/14)(W/14)/4, e.g. 448 x 448 -> 256 tokens from 1024 patches.

The vision tower trains only when the whole model does (full fine-tuning, pretraining, full DPO):
then each ViT block keeps, per patch, its two LayerNorm inputs, the qkv / proj / fc1 / fc2 inputs,
q, k, v and the SDPA output with its logsumexp, and QuickGELU's input and sigmoid output, and the
merger keeps its LayerNorm input and GELU MLP inputs per merged token. A frozen tower (LoRA
leaves it alone; trainfit never adapts it) saves nothing: its outputs enter the language model
as plain embeddings.
"""

from __future__ import annotations

import dataclasses

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup

PATCH = 14
MERGE = 2
FACTOR = PATCH * MERGE
MIN_PIXELS = 3136
MAX_PIXELS = 12845056


def tokens_per_image(spec: ModelSpec, image_size: int) -> int:
    """Language-model tokens one square image becomes (0: the catalog's default resolution)."""
    assert spec.vision is not None
    if image_size <= 0:
        return spec.vision.tokens_per_image
    side = max(FACTOR, round(image_size / FACTOR) * FACTOR)
    pixels = min(max(side * side, MIN_PIXELS), MAX_PIXELS)
    grid = max(1, round((pixels ** 0.5) / FACTOR))  # smart_resize keeps the side a multiple of 28
    return grid * grid


def image_tokens(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Image tokens per example (0 without images)."""
    if not setup.images_per_example or spec.vision is None:
        return 0
    return setup.images_per_example * tokens_per_image(spec, setup.image_size)


def with_image_tokens(spec: ModelSpec, setup: TrainingSetup) -> TrainingSetup:
    """The setup as the language model sees it: seq_len text tokens + the image tokens."""
    extra = image_tokens(spec, setup)
    return dataclasses.replace(setup, seq_len=setup.seq_len + extra) if extra else setup


def image_note(spec: ModelSpec, setup: TrainingSetup, text_tokens: int) -> str:
    """What the images add, for the estimate's notes (`setup` already carries the image tokens)."""
    per = tokens_per_image(spec, setup.image_size)
    tower = "trains: its activations counted" if tower_trains(setup) else "frozen: no saved activations"
    return (f"{setup.images_per_example} image(s) x {per} tokens join the {text_tokens} text tokens: the language "
            f"model sees {setup.seq_len} tokens per example; vision tower {tower}")


def tower_trains(setup: TrainingSetup) -> bool:
    return setup.method in ("full", "pretrain") or (setup.method == "dpo" and setup.lora is None)


def tower_saved_bytes(spec: ModelSpec, setup: TrainingSetup, sequences: int) -> float:
    """Saved activations of the vision tower for `sequences` examples of one micro-batch."""
    tower = spec.vision
    if tower is None or not setup.images_per_example or not tower_trains(setup):
        return 0.0
    from trainfit.core.memory.activations import dtype_bytes

    residual_bytes, compute_bytes, _ = dtype_bytes(spec, setup)
    tokens = tokens_per_image(spec, setup.image_size)
    patches = tokens * MERGE * MERGE
    images = sequences * setup.images_per_example
    hidden, ffn = tower.hidden_size, tower.intermediate_size
    per_patch_block = (2 * (residual_bytes * hidden + 8) + 7 * compute_bytes * hidden + 4 * tower.num_heads
                       + 3 * compute_bytes * ffn)
    if setup.attention == "eager":
        per_patch_block += tower.num_heads * patches * (4 if compute_bytes == 4 else 6)
    merger_per_token = 4 * residual_bytes * hidden + 3 * compute_bytes * 4 * hidden
    if setup.grad_checkpointing == "full":
        blocks = tower.num_layers * residual_bytes * hidden + per_patch_block  # block inputs + one block recomputed
    else:
        blocks = tower.num_layers * per_patch_block
    return images * (patches * blocks + tokens * merger_per_token)
