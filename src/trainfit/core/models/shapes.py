"""Shapes for pretraining from scratch: a Llama-style ModelSpec for a parameter budget or for
explicit dimensions.

Rule used by `shape_for_params` (documented because users will ask "why this shape?"):
* Block: Llama (RMSNorm, RoPE, SwiGLU, no biases). SwiGLU width = 8/3 x hidden rounded up to a
  multiple of 256, as in Llama (Touvron et al. 2023, arXiv:2302.13971, and its reference code).
* Width/depth aspect ratio (hidden / layers) grows with size: 64 up to 200M parameters (GPT-3
  125M: 768/12), then log-linearly to 128 at 7B and above (Llama-7B: 4096/32). Kaplan et al. 2020
  (arXiv:2001.08361, fig. 5) find loss nearly flat for aspect ratios 20-200, so this is a
  conventional, not a critical, choice.
* Below 1B parameters: head dim 64, width a multiple of 64, no grouped-query attention.
  From 1B: head dim 128 (64 under width 2048), width a multiple of 512, GQA with 8 KV heads
  (Llama 3 style), 4 when the head count is not a multiple of 8.
* Embeddings tied below 1B (SmolLM2 / Llama-3.2-1B practice), untied above (Llama).
Depth and width are then searched near the aspect rule for the exact parameter count closest to
the target (a small penalty for leaving the aspect ratio breaks near-ties).
"""

from __future__ import annotations

import math
import re

from trainfit.core.models.loader import check_plausible
from trainfit.core.models.spec import ModelSpec
from trainfit.core.models.params import count_params
from trainfit.errors import BadInputError, short_repr
from trainfit.validate import check

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_MULT = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
_GQA_FROM_PARAMS = 1_000_000_000
_TIE_BELOW_PARAMS = 1_000_000_000
# Sizes a shape is built for: 10T is several times the largest published dense model.
MIN_SHAPE_PARAMS = 1_000_000
MAX_SHAPE_PARAMS = 10 * 10**12


def looks_like_size(text: str) -> bool:
    """True for "125m", "1.3b", "7B", "500k" (a parameter count with a unit)."""
    m = _SIZE.match(text)
    return bool(m and m.group(2))


def parse_param_count(text: str) -> int:
    """ "125m" -> 125_000_000, "1.3b" -> 1_300_000_000; plain integers accepted."""
    m = _SIZE.match(str(text))
    value = float(m.group(1)) * _MULT[m.group(2).lower()] if m else math.nan
    if not math.isfinite(value):
        raise BadInputError(f"parameter count {short_repr(text)} is not understood",
                            hint="write it like 125m, 1.3b, 7B or 350000000")
    return int(round(value))


def _ffn(hidden: int) -> int:
    return 256 * math.ceil(8 * hidden / 3 / 256)


def _aspect(n_params: int) -> float:
    lo, hi = 2e8, 7e9
    if n_params <= lo:
        return 64.0
    if n_params >= hi:
        return 128.0
    return 64.0 * 2 ** (math.log(n_params / lo) / math.log(hi / lo))


def shape_from_dims(layers: int, hidden: int, heads: int, vocab: int = 32000, *, kv_heads: int | None = None,
                    intermediate: int | None = None, max_positions: int = 2048, tie_embeddings: bool = False,
                    head_dim: int | None = None, check_count: bool = True) -> ModelSpec:
    """A Llama-style ModelSpec with the given dimensions (SwiGLU width 8/3 x hidden by default).
    `check_count=False` skips the parameter-count plausibility check (for shapes built from a bounded
    budget, where it cannot fail)."""
    # (key as the user wrote it, its validate.BOUNDS entry, value)
    for key, bound, value in (("layers", "layers", layers), ("hidden", "hidden", hidden), ("heads", "heads", heads),
                              ("vocab", "vocab", vocab), ("max_positions", "max_position_embeddings", max_positions),
                              ("kv_heads", "kv_heads", kv_heads), ("intermediate", "intermediate", intermediate),
                              ("head_dim", "hidden", head_dim)):
        if value is not None:
            check(bound, value, f"shape: '{key}'")
    kv = heads if kv_heads is None else kv_heads
    if kv <= 0 or heads % kv:
        raise BadInputError(f"shape: 'kv_heads' ({kv}) must divide 'heads' ({heads})")
    if head_dim is None and hidden % heads:
        raise BadInputError(f"shape: 'hidden' ({hidden}) must be a multiple of 'heads' ({heads})")
    ffn = intermediate or _ffn(hidden)
    spec = ModelSpec(
        id=f"shape:layers={layers},hidden={hidden},heads={heads},kv_heads={kv},vocab={vocab}",
        architecture="llama", vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim or hidden // heads, intermediate_size=ffn, activation="silu",
        gated_mlp=True, tie_embeddings=tie_embeddings, position="rope", max_position_embeddings=max_positions,
        norm="rmsnorm", qkv_bias=False, o_bias=False, mlp_bias=False, lm_head_bias=False,
        stored_dtype="bfloat16", source="shape",
    )
    if check_count:
        check_plausible(spec, "shape")
    return spec


def shape_for_params(n_params: int | str, vocab_size: int = 32000, *, max_positions: int = 2048,
                     tie_embeddings: bool | None = None) -> ModelSpec:
    """A sensible Llama-style shape whose exact parameter count is close to `n_params`."""
    target = parse_param_count(n_params) if isinstance(n_params, str) else n_params
    if isinstance(target, bool) or not isinstance(target, int) or not MIN_SHAPE_PARAMS <= target <= MAX_SHAPE_PARAMS:
        raise BadInputError(f"shape: parameter count must be from 1m to 10t, got {short_repr(n_params)}")
    tie = target < _TIE_BELOW_PARAMS if tie_embeddings is None else tie_embeddings
    aspect = _aspect(target)
    emb = vocab_size * (1 if tie else 2)
    # 12 h^2 per layer (4 h^2 attention + 8 h^2 SwiGLU) with h = aspect * L; solve for L.
    layers = 1
    while 12 * (aspect * (layers + 1)) ** 2 * (layers + 1) + emb * aspect * (layers + 1) <= target:
        layers += 1
    best: tuple[float, ModelSpec] | None = None
    for n_layers in range(max(1, layers - 2), layers + 4):
        for spec in _widths(n_layers, vocab_size, max_positions, tie, target):
            # Closest count first; a small penalty keeps the shape near the aspect rule.
            err = abs(math.log(count_params(spec).total / target))
            err += 0.02 * abs(math.log(spec.hidden_size / spec.num_layers / aspect))
            if best is None or err < best[0]:
                best = (err, spec)
    assert best is not None
    label = n_params if isinstance(n_params, str) else f"{target}"
    return _relabel(best[1], f"shape:{label}")


def _widths(layers: int, vocab: int, max_positions: int, tie: bool, target: int):
    # Below 1B: head_dim 64, width in steps of 64, plain multi-head attention.
    # From 1B: head_dim 128 (64 under width 2048), width in steps of 512 so the head count is a
    # multiple of 4 and GQA keeps a whole number of query heads per KV head.
    big = target >= _GQA_FROM_PARAMS
    step = 512 if big else 64
    for hidden in range(step, 65536 + step, step):
        head_dim = 128 if big and hidden >= 2048 else 64
        heads = hidden // head_dim
        kv = (8 if heads % 8 == 0 else 4) if big and heads >= 16 else heads
        spec = shape_from_dims(layers, hidden, heads, vocab, kv_heads=kv,
                               max_positions=max_positions, tie_embeddings=tie, check_count=False)
        yield spec
        if count_params(spec).total > target * 1.5:
            return


def _relabel(spec: ModelSpec, new_id: str) -> ModelSpec:
    import dataclasses

    return dataclasses.replace(spec, id=new_id)


def parse_shape(text: str) -> ModelSpec:
    """ "125m" / "1.3b" -> shape_for_params; "layers=12,hidden=768,heads=12[,kv_heads=4,vocab=50257,
    intermediate=3072,max_positions=2048,tie=true]" -> shape_from_dims."""
    text = text.strip()
    if "=" not in text:
        return shape_for_params(text) if text else _bad_shape(text)
    keys = {"layers", "hidden", "heads", "kv_heads", "vocab", "intermediate", "max_positions", "tie", "head_dim"}
    values: dict[str, int | bool] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, raw = part.partition("=")
        key = key.strip().lower()
        if key not in keys:
            raise BadInputError(f"shape: unknown key {short_repr(key)}", hint=f"valid keys: {', '.join(sorted(keys))}")
        if key in values:  # 'layers=2,layers=4' is a typo, not a choice: the last one would win silently
            raise BadInputError(f"shape: '{key}' is given twice; give it once")
        if not raw.isascii():  # int() reads '٣' and '３' as digits; the command-line flags refuse them
            raise BadInputError(f"shape: '{key}' must be written in ASCII digits, got {short_repr(raw.strip())}")
        if key == "tie":
            values[key] = raw.strip().lower() in ("1", "true", "yes")
            continue
        try:
            values[key] = int(parse_param_count(raw)) if key == "vocab" else int(raw)
        except ValueError:
            raise BadInputError(f"shape: '{key}' must be an integer, got {short_repr(raw.strip())}") from None
    missing = [k for k in ("layers", "hidden", "heads") if k not in values]
    if missing:
        _bad_shape(text, f"missing {', '.join(missing)}")
    return shape_from_dims(
        int(values["layers"]), int(values["hidden"]), int(values["heads"]), int(values.get("vocab", 32000)),
        kv_heads=values.get("kv_heads"), intermediate=values.get("intermediate"),  # type: ignore[arg-type]
        max_positions=int(values.get("max_positions", 2048)), tie_embeddings=bool(values.get("tie", False)),
        head_dim=values.get("head_dim"),  # type: ignore[arg-type]
    )


def _bad_shape(text: str, why: str = "empty") -> ModelSpec:
    raise BadInputError(f"shape {short_repr(text)}: {why}",
                        hint="use a size like shape:125m or dims like shape:layers=12,hidden=768,heads=12")
