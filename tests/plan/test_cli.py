"""`trainfit plan` / `analyze` as a user runs them: exit codes, messages, files, and the exported
run config trained for real by `trainfit train`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def trainfit(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("args, needle", [
    (["qwen2.5-0.5b", "--method", "magic"], "--method"),
    (["qwen2.5-0.5b", "--mode", "insane"], "--mode"),
    (["qwen2.5-0.5b", "--time-budget", "-2h"], "--time-budget"),
    (["qwen2.5-0.5b", "--time-budget", "soon"], "--time-budget"),
    (["qwen2.5-0.5b", "--target-batch", "0"], "--target-batch"),
    (["qwen2.5-0.5b", "--memory-budget", "lots"], "--memory-budget"),
    (["qwen2.5-0.5b", "--hardware", ""], "--hardware"),
    (["--method", "lora"], "MODEL missing"),
])
def test_bad_input_exits_2(args, needle):
    extra = [] if "--hardware" in args else ["--hardware", "t4"]
    r = trainfit("plan", *args, *extra)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_out_that_is_a_file_and_existing_files_need_force(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("mine")
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "t4", "--out", str(afile))
    assert r.returncode == 2 and "is a file" in r.stderr and afile.read_text() == "mine"
    out = tmp_path / "cfg"
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "t4", "--mode", "balanced", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run = out / "balanced" / "run.yaml"
    run.write_text("# edited by the user\n")
    before = sorted(p.name for p in out.rglob("*"))
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "t4", "--mode", "balanced", "--out", str(out))
    assert r.returncode == 2 and "--force" in r.stderr
    assert run.read_text() == "# edited by the user\n" and sorted(p.name for p in out.rglob("*")) == before
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "t4", "--mode", "balanced", "--out", str(out), "--force")
    assert r.returncode == 0 and "trainfit plan" in run.read_text()


def test_json_has_every_mode_with_setup_estimate_reasons_and_files(tmp_path):
    r = trainfit("plan", "Qwen/Qwen2-VL-2B-Instruct", "--method", "full", "--hardware", "2x rtx-4090",
                 "--seq-len", "1024", "--examples", "1000", "--json", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [m["mode"] for m in doc["modes"]] == ["conservative", "balanced", "extreme"]
    for m in doc["modes"]:
        assert m["setup"]["method"] == "full" and m["reasons"] and m["memory"]["devices"]
        assert m["speed"]["tokens_per_second"] > 0 and m["run"]["hours"] > 0 and m["power"]["total_watts"] > 0
        names = {Path(f).name for f in m["files"]}
        assert {"run.yaml", "training_args.yaml", "accelerate.yaml", "launch.sh"} <= names
        if m["setup"]["zero_stage"]:
            assert "deepspeed.json" in names
            ds = json.loads((tmp_path / "o" / m["mode"] / "deepspeed.json").read_text())
            assert ds["zero_optimization"]["stage"] == m["setup"]["zero_stage"]
            assert ds["train_micro_batch_size_per_gpu"] == "auto"
        acc = yaml.safe_load((tmp_path / "o" / m["mode"] / "accelerate.yaml").read_text())
        assert acc["num_processes"] == 2


def test_exported_files_load_in_their_libraries(tmp_path):
    pytest.importorskip("trl")
    from accelerate.commands.config.config_args import load_config_from_file
    from peft import LoraConfig
    from trl import SFTConfig

    out = tmp_path / "o"
    r = trainfit("plan", "qwen2.5-0.5b", "--method", "lora", "--hardware", "t4", "--mode", "balanced",
                 "--seq-len", "512", "--out", str(out))
    assert r.returncode == 0, r.stderr
    d = out / "balanced"
    args = yaml.safe_load((d / "training_args.yaml").read_text())
    args["fp16"] = False  # constructing on a CPU-only machine: fp16 AMP needs a GPU
    args["use_cpu"] = True
    cfg = SFTConfig(**args)
    assert cfg.per_device_train_batch_size >= 1 and cfg.max_length == 512
    lora = LoraConfig(**yaml.safe_load((d / "lora.yaml").read_text()))
    assert lora.r == 16
    acc = load_config_from_file(str(d / "accelerate.yaml"))
    assert acc.num_processes == 1
    from trainfit.config.run_config import load_run_config

    rc = load_run_config(d / "run.yaml")
    assert rc.model.weights == "hub" and rc.training.lora.rank == 16


@pytest.mark.slow
def test_trainfit_train_runs_the_exported_cpu_plan(tmp_path):
    """The CPU scenario end to end: plan pretraining here, write the files, train the run config."""
    out = tmp_path / "o"
    r = trainfit("plan", "--method", "pretrain", "--hardware", "cpu", "--mode", "conservative", "--vocab", "512",
                 "--seq-len", "128", "--target-batch", "4", "--time-budget", "5m", "--out", str(out))
    assert r.returncode == 0, r.stderr
    run_yaml = out / "conservative" / "run.yaml"
    raw = yaml.safe_load(run_yaml.read_text())
    assert raw["method"] == "pretrain" and raw["model"]["weights"] == "random"
    launch = (out / "conservative" / "launch.sh").read_text()
    assert "trainfit train run.yaml" in launch
    r = trainfit("train", str(run_yaml), "--out", str(tmp_path / "run"), "--max-steps", "2", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["global_step"] == 2 and summary["global_batch"] == raw["training"]["micro_batch"] * raw["training"]["grad_accum"]


def test_analyze_shows_three_configurations_for_catalog_hardware():
    r = trainfit("analyze", "--hardware", "rtx-4090")
    assert r.returncode == 0, r.stderr
    for text in ("RECOMMENDED CONFIGURATIONS", "CONSERVATIVE", "BALANCED", "EXTREME", "tokens/s", "run time"):
        assert text in r.stdout
    assert "--benchmark" not in r.stdout  # no "measure it" advice for hardware we do not own


def test_analyze_generate_configs_and_json(tmp_path):
    r = trainfit("analyze", "--hardware", "cpu", "--generate-configs", str(tmp_path / "g"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["plan"]["modes"]) == 3
    assert (tmp_path / "g" / "balanced" / "run.yaml").is_file()


def test_budget_prices_the_run_from_the_cloud_catalog():
    r = trainfit("plan", "qwen2.5-7b", "--method", "lora", "--hardware", "a100-80gb", "--examples", "50000",
                 "--seq-len", "2048", "--budget", "1", "--mode", "balanced", "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)["modes"][0]
    assert m["run"]["rental_usd"] > 1 and any("over the $1 budget" in w for w in m["warnings"])
    r = trainfit("plan", "qwen2.5-7b", "--hardware", "rtx-3060", "--budget", "5")
    assert r.returncode == 2 and "--usd-per-hour" in r.stderr


def test_qlora_where_bitsandbytes_cannot_run_is_unavailable():
    r = trainfit("plan", "qwen2.5-0.5b", "--method", "qlora", "--hardware", "m2-16gb")
    assert r.returncode == 4 and "bitsandbytes" in r.stderr and "--method lora" in r.stderr
