"""count_params / linear_layers equal what transformers builds, for every catalog entry.

Models are built on the meta device (no memory, no weights), one per distinct shape.
"""

import pytest

pytest.importorskip("transformers")

from trainfit.core.models.catalog import all_models  # noqa: E402
from trainfit.core.models.shapes import shape_for_params  # noqa: E402
from trainfit.core.models.params import count_params, linear_layers  # noqa: E402
from trainfit.train.hf_config import build_model, shrink  # noqa: E402


def _distinct(models):
    seen, out = set(), []
    for m in models:
        key = (m.architecture, m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads,
               m.head_dim, m.intermediate_size, m.tie_embeddings, m.num_experts)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out


# Entries trainfit's trainer builds from a ModelSpec (hf_config); the other families are built
# from their shipped config.json in test_architecture_params.py.
CATALOG = _distinct([m for m in all_models() if m.capabilities.buildable])


def _linear_shapes(model):
    """{module path with layer indices removed: (in, out, count)} for nn.Linear / Conv1D modules."""
    import re

    out: dict[str, list[int]] = {}
    for name, mod in model.named_modules():
        kind = type(mod).__name__
        if kind not in ("Linear", "Conv1D"):
            continue
        w = mod.weight
        n_in, n_out = (w.shape[0], w.shape[1]) if kind == "Conv1D" else (w.shape[1], w.shape[0])
        key = re.sub(r"\.\d+\.", ".", name.split("layers.")[-1].split("blocks.")[-1].split(".h.")[-1])
        entry = out.setdefault(key.rsplit("mlp.", 1)[-1] if "merger" in key else key, [n_in, n_out, 0])
        entry[2] += 1
    return out


@pytest.mark.parametrize("spec", CATALOG, ids=[m.id for m in CATALOG])
def test_catalog_entry_matches_transformers(spec):
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == count_params(spec).total


@pytest.mark.parametrize("spec", CATALOG, ids=[m.id for m in CATALOG])
def test_linear_layers_match_module_tree(spec):
    tiny = shrink(spec)  # same module tree at tiny size: fast
    model = build_model(tiny)
    actual = {}
    for name, mod in model.named_modules():
        if type(mod).__name__ in ("Linear", "Conv1D"):
            leaf = name.rsplit(".", 1)[-1]
            actual.setdefault(leaf, 0)
            actual[leaf] += 1
    expected = {}
    for layer in linear_layers(tiny):
        if layer.kind in ("linear", "lm_head"):
            leaf = layer.path.rsplit(".", 1)[-1]
            expected[leaf] = expected.get(leaf, 0) + layer.count
    assert actual == expected
    # Linear parameters (weights + biases) agree in total, so in/out features are right too.
    linear_numel = sum(p.numel() for n, mod in model.named_modules() if type(mod).__name__ in ("Linear", "Conv1D")
                       for p in mod.parameters(recurse=False))
    lm_tied = tiny.tie_embeddings
    mine = sum(x.params for x in linear_layers(tiny) if x.kind == "linear" or (x.kind == "lm_head" and not lm_tied))
    if lm_tied:  # a tied lm_head shares the embedding tensor; count it through the module anyway
        mine += tiny.vocab_size * tiny.hidden_size
    assert linear_numel == mine


@pytest.mark.parametrize("spec", CATALOG[::4], ids=[m.id for m in CATALOG[::4]])
def test_shrunk_models_keep_features_and_match(spec):
    tiny = shrink(spec)
    assert tiny.tie_embeddings == spec.tie_embeddings and tiny.gated_mlp == spec.gated_mlp
    assert (tiny.num_kv_heads < tiny.num_heads) == (spec.num_kv_heads < spec.num_heads)
    assert bool(tiny.num_experts) == bool(spec.num_experts)
    assert (tiny.sliding_window is None) == (spec.sliding_window is None)
    assert sum(p.numel() for p in build_model(tiny).parameters()) == count_params(tiny).total


@pytest.mark.parametrize("size", ["20m", "125m", "1.3b", "7b"])
def test_shapes_match_transformers(size):
    spec = shape_for_params(size)
    assert sum(p.numel() for p in build_model(spec).parameters()) == count_params(spec).total
