"""`trainfit models` through the real entry point."""

import json
import subprocess
import sys

import pytest


def _run(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", "models", *args], capture_output=True, text=True,
                          timeout=120)


def test_list_json():
    r = _run("--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["count"] >= 40
    gpt2 = next(m for m in doc["models"] if m["id"] == "openai-community/gpt2")
    assert gpt2["params"] == 124_439_808 and gpt2["layers"] == 12


def test_list_family_table():
    r = _run("--family", "pythia")
    assert r.returncode == 0 and "EleutherAI/pythia-12b" in r.stdout and "Qwen" not in r.stdout


def test_show_json_with_breakdown_and_layers():
    r = _run("show", "mixtral-8x7b", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["params"]["total"] == 46_702_792_704
    assert {"q_proj", "w1", "w2", "w3", "gate"} <= set(doc["lora_target_modules"])


def test_show_table_for_a_shape():
    r = _run("show", "shape:125m")
    assert r.returncode == 0 and "total" in r.stdout and "q_proj" in r.stdout


@pytest.mark.parametrize("args,needle", [(("show", "qwen2.5-7bb"), "qwen2.5-7b"),
                                         (("--family", "nope"), "pythia"),
                                         (("list", "extra"), "models show REF")])
def test_bad_input_exit_2_one_line(args, needle):
    r = _run(*args)
    assert r.returncode == 2 and needle in r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
