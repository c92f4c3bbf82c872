"""Local config.json / model directory loading, safetensors headers, bad input."""

import json

import pytest

from trainfit.core.models.catalog import get_model, resolve_model
from trainfit.core.models.loader import load_local, read_safetensors_params
from trainfit.core.models.params import count_params
from trainfit.errors import BadInputError

transformers = pytest.importorskip("transformers")

ROUND_TRIP = ["qwen2.5-7b", "qwen3-0.6b", "gemma-2-2b", "mixtral-8x7b", "phi-2", "phi-3-mini", "gpt2",
              "pythia-70m", "qwen2-vl-7b", "qwen1.5-moe-a2.7b", "llama3.2-1b", "mistral-7b-v0.1"]


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_config_written_by_transformers_loads_back_to_the_same_shapes(tmp_path, name):
    from trainfit.train.hf_config import build_hf_config

    spec = get_model(name)
    build_hf_config(spec).save_pretrained(tmp_path)
    loaded = load_local(tmp_path)
    assert loaded.architecture == spec.architecture
    assert count_params(loaded) == count_params(spec)
    assert (loaded.sliding_window, loaded.tie_embeddings, loaded.vision) == (
        spec.sliding_window, spec.tie_embeddings, spec.vision)
    assert resolve_model(str(tmp_path / "config.json")).hidden_size == spec.hidden_size


def _save_tiny(tmp_path, name, **kwargs):
    import torch

    from trainfit.train.hf_config import build_model, shrink

    spec = shrink(get_model(name))
    model = build_model(spec, device="cpu", dtype="bfloat16")
    model.save_pretrained(tmp_path, **kwargs)
    assert any(tmp_path.glob("*.safetensors"))
    return spec, sum(p.numel() for p in model.parameters()), torch


def test_directory_with_safetensors_gives_exact_count_and_dtype(tmp_path):
    spec, numel, _ = _save_tiny(tmp_path, "qwen2.5-0.5b")  # tied embeddings: stored once
    loaded = resolve_model(str(tmp_path))
    assert loaded.exact_params == numel == count_params(spec).total
    assert loaded.stored_dtype == "bfloat16" and loaded.id.startswith("local:")


def test_sharded_checkpoint_reads_every_shard(tmp_path):
    spec, numel, _ = _save_tiny(tmp_path, "llama3.1-8b", max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    assert read_safetensors_params(tmp_path) == (numel, "bfloat16")


def test_buffers_in_old_checkpoints_are_not_parameters(tmp_path):
    header = {"h.0.attn.bias": {"dtype": "F32", "shape": [1, 1, 8, 8], "data_offsets": [0, 256]},
              "h.0.attn.c_attn.bias": {"dtype": "F32", "shape": [12], "data_offsets": [256, 304]},
              "layers.0.rotary_emb.inv_freq": {"dtype": "F32", "shape": [4], "data_offsets": [304, 320]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(320))
    assert read_safetensors_params(tmp_path) == (12, "float32")


def test_corrupt_safetensors_is_bad_input(tmp_path):
    (tmp_path / "model.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(BadInputError, match="model.safetensors"):
        read_safetensors_params(tmp_path)


def _write(tmp_path, data):
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


LLAMA = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}


def test_malformed_json_names_the_file(tmp_path):
    path = _write(tmp_path, '{"model_type": "llama",')
    with pytest.raises(BadInputError, match="config.json: not valid JSON"):
        load_local(path)


@pytest.mark.parametrize("change,key", [({"hidden_size": None}, "hidden_size"),
                                        ({"num_hidden_layers": "two"}, "num_hidden_layers"),
                                        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
                                        ({"hidden_act": "swishglu"}, "hidden_act")])
def test_bad_key_is_named(tmp_path, change, key):
    data = {**LLAMA, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(BadInputError, match=key):
        load_local(_write(tmp_path, data))


def test_unknown_model_type_lists_supported(tmp_path):
    with pytest.raises(BadInputError) as err:
        load_local(_write(tmp_path, {**LLAMA, "model_type": "rwkv"}))
    assert "'rwkv'" in str(err.value) and "llama" in str(err.value) and "gpt_neox" in str(err.value)


def test_remote_code_config_is_never_executed(tmp_path):
    remote = {**LLAMA, "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}
    (tmp_path / "modeling_evil.py").write_text("raise SystemExit('executed remote code')\n")
    # Known model_type: shapes are read, the code is not touched.
    assert load_local(_write(tmp_path, remote)).num_layers == 2
    with pytest.raises(BadInputError, match="trust_remote_code"):
        load_local(_write(tmp_path, {**remote, "model_type": "evil"}))


def test_prequantized_checkpoint_keeps_computed_count(tmp_path):
    _save_tiny(tmp_path, "llama3.2-1b")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load_local(tmp_path)
    assert loaded.exact_params is None and loaded.stored_dtype == "int4"


def test_missing_directory_config(tmp_path):
    with pytest.raises(BadInputError, match="no config.json"):
        load_local(tmp_path)
