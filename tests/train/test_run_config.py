"""The run-config schema: every example loads, errors are reported all at once with key paths."""

from __future__ import annotations

import pytest
import yaml

from trainfit.config.run_config import load_run_config, parse_count, parse_run_config
from trainfit.errors import BadInputError

from .conftest import REPO, make_config

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_one_example_per_method():
    methods = {load_run_config(p).method for p in EXAMPLES}
    assert methods == {"pretrain", "full", "lora", "qlora", "dpo"}  # sft-full.yaml says "sft" = full


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads_and_maps_to_a_setup(path):
    cfg = load_run_config(path)
    setup = cfg.to_setup("cpu")
    assert setup.global_batch == cfg.training.micro_batch * cfg.training.grad_accum * cfg.training.num_gpus
    assert len(cfg.config_hash()) == 64


def test_all_errors_at_once(tmp_path):
    raw = {"version": 1, "method": "sft", "model": {"shape": {"layers": 2, "hidden": 60, "heads": 8}},
           "data": {"paths": [str(tmp_path / "missing.jsonl")], "formt": "chat"},
           "training": {"micro_batch": 0, "precision": "fp64"}, "schedule": {"max_steps": 5}}
    with pytest.raises(BadInputError) as err:
        parse_run_config(raw, base_dir=tmp_path)
    msg = str(err.value)
    assert "data.formt: unknown key (did you mean format?" in msg
    assert "training.precision" in msg and "'fp32'" in msg  # names the valid choices


def test_semantic_errors_name_keys(tmp_path):
    raw = {"version": 1, "method": "dpo", "model": {"shape": {"layers": 2, "hidden": 60, "heads": 8}},
           "data": {"paths": [str(tmp_path / "missing.jsonl")], "format": "text"},
           "training": {"micro_batch": 0}, "schedule": {}}
    with pytest.raises(BadInputError) as err:
        parse_run_config(raw, base_dir=tmp_path)
    msg = str(err.value)
    for needle in ("model.shape: hidden (60) must be a multiple of heads (8)", "missing.jsonl does not exist",
                   "dpo needs 'preference' data", "training.micro_batch: must be an integer from 1",
                   "schedule: give max_steps or epochs"):
        assert needle in msg


def test_version_and_unknown_builtin(tmp_path):
    raw = {"version": 2, "method": "pretrain", "model": {"shape": {"params": "8m"}},
           "data": {"paths": ["builtin:nope"]}, "schedule": {"max_steps": 1}}
    with pytest.raises(BadInputError, match="version: 2 is not supported"):
        parse_run_config(raw)
    raw["version"] = 1
    with pytest.raises(BadInputError, match="builtin:tiny-corpus"):
        parse_run_config(raw)


def test_relative_paths_resolve_against_the_config(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    path = make_config(tmp_path, "pretrain", data={"paths": ["d.jsonl"]})
    cfg = load_run_config(path)
    assert cfg.data.paths == [str(tmp_path / "d.jsonl")]


def test_hash_ignores_logging_only(tmp_path):
    a = load_run_config(make_config(tmp_path, name="a.yaml"))
    b = load_run_config(make_config(tmp_path, name="b.yaml", logging={"every_steps": 7}))
    c = load_run_config(make_config(tmp_path, name="c.yaml", schedule={"lr": 1e-2}))
    assert a.config_hash() == b.config_hash() != c.config_hash()


def test_parse_count():
    assert parse_count("8m") == 8_000_000 and parse_count("1.5b") == 1_500_000_000 and parse_count(42) == 42
    with pytest.raises(ValueError):
        parse_count("lots")


def test_bad_yaml_is_bad_input(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("version: [1\n")
    with pytest.raises(BadInputError, match="not valid YAML"):
        load_run_config(p)
    assert yaml  # imported for make_config users


def test_params_shape_uses_the_run_vocabulary():
    from trainfit.config.run_config import shape_spec
    from trainfit.config.run_config import ShapeConfig

    spec = shape_spec(ShapeConfig(params="3m"), vocab_size=512)
    assert spec.vocab_size == 512 and spec.id == "shape:3m" and spec.num_layers >= 1


# Hashes that run directories written by earlier versions store: a new config key must leave them
# unchanged (HOW_NOT_WHAT / HASHED_WHEN_SET / data_hash_view), or those runs no longer resume.
STORED_HASHES = [
    ({"version": 1, "method": "pretrain", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
      "data": {"paths": ["builtin:tiny-corpus"]}, "training": {"micro_batch": 2, "seq_len": 64},
      "schedule": {"max_steps": 10}}, "cd40a13e07538fc0"),
    ({"version": 1, "method": "lora", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
      "data": {"paths": ["builtin:tiny-chat"]}, "training": {"micro_batch": 2, "seq_len": 64},
      "schedule": {"max_steps": 10}}, "be2176dc25352c9d"),
    ({"version": 1, "method": "dpo", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
      "data": {"paths": ["builtin:tiny-preferences"]}, "schedule": {"max_steps": 10}}, "7fcc84bcc6d20500"),
]


@pytest.mark.parametrize("raw,stored", STORED_HASHES)
def test_hash_of_earlier_run_directories_is_unchanged(raw, stored):
    assert parse_run_config(raw, source="x").config_hash()[:16] == stored


# The hash of run directories written before the global batch replaced its split (run_dir.legacy_config_hash):
# keys added since must leave it unchanged too.
LEGACY_HASHES = [
    ({"version": 1, "method": "pretrain", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
      "data": {"paths": ["builtin:tiny-corpus"]}, "training": {"micro_batch": 2, "seq_len": 64, "precision": "fp32"},
      "schedule": {"max_steps": 10}}, "d7c45a9c64dd679d"),
    ({"version": 1, "method": "lora", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
      "data": {"paths": ["builtin:tiny-chat"]}, "training": {"micro_batch": 2, "seq_len": 64, "precision": "fp32"},
      "schedule": {"max_steps": 10}}, "f645e44cb5a2e474"),
]


@pytest.mark.parametrize("raw,stored", LEGACY_HASHES)
def test_legacy_hash_of_older_run_directories_is_unchanged(raw, stored):
    from trainfit.train.run_dir import legacy_config_hash

    assert legacy_config_hash(parse_run_config(raw, source="x"))[:16] == stored



def test_precision_auto_is_made_concrete_with_the_hardware_given(monkeypatch, tmp_path):
    """for_device takes the machine as an argument: the schema never probes it (the runner does)."""
    from trainfit.hardware import profiler
    from trainfit.hardware.fakes import load_fixture

    h100 = profiler.build_profile(sources=load_fixture(REPO / "tests/hardware/fixtures/8x-h100-sxm.yaml"),
                                  timeouts={"gpus.nvidia": 0.5})

    def no_probe(**_):
        raise AssertionError("the run-config schema probed the machine")

    monkeypatch.setattr(profiler, "build_profile", no_probe)
    raw = {"version": 1, "method": "pretrain", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
           "data": {"paths": ["builtin:tiny-corpus"]}, "schedule": {"max_steps": 5}}
    cfg = parse_run_config(raw, base_dir=tmp_path)
    assert cfg.training.precision == "auto"
    assert cfg.for_device("cuda", h100).training.precision == "bf16-mixed"  # the H100's 16-bit type
    assert cfg.for_device("cpu", None).training.precision == "fp32"  # no profile: the rule's CPU default
    fixed = parse_run_config({**raw, "training": {"precision": "fp32"}}, base_dir=tmp_path)
    assert fixed.for_device("cuda", h100) is fixed  # an explicit precision stays as written
