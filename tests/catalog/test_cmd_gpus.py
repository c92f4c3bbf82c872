"""`trainfit gpus` through the real entry point: stdout, stderr and exit code."""

from __future__ import annotations

import json
import subprocess
import sys

from trainfit.cli.cmd_gpus import list_gpus
from trainfit.core.machines.gpu_catalog import all_gpus


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainfit", "gpus", *args],
                          capture_output=True, text=True, timeout=60)


def test_table_lists_the_catalog_in_gib():
    out = _run()
    assert out.returncode == 0 and out.stderr == ""
    assert "rtx-4090" in out.stdout and "mi300x" in out.stdout and "m2-16gb" in out.stdout
    assert "GiB" in out.stdout and "dense" in out.stdout
    row = next(line for line in out.stdout.splitlines() if " h100-sxm " in line)
    assert " 80 " in row and "3,350" in row and "989" in row and "700" in row


def test_json_is_one_document_filtered_and_sorted():
    out = _run("--json", "--vendor", "amd", "--sort", "vram")
    assert out.returncode == 0 and out.stderr == ""
    doc = json.loads(out.stdout)
    ids = [g["id"] for g in doc["gpus"]]
    assert doc["count"] == len(ids) and ids[0] == "mi325x"
    assert all(g["vendor"] == "amd" for g in doc["gpus"])
    vram = [g["vram_bytes"] for g in doc["gpus"]]
    assert vram == sorted(vram, reverse=True)
    assert doc["gpus"][0]["sources"]["vram_gib"].startswith("https://")


def test_bad_flags_exit_2_with_the_choices():
    out = _run("--vendor", "matrox")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--vendor" in out.stderr and "nvidia" in out.stderr and out.stdout == ""
    out = _run("--sort", "price")
    assert out.returncode == 2 and "bandwidth" in out.stderr


def test_function_twin_matches_the_catalog():
    assert len(list_gpus()) == len(all_gpus())
    by_bf16 = list_gpus(sort="bf16")
    assert by_bf16[0].id == "b200"
    assert {g.vendor for g in list_gpus(vendor="apple")} == {"apple"}
