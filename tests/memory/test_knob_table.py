"""The one declared knob table (trainfit.core.knobs) and the one table of refusals
(trainfit.core.knob_rules): every knob complete, the flags, run-config keys, schema and README
table generated from it, and a refusal of the command line and of a run config coming from the
same rule, worded by flag in one and by key in the other."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

from trainfit.cli.main import main
from trainfit.config.run_config import parse_run_config
from trainfit.core import knob_rules
from trainfit.core.knobs import KNOBS, RUNTIME_KNOBS, json_schema, markdown_table
from trainfit.core.setup import TrainingSetup
from trainfit.errors import BadInputError

README = Path(__file__).resolve().parents[2] / "README.md"

# TrainingSetup fields no knob sets directly: the CLI maps a knob onto them (core.knob_setup),
# or the planner / hardware decides them.
MAPPED_FIELDS = {
    "method", "lora", "quant", "num_gpus", "zero_stage", "fsdp_strategy", "device", "dpo_reference", "image_size",
    "images_per_example",  # knobs without a direct field
    "bnb_keeps_input", "logits_shift_copy", "logits_returned_fp32", "experts_fused", "fsdp_flat_params",
    "reentrant_checkpoint_around_fsdp_units", "cache_under_checkpointing", "mqa_kv_unrepeated",  # versions
    "num_nodes", "hybrid_shard",  # from the hardware (multi-node) and the planner
}


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_every_knob_has_a_flag_a_key_bounds_and_help():
    for k in KNOBS:
        assert k.flag.startswith("--") and k.yaml_key and len(k.help) > 10, k.name
        bounded = k.kind in ("bool", "list") or k.choices or k.range is not None or k.pattern
        assert bounded, f"{k.name}: no bounds, choices or form"
        assert k.valid_text()
    assert len({k.flag for k in KNOBS}) == len(KNOBS) and len({k.yaml_key for k in KNOBS}) == len(KNOBS)


def test_every_setup_field_is_a_knob_or_mapped():
    """A new TrainingSetup field without a row in the table fails here."""
    direct = {k.field for k in KNOBS if k.field}
    fields = {f.name for f in dataclasses.fields(TrainingSetup)}
    assert direct <= fields
    assert fields - direct == MAPPED_FIELDS


def test_every_knob_flag_parses_and_every_key_is_read():
    """Each knob's flag is on estimate's parser, and each training key is a key of the run config."""
    import argparse

    from trainfit.cli.cmd_estimate import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = {s for a in parser._actions for s in a.option_strings}
    assert {k.flag for k in KNOBS} <= flags
    for k in KNOBS:
        if not k.yaml_key.startswith("training.") or k.yaml_key.count(".") > 1:
            continue
        key = k.yaml_key.split(".")[1]
        raw = {"version": 1, "method": "lora", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 2}},
               "data": {"paths": ["builtin:tiny-corpus"]}, "schedule": {"max_steps": 1},
               "training": {key: "surely-not-valid"}}
        with pytest.raises(BadInputError) as caught:
            parse_run_config(raw)
        assert f"training.{key}" in caught.value.message and "unknown key" not in caught.value.message, key


def test_estimate_help_is_short_and_help_all_has_every_flag():
    code, out, _ = run_cli("estimate", "--help")
    options = [ln for ln in out.splitlines() if re.match(r"^  -", ln)]
    assert code == 0 and len(options) <= 30, len(options)
    for k in RUNTIME_KNOBS:
        assert k.flag not in out
    code, full, _ = run_cli("estimate", "--help-all")
    assert code == 0 and all(k.flag in full for k in KNOBS) and "--runtime" in full


def test_runtime_key_equals_its_old_flag():
    base = ("estimate", "meta-llama/Llama-3.1-8B", "--hardware", "8x a100-80gb", "--fsdp", "full-shard",
            "--method", "lora", "--grad-accum", "4", "--json")
    flag = json.loads(run_cli(*base, "--fsdp-no-sync", "--model-code", "litgpt")[1])
    key = json.loads(run_cli(*base, "--runtime", "fsdp_no_sync=true", "--runtime", "model_code=litgpt")[1])
    assert flag["setup"] == key["setup"] and key["setup"]["fsdp_no_sync"] and key["devices"] == flag["devices"]


@pytest.mark.parametrize("item, needle", [
    ("fsdp_no_sync", "is not KEY=VALUE"),
    ("no_such_knob=1", "unknown key 'no_such_knob' (valid: optimizer_impl"),
    ("micro_batch=2", "unknown key 'micro_batch'"),  # an everyday knob has its own flag
    ("fsdp_no_sync=maybe", "fsdp_no_sync: must be true or false"),
    ("model_code=gpt", "model_code: must be one of transformers, litgpt, got 'gpt'"),
    ("transformers_version=new", "transformers_version: must be a version"),
])
def test_runtime_refusals_name_key_and_valid_values(item, needle):
    code, out, err = run_cli("estimate", "qwen2.5-0.5b", "--hardware", "t4", "--runtime", item)
    assert code == 2 and needle in err and out == "" and "Traceback" not in err


def _config(training: dict, method: str = "lora") -> dict:
    return {"version": 1, "method": method, "model": {"shape": {"layers": 2, "hidden": 64, "heads": 2}},
            "data": {"paths": ["builtin:tiny-corpus"]}, "schedule": {"max_steps": 1}, "training": training}


# (estimate's flags, the run config's training keys, its method, the rule both break, the knob it names)
SAME_RULE = [
    (["--dora"], {"dora": True}, "full", "dora-is-lora", "dora"),
    (["--zero", "0", "--offload", "optimizer"], {"offload": "optimizer"}, "full", "offload-needs-zero", "offload"),
    (["--optimizer-in-backward", "--grad-accum", "4", "--gpus", "1"], {"optimizer_in_backward": True, "grad_accum": 4},
     "full", "in-backward-no-accumulation", "grad_accum"),
    (["--activation-offload", "--device", "cpu"], {"activation_offload": True, "device": "cpu"}, "full",
     "activation-offload-needs-gpu", "activation_offload"),
]


@pytest.mark.parametrize("flags, keys, method, rule_id, field", SAME_RULE)
def test_flag_and_key_refusals_come_from_one_rule(tmp_path, flags, keys, method, rule_id, field):
    """The command line (exit 2, worded by flag) and `trainfit train` on a run config (exit 2,
    worded by key) refuse through the same rule of trainfit.core.knob_rules."""
    rule = next(r for r in knob_rules.RULES if r.id == rule_id)
    assert set(rule.fronts) == {"model", "run"}
    code, _, err = run_cli("estimate", "qwen2.5-0.5b", "--hardware", "a100-80gb", "--method", method, *flags)
    cli = [r for r in knob_rules.refusals(_setup_of(flags, method), knob_rules.Context("model")) if r.rule == rule_id]
    assert code == 2 and cli and cli[0].cli_text() in err
    flag = next(k.flag for k in KNOBS if k.name == field or k.field == field)
    assert flag in cli[0].cli_text() or flag in err
    path = tmp_path / "run.yaml"
    import yaml

    path.write_text(yaml.safe_dump(_config(keys, method)))
    code, _, err = run_cli("train", str(path), "--out", str(tmp_path / "out"))
    with pytest.raises(BadInputError) as caught:
        parse_run_config(_config(keys, method))
    cfg_text = next(r for r in _config_refusals(keys, method) if r.rule == rule_id).config_text()
    assert code == 2 and cfg_text in err and cfg_text in caught.value.message
    assert cfg_text.startswith(f"training.{field}: ") and "--" not in cfg_text.split(": ", 1)[1][:40]


def _setup_of(flags: list[str], method: str) -> TrainingSetup:
    """The setup estimate's command line builds (the same path as the command: table -> setup)."""
    import argparse

    from trainfit.cli.cmd_estimate import add_arguments
    from trainfit.cli.knob_flags import knob_values
    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.knob_setup import setup_from_knobs

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["qwen2.5-0.5b", "--method", method, *flags])
    return setup_from_knobs(knob_values(args, "estimate"), resolve_hardware("a100-80gb"))


def _config_refusals(keys: dict, method: str):
    from trainfit.config.run_config import TrainingConfig

    view = dataclasses.replace(TrainingConfig(**keys), method=method)

    class Cfg:  # the parts of a RunConfig the run-only rules read
        distributed = type("D", (), {"strategy": "auto"})()
        schedule = type("S", (), {"max_grad_norm": 1.0})()

    return knob_rules.refusals(view, knob_rules.Context("run", run_config=Cfg()))


def test_run_config_refuses_runtime_knobs_by_key():
    with pytest.raises(BadInputError) as caught:
        parse_run_config(_config({"fsdp_no_sync": True, "transformers_version": "4.44.0"}))
    msg = caught.value.message
    assert "training.fsdp_no_sync: describes how another tool's runtime behaves" in msg
    assert "training.transformers_version:" in msg and "--runtime transformers_version=" in msg


def test_library_estimate_takes_a_setup():
    """estimate() estimates a TrainingSetup as it is; the knob keywords build the same one."""
    from trainfit.cli.cmd_estimate import estimate

    by_knobs, setup, _ = estimate("qwen2.5-0.5b", hardware="rtx-4090", method="lora", micro_batch=2)
    by_setup, same, _ = estimate("qwen2.5-0.5b", hardware="rtx-4090", setup=setup)
    assert same is setup and by_setup.devices == by_knobs.devices
    with pytest.raises(BadInputError, match="not both"):
        estimate("qwen2.5-0.5b", hardware="rtx-4090", setup=setup, micro_batch=2)


def test_schema_is_the_table():
    code, out, _ = run_cli("estimate", "--schema")
    schema = json.loads(out)
    assert code == 0 and schema == json_schema("estimate") and set(schema["properties"]) == {k.name for k in KNOBS}
    assert schema["properties"]["micro_batch"]["minimum"] == 1
    assert schema["properties"]["fsdp_no_sync"] == {**schema["properties"]["fsdp_no_sync"], "type": "boolean"}


def test_readme_knob_table_is_generated_and_command_cells_are_short():
    from trainfit.cli.knob_flags import with_knob_table

    text = README.read_text()
    assert markdown_table("estimate") in text and with_knob_table(text) == text, \
        "regenerate: PYTHONPATH=src python -m trainfit.cli.knob_flags README.md"
    section = text.split("## Commands", 1)[1]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `trainfit ")]
    assert len(rows) >= 8
    for row in rows:
        cells = [c for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert max(len(c) for c in cells) <= 600, row[:80]
