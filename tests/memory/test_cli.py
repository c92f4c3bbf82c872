"""`trainfit estimate` through the real entry point: JSON, exit codes, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", "estimate", *args], capture_output=True, text=True,
                          timeout=60)


def test_json_fits_and_exit_codes():
    ok = _run("Qwen/Qwen2.5-0.5B", "--method", "lora", "--hardware", "rtx-4090", "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["fits"] is True and doc["devices"][0]["total_bytes"] > doc["devices"][0]["tensor_peak_bytes"]
    assert {"weights", "activations", "logits", "cuda_context"} <= {c["name"] for c in doc["devices"][0]["components"]}
    big = _run("Qwen/Qwen2.5-7B", "--method", "full", "--hardware", "t4", "--json")
    assert big.returncode == 3
    doc = json.loads(big.stdout)
    assert doc["fits"] is False and doc["nearest_fitting"]["changes"]


def test_human_table_and_shapes():
    out = _run("--params", "125m", "--hardware", "cpu", "--device", "cpu", "--micro-batch", "2")
    assert out.returncode in (0, 3), out.stderr
    assert "GiB" in out.stdout and "tensor peak" in out.stdout
    dims = _run("--layers", "2", "--hidden", "128", "--heads", "4", "--hardware", "cpu", "--json")
    assert dims.returncode == 0, dims.stderr


@pytest.mark.parametrize("args, needle", [
    (["no-such-model-xyz"], "unknown model"),
    (["Qwen/Qwen2.5-0.5B", "--method", "lora", "--lora-targets", "c_attn"], "q_proj"),
    (["Qwen/Qwen2.5-0.5B", "--zero", "3", "--gpus", "1"], "--zero 3"),
    (["Qwen/Qwen2.5-0.5B", "--micro-batch", "-1"], "--micro-batch"),
    (["Qwen/Qwen2.5-0.5B", "--seq-len", "100000000000"], "--seq-len"),
    (["Qwen/Qwen2.5-0.5B", "--method", "bogus"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    out = _run(*args, "--hardware", "a100-80gb")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_malformed_config_json(tmp_path: Path):
    cfg = tmp_path / "config.json"
    cfg.write_text("{not json")
    out = _run(str(cfg), "--hardware", "t4")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "config.json" in out.stderr


def test_python_twin_matches_cli():
    from trainfit.cli.cmd_estimate import estimate

    result, setup, suggestion = estimate("Qwen/Qwen2.5-0.5B", hardware="rtx-4090", method="lora")
    cli = json.loads(_run("Qwen/Qwen2.5-0.5B", "--method", "lora", "--hardware", "rtx-4090", "--json").stdout)
    assert cli["devices"][0]["total_bytes"] == result.devices[0].total_bytes
    assert suggestion is None and setup.method == "lora"
