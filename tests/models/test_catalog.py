"""Catalog: loads, validates, has the families people fine-tune, resolves names."""

import pytest

from trainfit.core.models.catalog import all_models, families, get_model, parse_catalog, resolve_model
from trainfit.core.models.params import count_params
from trainfit.errors import BadInputError

# Totals published by the model authors (exact where they publish exact figures).
# Pythia: Biderman et al. 2023, arXiv:2304.01373, table 1 / HF model cards ("70,426,624" ...).
# GPT-2 124,439,808: HF openai-community/gpt2 safetensors metadata. Others: HF model pages'
# "Model size" computed from safetensors (rounded to 3 significant digits there).
PUBLISHED_EXACT = {
    "EleutherAI/pythia-70m": 70_426_624,
    "EleutherAI/pythia-160m": 162_322_944,
    "EleutherAI/pythia-410m": 405_334_016,
    "EleutherAI/pythia-1b": 1_011_781_632,
    "EleutherAI/pythia-1.4b": 1_414_647_808,
    "EleutherAI/pythia-2.8b": 2_775_208_960,
    "EleutherAI/pythia-6.9b": 6_857_302_016,
    "EleutherAI/pythia-12b": 11_846_072_320,
    "openai-community/gpt2": 124_439_808,
}
PUBLISHED_ROUNDED_B = {
    "meta-llama/Meta-Llama-3-8B": 8.03, "meta-llama/Llama-3.1-70B": 70.6, "meta-llama/Llama-3.2-1B": 1.24,
    "meta-llama/Llama-3.2-3B": 3.21, "Qwen/Qwen2.5-0.5B": 0.494, "Qwen/Qwen2.5-7B": 7.62, "Qwen/Qwen2.5-72B": 72.7,
    "Qwen/Qwen3-0.6B": 0.596, "Qwen/Qwen3-8B": 8.19, "mistralai/Mistral-7B-v0.1": 7.24,
    "mistralai/Mixtral-8x7B-v0.1": 46.7, "microsoft/phi-2": 2.78, "microsoft/Phi-3-mini-4k-instruct": 3.82,
    "google/gemma-2-2b": 2.61, "google/gemma-2-9b": 9.24, "google/gemma-2-27b": 27.2,
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": 1.10, "HuggingFaceTB/SmolLM2-135M": 0.135,
    "Qwen/Qwen2-VL-2B-Instruct": 2.21, "Qwen/Qwen2-VL-7B-Instruct": 8.29,
}


def test_catalog_size_and_families():
    models = all_models()
    distinct_shapes = {(m.family, m.num_layers, m.hidden_size, m.vocab_size) for m in models}
    assert len(models) >= 40 and len(distinct_shapes) >= 40
    for fam in ("qwen2", "qwen2.5", "qwen2-vl", "qwen3", "llama3", "llama3.1", "llama3.2", "mistral", "mixtral",
                "phi", "gemma2", "tinyllama", "smollm2", "gpt2", "pythia"):
        assert fam in families()
    for m in models:
        assert m.source.startswith("https://huggingface.co/") and m.source.endswith("config.json")
        assert m.id.split("/")[0] in m.source


def test_exact_shapes_that_are_easy_to_get_wrong():
    assert get_model("qwen2.5-1.5b").vocab_size == 151936 and get_model("qwen2.5-1.5b").tie_embeddings
    assert get_model("qwen2.5-7b").vocab_size == 152064 and not get_model("qwen2.5-7b").tie_embeddings
    g = get_model("gemma-2-9b")
    assert g.head_dim == 256 and g.tie_embeddings and g.sliding_window == 4096
    assert get_model("pythia-6.9b").vocab_size == 50432 and not get_model("pythia-70m").tie_embeddings
    assert get_model("mistral-7b-v0.3").vocab_size == 32768 and get_model("mistral-7b-v0.1").sliding_window == 4096


@pytest.mark.parametrize("model_id,expected", sorted(PUBLISHED_EXACT.items()))
def test_published_exact_counts(model_id, expected):
    assert count_params(get_model(model_id)).total == expected


@pytest.mark.parametrize("model_id,billions", sorted(PUBLISHED_ROUNDED_B.items()))
def test_published_rounded_counts(model_id, billions):
    total = count_params(get_model(model_id)).total / 1e9
    assert total == pytest.approx(billions, rel=0.005)


def test_mixtral_active_params():
    # Mistral AI: "12.9B active parameters per token" (https://mistral.ai/news/mixtral-of-experts).
    assert count_params(get_model("mixtral-8x7b")).active_per_token / 1e9 == pytest.approx(12.9, rel=0.01)


def test_lookup_is_case_insensitive_with_aliases_and_short_names():
    assert get_model("QWEN/qwen2.5-7b-INSTRUCT").id == "Qwen/Qwen2.5-7B-Instruct"
    assert get_model("Qwen2.5-7B-Instruct").id == "Qwen/Qwen2.5-7B-Instruct"
    assert get_model("Llama-3.2-1B").id == "meta-llama/Llama-3.2-1B"
    assert get_model("gpt2").id == "openai-community/gpt2"


def test_unknown_model_suggests_close_names():
    with pytest.raises(BadInputError) as err:
        get_model("qwen2.5-7bb")
    assert "qwen2.5-7b" in str(err.value)


def test_resolve_accepts_every_kind_of_reference(tmp_path):
    assert resolve_model("tinyllama").id == "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    assert resolve_model("shape:125m").source == "shape"
    assert resolve_model("350m").source == "shape"
    with pytest.raises(BadInputError, match="does not exist"):
        resolve_model(str(tmp_path / "nope" / "config.json"))


BASE = """
architecture_defaults:
  llama: {activation: silu, gated_mlp: true, position: rope, norm: rmsnorm, qkv_bias: false, o_bias: false,
          mlp_bias: false, lm_head_bias: false}
models:
"""
GOOD = ("  - {id: a/b, family: f, architecture: llama, vocab_size: 10, hidden_size: 8, num_layers: 1, num_heads: 2,"
        " num_kv_heads: 2, intermediate_size: 16, tie_embeddings: true, max_position_embeddings: 8,"
        " source: https://huggingface.co/a/b/blob/main/config.json}\n")


def test_parse_catalog_accepts_a_minimal_entry():
    (spec,) = parse_catalog(BASE + GOOD)
    assert spec.head_dim == 4


@pytest.mark.parametrize("bad,needle", [
    (GOOD.replace("hidden_size: 8", "hidden_size: eight"), "hidden_size"),
    (GOOD.replace("architecture: llama", "architecture: rwkv"), "architecture"),
    (GOOD.replace("num_kv_heads: 2", "num_kv_heads: 3"), "num_kv_heads"),
    (GOOD.replace(" family: f,", ""), "family"),
    (GOOD.replace("num_layers: 1", "num_layers: 1, colour: red"), "colour"),
    (GOOD + GOOD, "used by both"),
])
def test_parse_catalog_names_entry_and_key(bad, needle):
    with pytest.raises(BadInputError) as err:
        parse_catalog(BASE + bad)
    assert needle in str(err.value) and "a/b" in str(err.value)
