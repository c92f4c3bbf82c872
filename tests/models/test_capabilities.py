"""ModelCapabilities: the one table of architecture differences, and the rule that no module
outside the family loaders decides anything by an architecture's name."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest

import trainfit
from trainfit.core.models.capabilities import (BUILDABLE_ARCHITECTURES, CAPABILITIES, SUPPORTED_ARCHITECTURES,
                                              UNKNOWN, ModelCapabilities, capabilities_of)
from trainfit.core.models.catalog import all_models, get_model
from trainfit.core.models.loader import spec_from_config
from trainfit.core.models.families import FAMILY_FIELDS, activation
from trainfit.core.serde import to_jsonable

SRC = Path(trainfit.__file__).parent
# The family loaders: the only modules where an architecture's name may decide something (named
# by their modules, so the set follows them when they move).
FAMILY_LOADERS = {Path(inspect.getfile(f)).relative_to(SRC).as_posix()
                  for f in (capabilities_of, spec_from_config, activation)}


def test_the_family_loaders_are_found():
    assert len(FAMILY_LOADERS) == 3 and all((SRC / name).is_file() for name in FAMILY_LOADERS)


def test_every_supported_architecture_has_an_entry():
    assert SUPPORTED_ARCHITECTURES == tuple(CAPABILITIES)
    assert all(CAPABILITIES[arch].supported for arch in SUPPORTED_ARCHITECTURES)
    assert set(FAMILY_FIELDS) <= set(SUPPORTED_ARCHITECTURES)
    assert set(BUILDABLE_ARCHITECTURES) <= set(SUPPORTED_ARCHITECTURES)
    assert {m.architecture for m in all_models()} <= set(SUPPORTED_ARCHITECTURES)


def test_unknown_architectures_have_no_quirks():
    assert capabilities_of("opt") is UNKNOWN and not UNKNOWN.supported
    assert capabilities_of(["llama"]) is UNKNOWN  # a malformed catalog / config value
    assert UNKNOWN == ModelCapabilities()


def test_capabilities_are_not_serialised():
    spec = get_model("qwen2.5-0.5b")
    assert spec.capabilities is CAPABILITIES[spec.architecture]
    dumped = to_jsonable(spec)
    assert "capabilities" not in dumped
    assert set(dumped) == {f.name for f in dataclasses.fields(spec)}
    assert "capabilities" not in json.dumps(dumped)


def test_capability_values_are_consistent():
    for arch, caps in CAPABILITIES.items():
        assert caps.norms_per_block in (1, 2, 4), arch
        assert bool(caps.peft_v4_names) == bool(caps.peft_v4_fused_pair), arch
        assert not (caps.peft_v4_names and not caps.moe), arch
        assert not (caps.encoder and caps.encoder_decoder), arch
        assert bool(caps.mlm_decoder) == caps.encoder == bool(caps.mlm_head_transform), arch
        assert caps.hf_moe_keys == "none" or caps.moe, arch
        assert not caps.buildable or not (caps.encoder or caps.encoder_decoder), arch
        assert len(caps.dropout_keys) == 3, arch


def test_catalog_specs_agree_with_their_capabilities():
    for spec in all_models():
        caps = spec.capabilities
        assert bool(spec.num_experts) == caps.moe, spec.id
        assert (spec.vision is not None) == caps.vision_tower, spec.id
        assert bool(spec.decoder_layers) == caps.encoder_decoder, spec.id


def test_a_capability_changes_the_formula_that_reads_it(monkeypatch):
    """A quirk is one field: giving Llama Gemma-2's final soft-capping adds its saved logits copy."""
    from trainfit.core.memory.activations import loss_bytes_per_token
    from trainfit.core.setup import TrainingSetup

    spec, setup = get_model("llama3.2-1b"), TrainingSetup(precision="bf16")
    saved, _, _ = loss_bytes_per_token(spec, setup)
    monkeypatch.setitem(CAPABILITIES, "llama", dataclasses.replace(CAPABILITIES["llama"], logit_softcap=True))
    capped, _, _ = loss_bytes_per_token(spec, setup)
    assert capped == saved + 2 * spec.vocab_size


def test_qk_norm_and_block_norms_are_counted_from_capabilities():
    from trainfit.core.models.params import count_params

    qwen3 = get_model("qwen3-0.6b")
    plain = dataclasses.replace(qwen3, architecture="qwen2")  # same shapes, no q/k norm
    per_layer = (count_params(qwen3).total - count_params(plain).total) // qwen3.num_layers
    assert per_layer == 2 * qwen3.head_dim  # q_norm + k_norm of head_dim each (RMSNorm: weight only)


def test_eager_only_architectures_are_estimated_with_eager_attention():
    from trainfit.core.memory.estimate import estimate_memory
    from trainfit.core.setup import TrainingSetup

    eager_only = [m for m in all_models() if m.capabilities.eager_attention_only]
    assert eager_only
    est = estimate_memory(eager_only[0], TrainingSetup(attention="sdpa"))
    assert any("supports only eager attention" in note for note in est.notes)


# --- no architecture name tested outside the family loaders -----------------------------------


def _literal_strings(node: ast.AST) -> set[str] | None:
    """The strings of a str constant or a literal tuple / list / set / dict (keys); None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        parts = [_literal_strings(e) for e in node.elts]
        return set().union(*parts) if all(p is not None for p in parts) else None
    if isinstance(node, ast.Dict):
        parts = [_literal_strings(k) for k in node.keys if k is not None]
        return set().union(*parts) if all(p is not None for p in parts) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal_strings(node.left), _literal_strings(node.right)
        return left | right if left is not None and right is not None else None
    return None


def _module_sets(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level names bound to literal collections of strings."""
    out: dict[str, set[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            strings = _literal_strings(stmt.value)
            if isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name) and stmt.value.args:
                strings = _literal_strings(stmt.value.args[0])  # frozenset({...}), set((...))
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Name) and strings is not None:
                    out[t.id] = strings
    return out


def _arch_aliases(tree: ast.Module) -> set[str]:
    """Local names bound to an `.architecture` (`arch = spec.architecture`, `h, arch = ..., x.architecture`)."""
    names = {"model_type"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts))
            for t, v in pairs:
                if isinstance(t, ast.Name) and isinstance(v, ast.Attribute) and v.attr == "architecture":
                    names.add(t.id)
    return names


def _is_arch(node: ast.AST, aliases: set[str]) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr in ("architecture", "model_type"))
            or (isinstance(node, ast.Name) and node.id in aliases))


# Registries of other libraries keyed by model_type: asking transformers, not testing a name.
OTHER_REGISTRIES = {"CONFIG_MAPPING"}


def _names_an_architecture(node: ast.AST, sets: dict[str, set[str]]) -> bool:
    """Whether a compared value (or a looked-up table) is a model architecture name or a set of
    them. Literals of other names (a CPU's "aarch64", a GPU's "apple-m1") are not; an imported or
    computed name may be."""
    strings = _literal_strings(node)
    if strings is None and isinstance(node, ast.Name) and node.id in sets:
        strings = sets[node.id]
    if strings is not None:
        return bool(strings & set(SUPPORTED_ARCHITECTURES))
    if isinstance(node, ast.Name) and node.id in OTHER_REGISTRIES:
        return False
    return isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))


def _violations(source: str, rel: str) -> list[str]:
    tree = ast.parse(source, rel)
    sets, aliases = _module_sets(tree), _arch_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                left, right = operands[i], operands[i + 1]
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                for a, b in ((left, right), (right, left)):
                    if _is_arch(a, aliases) and _names_an_architecture(b, sets):
                        found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        # A table keyed by architecture: TABLE[spec.architecture], TABLE.get(spec.architecture, ...).
        if isinstance(node, ast.Subscript) and _is_arch(node.slice, aliases) and _names_an_architecture(node.value, sets):
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and _is_arch(node.args[0], aliases) and _names_an_architecture(node.func.value, sets)):
            found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_no_architecture_name_is_tested_outside_the_family_loaders():
    files = [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).as_posix() not in FAMILY_LOADERS]
    assert len(files) > 50
    found = [v for p in files for v in _violations(p.read_text(), p.relative_to(SRC).as_posix())]
    assert not found, "read spec.capabilities (core/models/capabilities.py) instead:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    'def f(spec):\n    return spec.architecture == "gemma2"\n',
    'def f(spec):\n    arch = spec.architecture\n    return arch in ("falcon", "bloom")\n',
    'def f(spec):\n    h, arch = spec.hidden_size, spec.architecture\n    return arch != "phi"\n',
    'EAGER = ("gemma2", "bloom")\ndef f(model):\n    return model.architecture in EAGER\n',
    'from x import MOE\ndef f(spec):\n    return spec.architecture not in MOE\n',
    'TABLE = {"gemma2": 4}\ndef f(spec):\n    return TABLE.get(spec.architecture, 2)\n',
    'def f(model_type):\n    return model_type == "qwen2_vl"\n',
])
def test_the_check_finds_name_tests(source):
    assert _violations(source, "probe.py"), source


def test_the_check_leaves_hardware_architectures_alone():
    source = ('def f(profile, gpus):\n    return profile.cpu.architecture in ("aarch64", "arm64") '
              'or gpus[0].architecture != "apple-m1"\n')
    assert not _violations(source, "probe.py")
