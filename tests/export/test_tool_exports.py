"""`plan --for TOOL`: each tool's config is written from the plan (the plan's numbers under the tool's
own keys, a header naming the plan and the defaults the tool would choose differently), loads in
that tool's own parser where the tool is installed (`make test-tools` builds an environment per
tool; the default suite skips those with the reason), and a method a tool lacks exits 2 with
nothing written. The short CPU runs are @slow here and in bench/tool_exports.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainfit.cli.main import main

from .conftest import make_cfg

TOOLS = ("axolotl", "llama-factory", "torchtune", "litgpt")
CASES = {"lora": ("lora", "cpu"), "qlora": ("qlora", "rtx-4090")}  # QLoRA plans need CUDA (bitsandbytes)
PLANS = {**CASES, "dpo": ("dpo", "cpu")}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    pytest.importorskip("transformers", reason="the tiny checkpoint is built with transformers")
    import _tiny_checkpoint

    return _tiny_checkpoint.build(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="module")
def exports(tiny_model, tmp_path_factory):
    """(tool, case) -> the balanced mode's folder, planned once per module through the CLI."""
    done: dict[tuple[str, str], Path] = {}

    def get(tool: str, case: str) -> Path:
        if (tool, case) not in done:
            method, hardware = PLANS[case]
            out = tmp_path_factory.mktemp(f"{tool}-{case}")
            rc = main(["plan", str(tiny_model), "--method", method, "--hardware", hardware, "--mode", "balanced",
                       "--out", str(out / "plan"), "--for", tool, "--no-probe", "--examples", "600"])
            assert rc == 0
            done[(tool, case)] = out / "plan" / "balanced"
        return done[(tool, case)]

    return get


def _load(folder: Path, name: str) -> dict:
    return yaml.safe_load((folder / name).read_text())


FILES = {"axolotl": "axolotl.yaml", "llama-factory": "llamafactory.yaml", "torchtune": "torchtune.yaml",
         "litgpt": "litgpt.yaml"}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tool", TOOLS)
def test_each_tool_gets_the_plans_numbers_under_its_own_keys(tool, case, exports):
    folder = exports(tool, case)
    run = _load(folder, "run.yaml")
    t, s = run["training"], run["schedule"]
    text = (folder / FILES[tool]).read_text()
    assert "plan, mode balanced" in text and "# reproduce: trainfit plan" in text and f"--for {tool}" in text
    assert f"Where {tool}'s own defaults differ" in text
    doc = yaml.safe_load(text)
    lora, qlora = t["lora"], case == "qlora"
    if tool == "axolotl":
        assert (doc["micro_batch_size"], doc["gradient_accumulation_steps"], doc["sequence_len"]) == \
            (t["micro_batch"], t["grad_accum"], t["seq_len"])
        assert doc["adapter"] == case and doc.get("load_in_4bit", False) is qlora
        assert (doc["lora_r"], doc["lora_alpha"], doc["lora_target_modules"]) == \
            (lora["rank"], lora["alpha"], lora["target_modules"])
        assert doc["learning_rate"] == s["lr"] and doc["bf16"] is (t["precision"] in ("bf16", "bf16-mixed"))
    elif tool == "llama-factory":
        assert (doc["per_device_train_batch_size"], doc["gradient_accumulation_steps"], doc["cutoff_len"]) == \
            (t["micro_batch"], t["grad_accum"], t["seq_len"])
        assert doc["finetuning_type"] == "lora" and doc.get("quantization_bit") == (4 if qlora else None)
        assert doc["lora_target"].split(",") == lora["target_modules"]
        info = yaml.safe_load((folder / "dataset_info.json").read_text())
        assert Path(info[doc["dataset"]]["file_name"]).is_file() and doc["dataset_dir"] == str(folder.resolve())
    elif tool == "torchtune":
        m = doc["model"]
        assert (doc["batch_size"], doc["gradient_accumulation_steps"], doc["tokenizer"]["max_seq_len"]) == \
            (t["micro_batch"], t["grad_accum"], t["seq_len"])
        assert m["lora_attn_modules"] == ["q_proj", "k_proj", "v_proj", "output_proj"] and m["apply_lora_to_mlp"]
        assert m["quantize_base"] is qlora and m["lora_rank"] == lora["rank"]
        assert doc["device"] == ("cuda" if qlora else "cpu") and doc["checkpointer"]["checkpoint_files"] == \
            ["model.safetensors"]
    else:
        tr = doc["train"]
        assert (tr["micro_batch_size"], tr["global_batch_size"], tr["max_seq_length"]) == \
            (t["micro_batch"], t["micro_batch"] * t["grad_accum"] * t["num_gpus"], t["seq_len"])
        assert doc.get("quantize") == ({"nf4": "bnb.nf4", "nf4-dq": "bnb.nf4-dq"}[t["quant"]] if qlora else None)
        assert all(doc[k] for k in ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp"))
        assert doc["lora_head"] is False and doc["lora_r"] == lora["rank"]
        rows = yaml.safe_load((folder / "litgpt_data.json").read_text())
        assert rows[0].keys() == {"instruction", "input", "output"} and len(rows) > 100


@pytest.mark.parametrize("tool,method,why", [
    ("litgpt", "dpo", "no preference-tuning"), ("torchtune", "dpo", "chosen/rejected conversations"),
    ("axolotl", "pretrain", "pretraining plan"), ("bogus", "lora", "is not one of trl, axolotl")])
def test_a_method_the_tool_lacks_exits_2_with_nothing_written(tool, method, why, tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["plan", "Qwen/Qwen2.5-0.5B" if method != "pretrain" else "shape:1m", "--method", method,
            "--hardware", "rtx-4090", "--out", str(out), "--for", tool, "--no-probe"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert not out.exists()


def test_for_trl_writes_todays_files_unchanged(tmp_path):
    argv = ["plan", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--hardware", "a10g", "--mode", "balanced",
            "--no-probe"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert main([*argv, "--out", str(tmp_path / "b"), "--for", "trl"]) == 0
    a, b = tmp_path / "a" / "balanced", tmp_path / "b" / "balanced"
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())

    def same(text: str, folder: Path) -> str:  # the reproduce line and the folder name differ, nothing else
        return "\n".join(x for x in text.replace(str(folder), "OUT").splitlines() if "reproduce:" not in x)

    for f in a.iterdir():
        assert same(f.read_text(), tmp_path / "a") == same((b / f.name).read_text(), tmp_path / "b"), f.name


def test_hub_model_plans_name_the_download_step(tmp_path):
    assert main(["plan", "Qwen/Qwen2.5-0.5B", "--method", "qlora", "--hardware", "rtx-4090", "--mode", "balanced",
                 "--out", str(tmp_path), "--for", "torchtune", "--no-probe"]) == 0
    text = (tmp_path / "balanced" / "torchtune.yaml").read_text()
    doc = yaml.safe_load(text)
    assert doc["model"]["_component_"] == "torchtune.models.qwen2.lora_qwen2" and doc["model"]["quantize_base"]
    assert doc["tokenizer"]["_component_"] == "torchtune.models.qwen2_5.qwen2_5_tokenizer"
    assert "tune download Qwen/Qwen2.5-0.5B" in text and doc["model"]["tie_word_embeddings"] is True


# ---- the tools' own parsers (run where the tool is installed: make test-tools) ----------------------

def _checks():
    import _tool_checks

    return _tool_checks


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("tool", TOOLS)
def test_the_tools_own_parser_loads_the_file(tool, case, exports):
    checks = _checks()
    if importlib.util.find_spec(checks.IMPORTS[tool].split(".")[0]) is None:
        pytest.skip(f"{tool} is not installed in this environment (make test-tools installs it in its own)")
    folder = exports(tool, case)
    parsed = checks.PARSERS[tool](folder / FILES[tool])
    t = _load(folder, "run.yaml")["training"]
    if tool == "axolotl":
        assert parsed["adapter"] == case and parsed["micro_batch_size"] == t["micro_batch"]
    elif tool == "llama-factory":
        assert parsed["finetuning_type"] == "lora" and parsed["quantization_bit"] == (4 if case == "qlora" else None)
        assert parsed["lora_target"] == t["lora"]["target_modules"]
    elif tool == "torchtune":
        assert parsed["rows"] > 10 and parsed["batch_size"] == t["micro_batch"]
    else:
        assert parsed["command"] == "finetune_lora" and parsed["data"] == "JSON" and parsed["lora_r"] == t["lora"]["rank"]


@pytest.mark.parametrize("tool", ["axolotl", "llama-factory"])
def test_the_tools_own_parser_loads_a_dpo_plan(tool, exports):
    checks = _checks()
    if importlib.util.find_spec(checks.IMPORTS[tool].split(".")[0]) is None:
        pytest.skip(f"{tool} is not installed in this environment (make test-tools installs it in its own)")
    folder = exports(tool, "dpo")
    parsed = checks.PARSERS[tool](folder / FILES[tool])
    doc = _load(folder, FILES[tool])
    if tool == "axolotl":
        assert doc["rl"] == "dpo" and doc["datasets"][0]["type"] == "chatml.prompt_pairs"
        assert parsed["micro_batch_size"] == _load(folder, "run.yaml")["training"]["micro_batch"]
    else:
        from trainfit.config.run_config import TrainingConfig

        beta = _load(folder, "run.yaml")["training"].get("dpo_beta", TrainingConfig.dpo_beta)
        assert parsed["stage"] == "dpo" and doc["pref_beta"] == beta


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["axolotl", "torchtune", "litgpt", "llama-factory"])
def test_a_short_cpu_run_of_the_lora_file_starts(tool, exports):
    checks = _checks()
    if importlib.util.find_spec(checks.IMPORTS[tool].split(".")[0]) is None:
        pytest.skip(f"{tool} is not installed in this environment (make test-tools installs it in its own)")
    folder = exports(tool, "lora")
    argv = checks.short_run_command(tool, folder / FILES[tool], sys.executable, steps=2)
    env = {**os.environ, "AXOLOTL_DO_NOT_TRACK": "1", "DISABLE_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=folder, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_pipeline_plan_is_not_written_for_another_tool(tmp_path, capsys):
    assert main(["plan", "Qwen/Qwen2.5-0.5B", "--pipeline", "sft+dpo", "--hardware", "rtx-4090", "--for", "axolotl",
                 "--out", str(tmp_path / "plan"), "--no-probe"]) == 2
    assert "--pipeline plan is written for trainfit's own run" in capsys.readouterr().err
    assert not (tmp_path / "plan").exists()


def _lora_plan(targets, tmp_path):
    from trainfit.core.models.catalog import resolve_model
    from trainfit.export.tools import ToolPlan

    cfg = make_cfg("lora", model={"id": "Qwen/Qwen2.5-0.5B", "weights": "hub", "shape": None},
                   training={"lora": {"rank": 8, "alpha": 16, "target_modules": targets}})
    return ToolPlan(cfg=cfg, spec=resolve_model("Qwen/Qwen2.5-0.5B"), folder=tmp_path, header_lines=["test"])


@pytest.mark.parametrize("targets,torchtune,litgpt", [
    (["q_proj", "v_proj"], (["q_proj", "v_proj"], False, False), {"lora_query", "lora_value"}),
    (["all-linear"], (["q_proj", "k_proj", "v_proj", "output_proj"], True, False),
     {"lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp"}),
    (["o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"], (["output_proj"], True, True),
     {"lora_projection", "lora_mlp", "lora_head"}),
])
def test_lora_targets_map_to_torchtune_and_litgpt_keys(targets, torchtune, litgpt, tmp_path):
    from trainfit.export import litgpt_config
    from trainfit.export import torchtune as tt

    plan = _lora_plan(targets, tmp_path)
    keys = tt.lora_keys(plan)
    assert (keys["lora_attn_modules"], keys["apply_lora_to_mlp"], keys["apply_lora_to_output"]) == torchtune
    assert {k for k, on in litgpt_config.lora_switches(plan).items() if on} == litgpt


def test_a_target_torchtune_cannot_express_is_refused(tmp_path):
    from trainfit.errors import BadInputError
    from trainfit.export import torchtune as tt

    with pytest.raises(BadInputError, match="whole MLP or none"):
        tt.lora_keys(_lora_plan(["q_proj", "up_proj"], tmp_path))


def _plan_json(capsys, *extra) -> dict:
    import json

    code = main(["plan", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--method", "lora", "--examples", "1000",
                 "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_for_a_tool_plans_its_memory_and_time_with_its_framework(tmp_path, capsys):
    own = _plan_json(capsys)
    litgpt = _plan_json(capsys, "--for", "litgpt", "--out", str(tmp_path / "out"))
    assert own["framework"]["name"] == "trainfit" and litgpt["framework"]["name"] == "litgpt"
    # LitGPT's loop and model code keep other tensors than trainfit's run: the modes' figures differ
    assert [m["memory_used_bytes"] for m in own["modes"]] != [m["memory_used_bytes"] for m in litgpt["modes"]]
    release = _plan_json(capsys, "--for", "litgpt", "--framework", "litgpt@0.5", "--out", str(tmp_path / "o2"))
    assert release["framework"]["name"] == "litgpt"


def test_for_and_framework_naming_two_tools_is_refused(tmp_path, capsys):
    code = main(["plan", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--method", "lora", "--for", "litgpt",
                 "--framework", "axolotl", "--out", str(tmp_path / "out")])
    assert code == 2
    assert "--framework axolotl describes another tool than --for litgpt" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
