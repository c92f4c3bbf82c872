"""The model catalog (`data/models.yaml`): load, validate, look up; and `resolve_model` for any
model reference a user may type (catalog id or alias, local directory / config.json, shape)."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from trainfit.core.models.capabilities import SUPPORTED_ARCHITECTURES, capabilities_of
from trainfit.core.models.spec import ModelSpec
from trainfit.core.models.params import vision_params
from trainfit.core.serde import SerdeError, from_jsonable
from trainfit.errors import BadInputError, UnavailableError, close_matches, short_repr

CATALOG_FILE = "models.yaml"
# Loads ("owner/name", revision or None, suggestions=...) from the Hub: trainfit.hub.models.load_hub_model.
HubLoader = Callable[..., ModelSpec]
_ENTRY_ONLY_KEYS = {"variants"}


def _load_yaml(text: str, origin: str, cache: bool = False) -> dict[str, Any]:
    from trainfit import yaml_io

    try:
        data = yaml_io.load_yaml_cached(text, CATALOG_FILE) if cache else yaml_io.load_yaml(text)
    except yaml_io.YAMLError as exc:
        raise BadInputError(f"{origin}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise BadInputError(f"{origin}: expected a mapping with a 'models' list")
    return data


def parse_catalog(text: str, origin: str = CATALOG_FILE, *, cache: bool = False) -> list[ModelSpec]:
    """Parse and validate a catalog document; every problem is reported at once. cache=True keeps
    the parsed text in the user's cache directory (for the shipped file: see trainfit.yaml_io)."""
    data = _load_yaml(text, origin, cache)
    defaults = data.get("architecture_defaults") or {}
    problems: list[str] = []
    specs: list[ModelSpec] = []
    for i, raw in enumerate(data["models"]):
        name = raw.get("id", f"#{i}") if isinstance(raw, dict) else f"#{i}"
        if not isinstance(raw, dict):
            problems.append(f"entry {name}: expected a mapping")
            continue
        try:
            specs += _expand(raw, defaults)
        except (SerdeError, BadInputError, ValueError) as exc:
            problems.append(f"entry {name!r}: {exc}")
    problems += _check_unique(specs)
    if problems:
        raise BadInputError(f"{origin}: " + "; ".join(problems))
    return specs


def _expand(raw: dict[str, Any], defaults: dict[str, Any]) -> list[ModelSpec]:
    arch = raw.get("architecture")
    if not capabilities_of(arch).supported:
        raise ValueError(f"key 'architecture': {arch!r} is not one of {', '.join(SUPPORTED_ARCHITECTURES)}")
    for key in ("family", "source"):
        if not raw.get(key):
            raise ValueError(f"missing key '{key}'")
    fields = {**defaults.get(arch, {}), **{k: v for k, v in raw.items() if k not in _ENTRY_ONLY_KEYS}}
    if "head_dim" not in fields and isinstance(fields.get("hidden_size"), int) and fields.get("num_heads"):
        fields["head_dim"] = fields["hidden_size"] // fields["num_heads"]
    base = from_jsonable(ModelSpec, fields, path="")
    _validate(base)
    out = [base]
    for var in raw.get("variants") or []:
        if not isinstance(var, dict) or not isinstance(var.get("id"), str):
            raise ValueError("key 'variants': each variant needs an 'id'")
        var_id = var["id"]
        source = base.source.replace(base.id, var_id)
        out.append(from_jsonable(ModelSpec, {**fields, "id": var_id, "aliases": var.get("aliases", []),
                                             "source": var.get("source", source)}, path=""))
    return out


def _validate(s: ModelSpec) -> None:
    """Semantic checks beyond types; raises ValueError naming the key."""
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "max_position_embeddings"):
        if getattr(s, key) <= 0:
            raise ValueError(f"key '{key}' must be positive, got {getattr(s, key)}")
    for key in ("hidden_dropout", "attention_dropout", "embedding_dropout"):
        if not 0 <= getattr(s, key) < 1:
            raise ValueError(f"key '{key}' must be a probability in [0, 1), got {getattr(s, key)}")
    if s.num_heads % s.num_kv_heads:
        raise ValueError(f"key 'num_kv_heads': {s.num_kv_heads} does not divide num_heads {s.num_heads}")
    if s.num_experts and not 0 < s.experts_per_token <= s.num_experts:
        raise ValueError(f"key 'experts_per_token': must be 1..num_experts ({s.num_experts})")
    if bool(s.num_experts) != s.capabilities.moe:
        raise ValueError(f"key 'num_experts': {s.architecture} {'needs' if not s.num_experts else 'has no'} experts")
    if (s.vision is not None) != s.capabilities.vision_tower:
        raise ValueError("key 'vision': only qwen2_vl entries have (and need) a vision tower")
    if s.vision is not None and s.vision.params != vision_params(s):
        raise ValueError(f"key 'vision.params': {s.vision.params} but the tower's shapes give {vision_params(s)}")
    if not s.source.startswith("https://"):
        raise ValueError("key 'source': must be the URL of the config.json")


def _check_unique(specs: list[ModelSpec]) -> list[str]:
    seen: dict[str, int] = {}
    problems = []
    for i, s in enumerate(specs):
        for name in dict.fromkeys(n.lower() for n in [s.id, *s.aliases]):
            if name in seen:
                problems.append(f"name {name!r} used by both {specs[seen[name]].id!r} and {s.id!r}")
            seen[name] = i
    return problems


@functools.lru_cache(maxsize=1)
def all_models() -> tuple[ModelSpec, ...]:
    """Every catalog entry (variants included), in file order."""
    text = resources.files("trainfit").joinpath("data", CATALOG_FILE).read_text(encoding="utf-8")
    return tuple(parse_catalog(text, cache=True))


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, ModelSpec]:
    index: dict[str, ModelSpec] = {}
    short: dict[str, list[ModelSpec]] = {}
    for s in all_models():
        index[s.id.lower()] = s
        for a in s.aliases:
            index[a.lower()] = s
        short.setdefault(s.id.split("/")[-1].lower(), []).append(s)
    # The part after "owner/" works as a name too when it is unambiguous ("Qwen2.5-7B").
    for name, hits in short.items():
        if len(hits) == 1:
            index.setdefault(name, hits[0])
    return index


def families() -> list[str]:
    return sorted({s.family for s in all_models()})


def get_model(name_or_alias: str) -> ModelSpec:
    """Catalog entry by hub id or alias (case-insensitive)."""
    spec = _index().get(name_or_alias.strip().lower())
    if spec is None:
        similar = _similar(name_or_alias)
        hint = f"did you mean: {', '.join(similar)}" if similar else "see 'trainfit models' for the list"
        raise BadInputError(f"unknown model {short_repr(name_or_alias)}", hint=hint + "; a local directory, a config.json "
                            "or a shape such as 'shape:125m' also work")
    return spec


def _similar(name: str) -> list[str]:
    """Catalog ids and aliases that look like `name`, for 'did you mean' hints."""
    return close_matches(name, [s.id for s in all_models()] + [a for s in all_models() for a in s.aliases], n=5)


# A Hub repo id: "owner/name", each part letters, digits, "_", "-", "." (not first or last), at
# most 96 characters; then an optional "@revision" (branch, tag, commit, "refs/pr/1").
_PART = r"\w(?:[\w.-]{0,94}\w)?"
_HUB_REF = re.compile(rf"({_PART}/{_PART})(?:@([\w][\w./+-]{{0,254}}))?", re.ASCII)


def parse_hub_ref(ref: str) -> tuple[str, str | None] | None:
    """("owner/name", revision or None) when `ref` reads as a Hub model id, else None."""
    m = _HUB_REF.fullmatch(ref)
    if m is None or ".." in ref or "--" in m.group(1) or m.group(1).endswith((".git", ".json")):
        return None
    return m.group(1), m.group(2)


def _looks_like_path(ref: str) -> bool:
    # Hub ids have exactly one "/" ("owner/name"); paths start with . / ~ or have more parts.
    return ref.startswith((".", "/", "~")) or ref.endswith(".json") or ref.count("/") > 1 or os.sep != "/" and os.sep in ref


def resolve_model(ref: str, *, hub_loader: HubLoader | None = None) -> ModelSpec:
    """A ModelSpec from a catalog id/alias, a local model directory, a config.json path, a shape
    ("shape:125m", "125m", "shape:layers=12,hidden=768,heads=12,vocab=50257") or any model on the
    Hugging Face Hub ("owner/name", "owner/name@revision": config.json and safetensors headers,
    fetched once and cached). The core makes no request: a Hub id goes to `hub_loader`, the Hub
    client trainfit.hub.resolve_model passes (trainfit.hub.models.load_hub_model)."""
    from trainfit.core.models import loader as model_loader
    from trainfit.core.models import shapes as model_shapes

    ref = ref.strip()
    if not ref:
        raise BadInputError("model: empty reference", hint="give a catalog id, a directory, a config.json or a shape")
    if ref.lower().startswith("shape:"):
        return model_shapes.parse_shape(ref[len("shape:"):])
    from trainfit.validate import path_kind

    path = Path(os.path.expanduser(ref))
    if path_kind(path) != "none":  # a name too long for any filesystem is no local path either
        return model_loader.load_local(path)
    if ref.lower() in _index():
        return _index()[ref.lower()]
    if model_shapes.looks_like_size(ref):
        return model_shapes.parse_shape(ref)
    hub_ref = parse_hub_ref(ref)
    if hub_ref is not None:  # not in the catalog, or a revision asked for
        if hub_loader is None:
            raise UnavailableError(f"model: {short_repr(ref)} is a Hugging Face Hub id, and this caller reads "
                                   "no Hub (trainfit.hub.resolve_model does)")
        return hub_loader(*hub_ref, suggestions=lambda: _similar(hub_ref[0]))
    if _looks_like_path(ref):
        raise BadInputError(f"model: {short_repr(ref)} does not exist (no such file or directory)")
    return get_model(ref)
