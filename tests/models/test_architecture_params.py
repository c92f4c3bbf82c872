"""Falcon, GPTBigCode, BLOOM, Qwen v1, T5 / mT5, BERT / RoBERTa and Granite: parameter counts and linear
layers from the shipped config.json fixtures (tests/models/fixtures/, sources in its README)
equal the model transformers builds on the meta device; Qwen v1 (remote code, never run) equals
the total its published safetensors index states."""

import dataclasses

import pytest

from trainfit.core.models.catalog import get_model
from trainfit.core.models.loader import spec_from_config
from trainfit.core.models.params import count_params, linear_layers, lora_params, module_names
from trainfit.errors import BadInputError


from .family_fixtures import TRANSFORMERS_FAMILIES, build, config, shrunk  # noqa: E402

# Qwen/Qwen-7B model.safetensors.index.json "total_size": 15,442,649,088 bytes of bf16 weights
# (https://huggingface.co/Qwen/Qwen-7B/blob/main/model.safetensors.index.json) = 2 B x params.
QWEN_7B_PARAMS = 15_442_649_088 // 2


def _meta_count(cfg):
    return sum(p.numel() for p in build(cfg).parameters())


def _linear_modules(model):
    """{leaf module name: total weight + bias elements} of every nn.Linear (FalconLinear too)."""
    import torch

    out: dict[str, int] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            own = sum(p.numel() for p in mod.parameters(recurse=False))
            out[leaf] = out.get(leaf, 0) + own
    return out


@pytest.mark.parametrize("name", TRANSFORMERS_FAMILIES)
def test_real_config_count_equals_meta_build(name):
    pytest.importorskip("transformers")
    cfg = config(name)
    assert count_params(spec_from_config(cfg, origin=name)).total == _meta_count(cfg)


@pytest.mark.parametrize("name", TRANSFORMERS_FAMILIES)
def test_linear_layers_match_module_tree(name):
    pytest.importorskip("transformers")
    cfg = config(name)
    spec = spec_from_config(cfg, origin=name)
    mine: dict[str, int] = {}
    for layer in linear_layers(spec):
        mine[layer.name] = mine.get(layer.name, 0) + layer.params
    assert mine == _linear_modules(build(cfg))


def test_published_figures():
    # Well-known totals, as a cross-check independent of the installed transformers.
    counts = {name: count_params(spec_from_config(config(name))).total for name in TRANSFORMERS_FAMILIES}
    assert counts["falcon-7b"] == 6_921_720_704
    assert counts["bloom-560m"] == 559_214_592
    assert counts["bert-base-uncased"] == 109_514_298  # BertForMaskedLM: BertModel 109,482,240 - pooler + MLM head
    assert counts["t5-small"] == 60_506_624


def test_qwen_v1_equals_published_total():
    spec = spec_from_config(config("qwen-7b"), origin="qwen-7b")
    assert count_params(spec).total == QWEN_7B_PARAMS == 7_721_324_544
    names = [x.path for x in linear_layers(spec)]
    assert names == ["attn.c_attn", "attn.c_proj", "mlp.w1", "mlp.w2", "mlp.c_proj", "lm_head"]
    # LoRA on Qwen v1's usual targets (c_attn, c_proj, w1, w2), r=8, by hand:
    # 32 x 8 x ((4096+12288) + (4096+4096) + 2 x (4096+11008) + (11008+4096))
    expected = 32 * 8 * ((4096 + 12288) + (4096 + 4096) + 2 * (4096 + 11008) + (11008 + 4096))
    assert lora_params(spec, ["c_attn", "c_proj", "w1", "w2"], 8) == expected


@pytest.mark.parametrize("overrides", [
    # falcon-40b / 180b style: new decoder architecture, grouped kv heads, ln_attn + ln_mlp
    dict(new_decoder_architecture=True, num_kv_heads=2, num_attention_heads=8),
    # falcon-rw style: sequential block (two LayerNorms), ALiBi, biases, one kv head per head
    dict(multi_query=False, num_kv_heads=4, parallel_attn=False, alibi=True, bias=True),
    # new architecture with one LayerNorm (num_ln_in_parallel_attn=1, as Falcon2-11B)
    dict(new_decoder_architecture=True, num_kv_heads=2, num_attention_heads=8, num_ln_in_parallel_attn=1),
], ids=["new-arch", "rw", "new-arch-1ln"])
def test_falcon_variants_match(overrides):
    pytest.importorskip("transformers")
    cfg = shrunk("falcon-7b", **overrides)
    spec = spec_from_config(cfg)
    assert count_params(spec).total == _meta_count(cfg)
    assert spec.position == ("alibi" if overrides.get("alibi") else "rope")


@pytest.mark.parametrize("name, overrides", [
    ("gpt_bigcode-santacoder", dict(multi_query=False)),  # StarCoder-style configs with full multi-head
    ("t5-small", dict(num_decoder_layers=3, feed_forward_proj="gated-silu")),
    ("bert-base-uncased", dict(type_vocab_size=0, tie_word_embeddings=False)),
])
def test_other_layout_keys_match(name, overrides):
    pytest.importorskip("transformers")
    cfg = shrunk(name, **overrides)
    assert count_params(spec_from_config(cfg)).total == _meta_count(cfg)


def test_bloom_reads_the_older_key_names():
    # bigscience configs also spell hidden_size as n_embed and n_head as num_attention_heads.
    cfg = config("bloom-560m")
    old = {k: v for k, v in cfg.items() if k not in ("hidden_size", "n_head")} | {"n_embed": 1024,
                                                                                   "num_attention_heads": 16}
    assert spec_from_config(old) == spec_from_config(cfg)


@pytest.mark.parametrize("name", TRANSFORMERS_FAMILIES + ("qwen-7b",))
def test_catalog_entry_equals_its_config(name):
    catalog = get_model(name.replace("gpt_bigcode-", ""))
    loaded = spec_from_config(config(name), origin=name)
    keep = {"id", "aliases", "source", "family", "stored_dtype"}
    assert dataclasses.replace(catalog, **{k: getattr(loaded, k) for k in keep}) == loaded
    assert count_params(catalog).total == count_params(loaded).total


def test_module_names_and_all_linear_skip_the_output_layer():
    bert = get_model("bert-base-uncased")
    assert module_names(bert) == ["query", "key", "value", "dense", "decoder"]
    dense = [x for x in linear_layers(bert) if x.name == "dense"]
    # all-linear = every linear but the MLM decoder, the head's transform dense included (as PEFT)
    assert lora_params(bert, "all-linear", 4) == sum(
        x.count * 4 * (x.in_features + x.out_features) for x in linear_layers(bert) if x.kind == "linear")
    assert [x.path for x in dense][-1] == "cls.predictions.transform.dense"


@pytest.mark.parametrize("bad, key", [
    ({"feed_forward_proj": "gated-gelu-x"}, "feed_forward_proj"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"intermediate_size": 22017}, "intermediate_size"),
])
def test_bad_family_keys_are_named(bad, key):
    base = {"feed_forward_proj": "t5-small", "position_embedding_type": "bert-base-uncased",
            "intermediate_size": "qwen-7b"}[key]
    with pytest.raises(BadInputError, match=key):
        spec_from_config({**config(base), **bad})


def test_remote_code_of_unknown_type_is_still_refused():
    with pytest.raises(BadInputError, match="trust_remote_code"):
        spec_from_config({"model_type": "chatglm", "auto_map": {"AutoModel": "x"}})


def test_unsupported_transformers_architecture_is_counted_in_the_refusal():
    # A model_type transformers ships but trainfit has no layout for: the refusal still gives the
    # exact count (meta-device build) and says what is missing.
    pytest.importorskip("transformers")
    from trainfit.core.models.meta_count import meta_param_count

    opt = {"model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2, "ffn_dim": 128, "num_attention_heads": 4,
           "vocab_size": 512, "word_embed_proj_dim": 64, "max_position_embeddings": 128}
    params, cls = meta_param_count(opt)
    assert cls == "OPTForCausalLM" and params == _meta_count(opt)
    with pytest.raises(BadInputError, match=f"{params:,} parameters.*no activation"):
        spec_from_config(opt)
    assert meta_param_count({**opt, "auto_map": {"AutoModel": "x.Y"}}) is None  # never remote code
    assert meta_param_count({"model_type": "no-such-type"}) is None
