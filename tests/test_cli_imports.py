"""Short commands import only what they use: `trainfit --help` imports no command module, a
command imports its own module only, and none of the quick commands pulls in torch, transformers,
numpy, the HTTP stack, or (when they probe no machine) pynvml. Each case runs in a fresh
interpreter, since sys.modules is what is checked."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from trainfit.cli.main import COMMANDS, named_command

_CHILD = """
import contextlib, io, json, sys
from trainfit.cli.main import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        rc = main(sys.argv[1:])
    except SystemExit as exc:
        rc = exc.code
json.dump({"rc": rc, "out": out.getvalue() + err.getvalue(), "modules": sorted(sys.modules)}, sys.__stdout__)
"""

HEAVY = ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "numpy", "urllib.request",
         "http.client")
CMD_PREFIX = "trainfit.cli.cmd_"


def _run(*argv: str, cache_dir=None) -> dict:
    env = None if cache_dir is None else {**os.environ, "XDG_CACHE_HOME": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    result["modules"] = set(result["modules"])
    return result


def _loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


def test_every_command_help_line_matches_its_module():
    for name, help_line in COMMANDS.items():
        module = importlib.import_module(f"{CMD_PREFIX}{name}")
        assert module.HELP == help_line, f"cli/main.py COMMANDS[{name!r}] differs from cmd_{name}.HELP"
        assert callable(module.add_arguments) and callable(module.run)


def test_named_command():
    assert named_command(["estimate", "gpt2", "--json"]) == "estimate"
    assert named_command(["--version"]) is None
    assert named_command(["-h"]) is None
    assert named_command(["--", "gpus"]) == "gpus"
    assert named_command(["nonsense", "gpus"]) is None
    assert named_command([]) is None


def test_help_imports_no_command_module_and_lists_them_all():
    r = _run("--help")
    assert r["rc"] == 0
    assert not {m for m in r["modules"] if m.startswith(CMD_PREFIX)}
    for heavy in (*HEAVY, "rich", "yaml", "pynvml", "psutil", "trainfit.core"):
        assert not _loaded(r["modules"], heavy), heavy
    text = " ".join(r["out"].split())
    for name, help_line in COMMANDS.items():
        assert f"{name} {help_line.split()[0]}" in text


def test_an_unknown_command_still_lists_the_valid_ones():
    r = _run("bogus")
    assert r["rc"] == 2
    assert "invalid choice: 'bogus'" in r["out"] and all(f"'{n}'" in r["out"] for n in COMMANDS)
    assert not {m for m in r["modules"] if m.startswith(CMD_PREFIX)}


@pytest.mark.parametrize("argv, also_absent", [
    (["gpus"], ["pynvml", "psutil", "trainfit.hardware", "trainfit.core.plan"]),
    (["gpus", "--json"], ["pynvml", "rich", "trainfit.hardware"]),
    (["models", "show", "llama-3.2-1b"], ["pynvml", "psutil", "trainfit.hardware", "trainfit.core.plan"]),
    (["estimate", "llama-3.2-1b", "--hardware", "rtx-4090", "--json"], ["pynvml", "rich"]),
    (["cloud", "llama-3.2-1b", "--examples", "1000", "--seq-len", "512", "--json"], ["pynvml", "rich"]),
])
def test_quick_commands_import_only_what_they_use(tmp_path, argv, also_absent):
    _run(*argv, cache_dir=tmp_path)  # the first run fills the catalog cache
    r = _run(*argv, cache_dir=tmp_path)
    assert r["rc"] in (0, 3), r["out"]  # 3: does not fit, a valid answer
    assert {m for m in r["modules"] if m.startswith(CMD_PREFIX)} == {CMD_PREFIX + argv[0]}
    for name in (*HEAVY, "yaml", *also_absent):  # yaml: the catalogs come from the cache
        assert not _loaded(r["modules"], name), f"{' '.join(argv)} imported {name}"


def test_a_live_estimate_imports_no_http_stack(tmp_path):
    # The first live profile measures the CPU once (numpy, torch) and keeps the rates; from then
    # on a live estimate imports nothing heavy.
    _run("estimate", "llama-3.2-1b", "--json", cache_dir=tmp_path)
    r = _run("estimate", "llama-3.2-1b", "--json", cache_dir=tmp_path)
    assert r["rc"] in (0, 3), r["out"]
    for name in HEAVY:
        assert not _loaded(r["modules"], name), name
