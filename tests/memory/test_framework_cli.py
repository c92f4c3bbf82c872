"""`--framework NAME[@VERSION]` through the real entry point: estimate, plan and cloud state the framework
the figures are for and what each of its behaviours adds; bad names exit 2 with one line; a run config's
`framework:` key is checked by the same resolver, and train / verify refuse another tool's name."""

from __future__ import annotations

import json

import pytest
import yaml

from trainfit.cli.main import main

QLORA_8B = ["estimate", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--hardware", "rtx-4090"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_estimate_states_the_framework_and_what_each_behaviour_adds(capsys):
    assert main([*QLORA_8B, "--framework", "trl@0.12"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "figures for: TRL (SFTTrainer / DPOTrainer on the HF Trainer), 0.12 (on" in out
    assert "transformers 4.46.3" in out
    # "+2.71 GiB: trl 0.12 upcasts the quantised base's embeddings, norms and lm_head to fp32 ..."
    assert "GiB: trl 0.12 upcasts the quantised base's embeddings, norms and lm_head to fp32" in out
    assert "GiB: transformers 4.46.3 copies the shifted fp32 logits" in out

    assert main([*QLORA_8B, "--framework", "trl@0.12", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    fw = doc["framework"]
    assert (fw["name"], fw["release"], fw["own_run"]) == ("trl", "0.12", False)
    changes = {c["knob"]: c for c in fw["changes"]}
    assert changes["kbit_upcast"]["from"] is False and changes["kbit_upcast"]["to"] is True
    assert 1.9 * 2**30 < changes["kbit_upcast"]["needed_bytes"] < 4 * 2**30
    assert doc["setup"]["kbit_upcast"] is True


def test_no_flag_is_trainfit_own_run_and_otherwise_unchanged(capsys):
    assert main([*QLORA_8B, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["framework"]["own_run"] is True and plain["framework"]["changes"] == []
    assert main([*QLORA_8B, "--json", "--framework", "trainfit"]) == 0
    named = json.loads(capsys.readouterr().out)
    plain.pop("framework"), named.pop("framework")
    assert named == plain  # naming trainfit changes no figure
    assert main(QLORA_8B) == 0
    assert "figures for: trainfit's own run" in capsys.readouterr().out


@pytest.mark.parametrize("value, needle", [("nope", "is not a known framework (valid:"),
                                           ("trl@x", "known trl releases: 0.8.6"),
                                           ("transformers<1", "no described release satisfies <1")])
def test_bad_framework_exits_2_with_one_line(capsys, value, needle):
    assert main([*QLORA_8B, "--framework", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainfit: error: --framework: ") and needle in err and "Traceback" not in err


def test_plan_computes_every_mode_for_the_framework(capsys):
    argv = ["plan", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--hardware", "rtx-4090", "--no-probe",
            "--mode", "balanced", "--json"]
    assert main([*argv, "--framework", "trl@0.12"]) == 0
    doc = json.loads(capsys.readouterr().out)
    mode = next(m for m in doc["modes"] if m["mode"] == "balanced")
    assert mode["setup"]["kbit_upcast"] is True  # the memory and time searched are TRL's
    changes = {c["knob"]: c for c in doc["framework"]["modes"]["balanced"]}
    assert changes["kbit_upcast"]["needed_bytes"] > 0 and changes["kbit_upcast"]["step_seconds"] > 0
    assert main(argv) == 0
    own = json.loads(capsys.readouterr().out)
    own_mode = next(m for m in own["modes"] if m["mode"] == "balanced")
    assert own_mode["setup"]["kbit_upcast"] is False and own["framework"]["own_run"] is True


def test_cloud_ranks_the_frameworks_settings_and_measures_its_behaviours(capsys):
    argv = ["cloud", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--dataset-tokens", "1000000", "--top", "2"]
    assert main([*argv, "--framework", "trl@0.12", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    fw = doc["framework"]
    assert fw["name"] == "trl" and fw["versions"]["transformers"] == "4.46.3" and fw["flavor"] == doc["cheapest"]
    changes = {c["knob"]: c for c in fw["changes"]}
    assert changes["kbit_upcast"]["needed_bytes"] > 2**30  # measured on the cheapest flavor's setting
    assert main(argv) == 0
    assert "figures for: trainfit's own run" in capsys.readouterr().out
    assert main([*argv, "--framework", "nope"]) == 2


def _config(tmp_path, framework) -> str:
    cfg = {"version": 1, "method": "full", "model": {"shape": {"params": "8m"}},
           "data": {"paths": ["builtin:tiny-corpus"]}, "schedule": {"max_steps": 1}}
    if framework is not None:
        cfg["framework"] = framework
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_run_config_framework_key(tmp_path, capsys):
    from trainfit.errors import BadInputError
    from trainfit.config.run_config import load_run_config

    assert load_run_config(_config(tmp_path, "trl@0.12")).framework == "trl@0.12"
    a, b = load_run_config(_config(tmp_path, "trainfit")), load_run_config(_config(tmp_path, None))
    assert a.config_hash() == b.config_hash()  # naming the tool does not change trainfit's run
    with pytest.raises(BadInputError, match="framework: 'nope' is not a known framework"):
        load_run_config(_config(tmp_path, "nope"))
    # train and verify run trainfit's own loop: another tool's name is refused with the reason
    assert main(["train", _config(tmp_path, "trl@0.12"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "trainfit train runs trainfit's own training loop, not TRL" in err
    assert not (tmp_path / "out").exists()
    assert main(["verify", _config(tmp_path, None), "--framework", "axolotl", "--no-save"]) == 2
    assert "--framework axolotl: trainfit verify runs trainfit's own training loop" in capsys.readouterr().err
