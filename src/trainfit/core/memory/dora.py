"""DoRA (Liu et al. 2024, arXiv 2402.09353) as PEFT runs it (LoraConfig(use_dora=True)).

What PEFT 0.21 does per adapted linear (peft/tuners/lora/dora.py DoraLinearLayer.forward and
variants.py DoraLinearVariant.forward, read in the installed package):

* parameters: one trained magnitude per output feature (`lora_magnitude_vector`, fp32 like the
  adapters): out_features per adapted module, with its gradient and optimizer states;
* forward, transient: B @ A built from an identity (x_eye: in x in, then lora_weight in x out),
  the base weight cast / de-quantised to the input's dtype, W + s*BA (out x in) and its row
  norms, which are detached (DoRA section 4.3) - nothing weight-sized is kept for backward;
* saved for backward: (m/||W+sBA|| - 1) * base_result keeps the base layer's output, and
  m/||.|| * lora_result keeps the LoRA branch output (out features per token each); with
  dropout PEFT recomputes base_result = F.linear(dropout(x), W) in the adapter dtype, which keeps
  the weight it multiplied (a cast or de-quantised copy) until backward.

Checked against the live-tensor counter on CPU (tests/memory/test_dora_loss_vision.py).
"""

from __future__ import annotations

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup


def adapted_linears(spec: ModelSpec, setup: TrainingSetup):
    """The decoder linears LoRA adapts (the vision tower and fused MoE experts are not DoRA'd)."""
    from trainfit.core.models.params import lora_targets

    if setup.lora is None:
        return []
    return [x for x in lora_targets(spec, setup.lora.target_modules)
            if not x.vision and x.kind == "linear"]


def magnitude_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Trained magnitudes: one per output feature of every adapted module."""
    if not setup.dora:
        return 0
    return sum(x.count * x.out_features for x in adapted_linears(spec, setup))


def _bytes(setup: TrainingSetup) -> tuple[int, int, int]:
    """(base output bytes, LoRA output bytes, saved weight-copy bytes) per element.

    Autocast makes every linear output 16-bit; otherwise PEFT casts the input to the fp32 adapter
    dtype, so the LoRA branch (and, with dropout, the recomputed base output) is fp32.
    """
    p = setup.precision
    mixed = p.endswith("-mixed")
    dropout = setup.lora is not None and setup.lora.dropout > 0
    if mixed:
        base, lora_out, copy = 2, 2, 2  # autocast's 16-bit cast of the weight is what F.linear keeps
    elif p == "fp32":
        base, lora_out, copy = 4, 4, 0
    else:
        base, lora_out, copy = (4 if dropout else 2), 4, 4  # 16-bit weight cast to the fp32 input
    if p == "fp32" and setup.quant != "none":
        copy = 4
    return base, lora_out, copy if dropout else 0


def saved_bytes_per_token(spec: ModelSpec, setup: TrainingSetup) -> float:
    """Per decoder layer and token: base output + LoRA output of every adapted module."""
    if not setup.dora:
        return 0.0
    base, lora_out, _ = _bytes(setup)
    outs = sum(x.count * x.out_features for x in adapted_linears(spec, setup)) / spec.num_layers
    return outs * (base + lora_out)


def saved_weight_bytes_per_layer(spec: ModelSpec, setup: TrainingSetup) -> float:
    """Per decoder layer: with dropout, the cast / de-quantised weights F.linear keeps."""
    if not setup.dora:
        return 0.0
    _, _, copy = _bytes(setup)
    weights = sum(x.count * x.in_features * x.out_features for x in adapted_linears(spec, setup))
    return copy * weights / spec.num_layers


def forward_transient_bytes(spec: ModelSpec, setup: TrainingSetup) -> float:
    """The largest adapted module's forward temporaries: x_eye (fp32 in x in), B@A (fp32), the
    weight in the input's dtype and W + s*BA (both fp32 at most: PEFT's input is the adapter dtype)."""
    if not setup.dora:
        return 0.0
    layers = adapted_linears(spec, setup)
    if not layers:
        return 0.0
    return max(4 * x.in_features ** 2 + 3 * 4 * x.in_features * x.out_features for x in layers)
