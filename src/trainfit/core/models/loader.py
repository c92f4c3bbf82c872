"""Read a local model directory or config.json into a ModelSpec, offline and without executing
any code from the model repository.

The exact parameter count and stored dtype come from the safetensors headers when present: a
.safetensors file starts with an 8-byte little-endian header length and a JSON header mapping
tensor names to dtype / shape / offsets (https://huggingface.co/docs/safetensors, "Format").
Sharded checkpoints list their files in model.safetensors.index.json ("weight_map").
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

from trainfit.core.models.dropout_config import dropout_fields
from trainfit.core.models.capabilities import SUPPORTED_ARCHITECTURES, capabilities_of
from trainfit.core.models.families import FAMILY_FIELDS, activation
from trainfit.core.models.spec import ModelSpec, StoredDtype, VisionTowerSpec
from trainfit.core.models.params import vision_params
from trainfit.errors import BadInputError, short_repr
from trainfit.validate import parse_json, read_text_file

# Per model_type: config defaults transformers applies when a key is absent.
_TIE_DEFAULT = {"gemma": True, "gemma2": True, "gemma3_text": True, "gpt2": True}
_ST_DTYPES: dict[str, StoredDtype] = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I8": "int8",
                                      "F8_E4M3": "fp8", "F8_E5M2": "fp8"}
_CFG_DTYPES: dict[str, StoredDtype] = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
# The default Qwen2-VL image for tokens_per_image: 448 x 448 pixels.
_VL_IMAGE_PIXELS = 448
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class _Cfg:
    """config.json access that names the file and key in every error."""

    def __init__(self, data: dict[str, Any], origin: str):
        self.data, self.origin = data, origin

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if value is None:
            raise BadInputError(f"{self.origin}: missing key '{key}'")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise BadInputError(f"{self.origin}: key '{key}' must be a positive integer, got {short_repr(value)}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise BadInputError(f"{self.origin}: key '{key}' must be true or false, got {short_repr(value)}")
        return value


def _read_json(path: Path) -> dict[str, Any]:
    data = parse_json(read_text_file(path, "model file"), str(path))
    if not isinstance(data, dict):
        raise BadInputError(f"{path}: expected a JSON object")
    return data


def load_local(path: str | Path) -> ModelSpec:
    """A ModelSpec from a model directory (config.json + optional safetensors) or a config.json."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise BadInputError(f"{path}: no config.json found", hint="give a model directory or a config.json file")
    config = _read_json(config_path)
    spec = spec_from_config(config, origin=str(config_path), model_id=f"local:{directory}")
    if path.is_dir():
        spec = with_safetensors_params(spec, config, read_safetensors_params(directory))
    return spec


def spec_from_config(data: dict[str, Any], origin: str = "config.json", model_id: str = "local") -> ModelSpec:
    """ModelSpec from a parsed config.json. Remote-code configs (auto_map) are read only when their
    model_type is one trainfit knows; nothing from the repository is ever executed."""
    cfg = _Cfg(data, origin)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        remote = " (it needs trust_remote_code, which trainfit never runs)" if "auto_map" in data else ""
        counted = _meta_count_note(data)
        raise BadInputError(f"{origin}: key 'model_type': {short_repr(model_type)} is not supported{remote}{counted}",
                            hint=f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    if model_type in FAMILY_FIELDS:
        spec = ModelSpec(id=model_id, architecture=model_type, stored_dtype=_config_dtype(cfg), source=origin,
                         **FAMILY_FIELDS[model_type](cfg), **dropout_fields(data, model_type, origin))
        check_plausible(spec, origin, explicit_head_dim=True)
        return spec
    caps = capabilities_of(model_type)
    text = _Cfg(data["text_config"], f"{origin} text_config") if caps.vision_tower and isinstance(
        data.get("text_config"), dict) else cfg
    fields = _gpt2_fields(cfg) if model_type == "gpt2" else _common_fields(text, model_type)
    if caps.moe:
        fields.update(_moe_fields(cfg, model_type))
    tie_cfg = cfg if cfg.get("tie_word_embeddings") is not None else text
    fields["tie_embeddings"] = tie_cfg.bool("tie_word_embeddings", _TIE_DEFAULT.get(model_type, False))
    fields.update(_bias_fields(text, model_type))
    fields.update(dropout_fields(text.data, model_type, text.origin))
    if model_type == "gpt_neox" and cfg.bool("use_parallel_residual", True):
        # attention and MLP both read the block input, each through its own LayerNorm
        fields.update(parallel_attention=True, block_norms=2)
    spec = ModelSpec(id=model_id, architecture=model_type, stored_dtype=_config_dtype(cfg, text),
                     source=origin, **fields)
    if caps.vision_tower:
        spec = _with_vision(spec, cfg)
    check_plausible(spec, origin, explicit_head_dim=text.get("head_dim") is not None)
    return spec


def _meta_count_note(data: dict[str, Any]) -> str:
    """For a model_type transformers ships: its exact parameter count, built on the meta device."""
    from trainfit.core.models.meta_count import meta_param_count

    counted = meta_param_count(data)
    if counted is None:
        return ""
    params, cls = counted
    return (f": it has {params:,} parameters ({cls} built by transformers on the meta device), but trainfit has no "
            "layer layout for it, so no activation, gradient or optimizer estimate")


# ModelSpec field -> the validate.BOUNDS entry that limits it.
_DIM_BOUNDS = {"num_layers": "layers", "hidden_size": "hidden", "num_heads": "heads", "num_kv_heads": "kv_heads",
               "head_dim": "hidden", "intermediate_size": "intermediate", "vocab_size": "vocab",
               "max_position_embeddings": "max_position_embeddings"}


def check_plausible(spec: ModelSpec, origin: str, *, explicit_head_dim: bool = True) -> None:
    """BadInputError when the dimensions cannot be a model transformers builds (heads that do not
    divide the width, KV heads that do not divide the heads) or are beyond any real model (a
    config claiming 7e42 parameters)."""
    from trainfit.core.models.params import count_params
    from trainfit.validate import BOUNDS

    for name, bound in _DIM_BOUNDS.items():
        why = BOUNDS[bound].problem(getattr(spec, name))
        if why:
            raise BadInputError(f"{origin}: {name} {why}")
    if not explicit_head_dim and spec.hidden_size % spec.num_heads:
        raise BadInputError(f"{origin}: hidden size {spec.hidden_size} is not a multiple of the {spec.num_heads} "
                            "attention heads", hint="transformers needs hidden_size = heads x head_dim")
    if spec.num_heads % spec.num_kv_heads:
        raise BadInputError(f"{origin}: {spec.num_heads} attention heads are not a multiple of the "
                            f"{spec.num_kv_heads} key/value heads")
    if spec.num_experts and not 1 <= spec.experts_per_token <= spec.num_experts:
        raise BadInputError(f"{origin}: num_experts_per_tok ({spec.experts_per_token}) must be from 1 to the "
                            f"number of experts ({spec.num_experts}); a token cannot be routed to more experts "
                            "than the layer has")
    total = count_params(spec).total
    if total > MAX_PARAMS:
        raise BadInputError(f"{origin}: these dimensions make {total:.3g} parameters, above the {MAX_PARAMS:.0e} "
                            "any real model has")


def _common_fields(cfg: _Cfg, model_type: str) -> dict[str, Any]:
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    kv = cfg.int("num_key_value_heads", heads)
    caps = capabilities_of(model_type)
    gated = model_type not in ("phi", "gpt_neox")
    act_key = caps.hf_activation_key if cfg.get(caps.hf_activation_key) else "hidden_act"
    if model_type == "phi" and cfg.get("qk_layernorm"):
        raise BadInputError(f"{cfg.origin}: key 'qk_layernorm': phi with q/k LayerNorm is not supported")
    sliding = cfg.get("sliding_window")
    if caps.sliding_window_switch and not cfg.get("use_sliding_window", False):
        sliding = None  # Qwen configs carry a window but use it only with use_sliding_window
    return dict(
        vocab_size=cfg.int("vocab_size"), hidden_size=hidden, num_layers=cfg.int("num_hidden_layers"),
        num_heads=heads, num_kv_heads=kv, head_dim=cfg.int("head_dim", hidden // heads),
        intermediate_size=cfg.int("intermediate_size"),
        activation=activation(cfg, act_key, "gelu_new" if model_type == "phi" else "silu"), gated_mlp=gated,
        position="rope", max_position_embeddings=cfg.int("max_position_embeddings", 2048),
        norm="layernorm" if model_type in ("phi", "gpt_neox") else "rmsnorm",
        sliding_window=sliding if isinstance(sliding, int) and not isinstance(sliding, bool) else None,
    )


def _gpt2_fields(cfg: _Cfg) -> dict[str, Any]:
    if cfg.get("add_cross_attention"):
        raise BadInputError(f"{cfg.origin}: key 'add_cross_attention': GPT-2 with cross-attention is not supported")
    hidden, heads = cfg.int("n_embd"), cfg.int("n_head")
    return dict(
        vocab_size=cfg.int("vocab_size"), hidden_size=hidden, num_layers=cfg.int("n_layer"), num_heads=heads,
        num_kv_heads=heads, head_dim=hidden // heads, intermediate_size=cfg.int("n_inner", 4 * hidden),
        activation=activation(cfg, "activation_function", "gelu_new"), gated_mlp=False, position="learned",
        max_position_embeddings=cfg.int("n_positions", 1024), norm="layernorm",
    )


def _bias_fields(cfg: _Cfg, model_type: str) -> dict[str, bool]:
    if model_type in ("phi", "gpt2"):
        return dict(qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=model_type == "phi")
    if model_type == "gpt_neox":
        bias = cfg.bool("attention_bias", True)
        return dict(qkv_bias=bias, o_bias=bias, mlp_bias=True, lm_head_bias=False)
    if model_type in ("qwen2", "qwen2_moe", "qwen2_vl"):  # q/k/v biases are hard-wired
        return dict(qkv_bias=True, o_bias=False, mlp_bias=False, lm_head_bias=False)
    if model_type in ("llama", "granite", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "smollm3", "olmo2"):
        bias = cfg.bool("attention_bias", False)
        mlp = cfg.bool("mlp_bias", False) if model_type in ("llama", "granite") else False
        return dict(qkv_bias=bias, o_bias=bias, mlp_bias=mlp, lm_head_bias=False)
    return dict(qkv_bias=False, o_bias=False, mlp_bias=False, lm_head_bias=False)


def _moe_fields(cfg: _Cfg, model_type: str) -> dict[str, Any]:
    if model_type == "mixtral":
        experts = cfg.int("num_local_experts")
        return dict(num_experts=experts, experts_per_token=cfg.int("num_experts_per_tok"),
                    moe_intermediate_size=cfg.int("intermediate_size"))
    if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
        raise BadInputError(f"{cfg.origin}: keys 'decoder_sparse_step'/'mlp_only_layers': {model_type} with dense "
                            "layers between the MoE layers is not supported")
    moe, shared = cfg.int("moe_intermediate_size"), cfg.get("shared_expert_intermediate_size", 0)
    if shared % moe:
        raise BadInputError(f"{cfg.origin}: key 'shared_expert_intermediate_size' ({shared}) must be a multiple "
                            f"of moe_intermediate_size ({moe})")
    # Qwen3-MoE's hub configs say num_experts; transformers 5 writes it back as num_local_experts
    experts_key = "num_local_experts" if cfg.get("num_experts") is None and cfg.get("num_local_experts") else "num_experts"
    return dict(num_experts=cfg.int(experts_key), experts_per_token=cfg.int("num_experts_per_tok"),
                moe_intermediate_size=moe, shared_experts=shared // moe)


def _config_dtype(*cfgs: _Cfg) -> StoredDtype:
    quant = cfgs[0].get("quantization_config")
    if isinstance(quant, dict):  # pre-quantized weights: bitsandbytes, GPTQ/AWQ bits, fp8
        if quant.get("load_in_4bit") or quant.get("bits") == 4:
            return "int4"
        if quant.get("load_in_8bit") or quant.get("bits") == 8:
            return "int8"
        if "fp8" in str(quant.get("quant_method", "")).lower():
            return "fp8"
    for cfg in cfgs:
        name = cfg.get("torch_dtype", cfg.get("dtype"))
        if name in _CFG_DTYPES:
            return _CFG_DTYPES[name]
    return "float32"  # transformers' default when a config names no dtype


def _with_vision(spec: ModelSpec, cfg: _Cfg) -> ModelSpec:
    import dataclasses

    raw = cfg.get("vision_config")
    if not isinstance(raw, dict):
        raise BadInputError(f"{cfg.origin}: missing key 'vision_config'")
    v = _Cfg(raw, f"{cfg.origin} vision_config")
    embed, patch, merge = v.int("embed_dim", 1280), v.int("patch_size", 14), v.int("spatial_merge_size", 2)
    patches = (_VL_IMAGE_PIXELS // patch) ** 2
    tower = VisionTowerSpec(params=0, hidden_size=embed, num_layers=v.int("depth", 32),
                            num_heads=v.int("num_heads", 16), intermediate_size=embed * v.int("mlp_ratio", 4),
                            patch_size=patch, tokens_per_image=patches // merge**2, patches_per_image=patches)
    spec = dataclasses.replace(spec, vision=tower)
    return dataclasses.replace(spec, vision=dataclasses.replace(tower, params=vision_params(spec)))


def _is_buffer(name: str, shape: list[int]) -> bool:
    # Older checkpoints also saved non-parameter buffers: rotary inv_freq, GPT-2 / GPT-NeoX causal
    # masks ("attn.bias" 4-D, "masked_bias"). They are not parameters.
    # BERT-style checkpoints may carry the embeddings' position_ids buffer (int64, 1 x positions).
    return name.endswith(("inv_freq", "masked_bias", "position_ids")) or (name.endswith(".bias") and len(shape) == 4)


_ST_ITEM_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                  "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
# Largest plausible tensor dimension and parameter count: far above any real model, small enough
# that a corrupt header cannot claim 7e42 parameters.
_MAX_DIM = 2**40
MAX_PARAMS = 10**15


def header_length(raw_len: bytes, origin: str) -> int:
    """The JSON header's length from a safetensors file's first 8 bytes."""
    if len(raw_len) != 8:
        raise BadInputError(f"{origin}: too short to be a safetensors file")
    (length,) = struct.unpack("<Q", raw_len)
    if length > _MAX_HEADER_BYTES:
        raise BadInputError(f"{origin}: safetensors header length {length} is implausible (corrupt file?)")
    return length


def parse_header(raw: bytes, origin: str) -> dict[str, Any]:
    """A safetensors JSON header from its bytes, every tensor entry checked (dtype, shape, offsets)."""
    header = parse_json(raw, f"{origin}: safetensors header")
    if not isinstance(header, dict):
        raise BadInputError(f"{origin}: safetensors header is not a JSON object")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{origin}: tensor {name[:80]!r}"
        if not isinstance(info, dict):
            raise BadInputError(f"{where}: entry is not a JSON object")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)):
            raise BadInputError(f"{where}: 'shape' must be a list of non-negative integers, got {str(shape)[:80]}")
        if info.get("dtype") not in _ST_ITEM_BYTES:
            raise BadInputError(f"{where}: unknown dtype {str(info.get('dtype'))[:20]!r}",
                                hint=f"safetensors dtypes: {', '.join(_ST_ITEM_BYTES)}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise BadInputError(f"{where}: 'data_offsets' must be [begin, end] byte offsets")
    return header


def data_bytes(header: dict[str, Any]) -> int:
    """Bytes of tensor data the header describes (the file is 8 + header length + this)."""
    return max((info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"), default=0)


def _header(path: Path) -> dict[str, Any]:
    """A local file's header; the file's size is checked against it (a truncated download
    has a whole header and missing weights)."""
    try:
        with path.open("rb") as fh:
            length = header_length(fh.read(8), str(path))
            header = parse_header(fh.read(length), str(path))
        size = path.stat().st_size
    except OSError as exc:
        raise BadInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    expected = 8 + length + data_bytes(header)
    if size < expected:
        raise BadInputError(f"{path}: truncated: {size} bytes, its header describes {expected}",
                            hint="the download was probably interrupted; fetch the file again")
    return header


def params_from_headers(headers: list[dict[str, Any]]) -> tuple[int | None, StoredDtype]:
    """(parameter count, dominant stored dtype) from checked safetensors headers (parse_header);
    (None, "float32") when there are none. Buffers saved by older checkpoints are not counted."""
    return params_from_dtype_elements([dtype_elements(header) for header in headers])


def dtype_elements(header: dict[str, Any]) -> dict[str, int]:
    """Elements per safetensors dtype of one checked header, buffers left out: all a header gives
    the parameter count (a few bytes to keep, where the header may hold 10^5 tensors)."""
    by_dtype: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__" or _is_buffer(name, info["shape"]):
            continue
        by_dtype[info["dtype"]] = by_dtype.get(info["dtype"], 0) + math.prod(info["shape"])
    return by_dtype


def params_from_dtype_elements(shards: list[dict[str, int]]) -> tuple[int | None, StoredDtype]:
    """params_from_headers from each file's dtype_elements."""
    if not shards:
        return None, "float32"
    by_dtype: dict[str, int] = {}
    for counts in shards:
        for dtype, n in counts.items():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + n
    total = sum(by_dtype.values())
    if total > MAX_PARAMS:
        raise BadInputError(f"safetensors headers claim {total:.3g} parameters, above the {MAX_PARAMS:.0e} "
                            "any real model has (corrupt file?)")
    dominant = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else "F32"
    return total, _ST_DTYPES.get(dominant, "float32")


def shard_names(weight_map: Any, origin: str) -> list[str]:
    """The shard file names an index's weight_map lists, each a plain name inside the model's
    directory: an entry such as '../../etc/passwd' is refused, never followed."""
    if not isinstance(weight_map, dict):
        raise BadInputError(f"{origin}: missing key 'weight_map'")
    names = sorted({f for f in weight_map.values()}, key=str)
    for f in names:
        if not isinstance(f, str) or not f or "/" in f or "\\" in f or f in (".", "..") or "\0" in f:
            raise BadInputError(f"{origin}: weight_map entry {str(f)[:80]!r} is not a file name inside the "
                                "model directory", hint="shard names are plain file names such as "
                                "'model-00001-of-00002.safetensors'")
    return names


def read_safetensors_params(directory: str | Path) -> tuple[int | None, StoredDtype]:
    """(parameter count, dominant stored dtype) from the safetensors headers in `directory`;
    (None, "float32") when there are no safetensors files. Only headers are read, never weights."""
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = [directory / name for name in shard_names(_read_json(index).get("weight_map"), str(index))]
    else:
        files = sorted(directory.glob("*.safetensors"))
    for f in files:
        if not f.is_file():
            raise BadInputError(f"{f.name}: listed in {index} but missing")
    return params_from_headers([_header(f) for f in files])


def with_safetensors_params(spec: ModelSpec, config: dict[str, Any],
                            counted: tuple[int | None, StoredDtype]) -> ModelSpec:
    """`spec` with the exact parameter count and stored dtype that safetensors headers gave
    (params_from_headers / read_safetensors_params); unchanged when there were no headers.
    Pre-quantized checkpoints (quantization_config) pack several weights per stored element: the
    element count is not the parameter count (the llmfit#1045 trap), so they keep the computed
    shapes and the config's dtype. Shared by local directories and Hub repositories."""
    import dataclasses

    exact, dtype = counted
    if exact is None or "quantization_config" in config:
        return spec
    return dataclasses.replace(spec, exact_params=exact, stored_dtype=dtype)
