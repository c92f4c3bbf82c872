"""`plan --for TOOL` for Axolotl, LLaMA-Factory, torchtune and LitGPT, each in its own environment:
a LoRA plan (this CPU machine) and a QLoRA plan (an RTX 4090: bitsandbytes 4-bit needs CUDA) of a
tiny random Qwen2 checkpoint (bench/_tiny_checkpoint.py), each exported file loaded by the tool's own
parser (bench/_tool_checks.py) and a two-step run of it started on CPU.

The environments are those `make test-tools` builds (.venv-tools/<tool>: the tool at the release
named there, beside the test environment's torch 2.13.0 CPU). A QLoRA file is run on CPU only where
the tool quantises without bitsandbytes (torchtune: torchao's NF4, with device=cpu given on its
command line); the others are started too and the error they stop with is recorded.

Run:  make test-tools   (builds the environments, runs tests/export/test_tool_exports.py in each and this)
  or  .venv/bin/python bench/tool_exports.py [--venvs .venv-tools] [--no-runs]
Writes bench/results/tool_exports.json and .md (about 6 min on 2 cores with the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from _results import write_results  # noqa: E402
from _tool_checks import FILES  # noqa: E402

TOOLS = ("axolotl", "llama-factory", "torchtune", "litgpt")
CASES = {"lora": ("lora", "cpu"), "qlora": ("qlora", "rtx-4090")}
CPU_QLORA = {"torchtune"}  # quantises with torchao's NF4, which runs on CPU
RUN_TIMEOUT_SECONDS = 600


def tool_env(python: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'bench'}", "DISABLE_VERSION_CHECK": "1",
           "AXOLOTL_DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"  # axolotl/accelerate/tune from that env
    return env


def last_error(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    errors = [x for x in lines if "Error" in x or "error" in x.split(":")[0]]
    return (errors or lines or [""])[-1][:300]


def plan(tool: str, case: str, model: Path, out: Path) -> Path:
    from trainfit.cli.main import main

    method, hardware = CASES[case]
    rc = main(["plan", str(model), "--method", method, "--hardware", hardware, "--mode", "balanced", "--out",
               str(out), "--for", tool, "--no-probe", "--examples", "600"])
    if rc != 0:
        raise SystemExit(f"plan --for {tool} ({case}) exited {rc}")
    return out / "balanced" / FILES[tool]


def parse(tool: str, path: Path, python: Path) -> dict:
    done = subprocess.run([str(python), str(ROOT / "bench" / "_tool_checks.py"), "parse", tool, str(path)],
                          capture_output=True, text=True, env=tool_env(python), timeout=600)
    if done.returncode == 0:
        return {"parsed": True, "parsed_as": json.loads(done.stdout.strip().splitlines()[-1])}
    return {"parsed": False, "why": last_error(done.stderr)}


def short_run(tool: str, case: str, path: Path, python: Path) -> dict:
    from _tool_checks import short_run_command

    device = "cpu" if case == "qlora" and tool in CPU_QLORA else None
    argv = short_run_command(tool, path, str(python), steps=2, device=device)
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=tool_env(python), cwd=path.parent,
                              timeout=RUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return {"started": False, "why": f"no result in {RUN_TIMEOUT_SECONDS} s"}
    seconds = round(time.monotonic() - start, 1)
    note = "device=cpu given on the command line (the file is for the plan's GPU)" if device else ""
    if done.returncode == 0:
        return {"started": True, "steps": 2, "seconds": seconds, "command": " ".join(argv[:4]) + " ...", "note": note}
    return {"started": False, "seconds": seconds, "why": last_error(done.stderr + done.stdout)}


def portable(rows: list[dict], names: dict[str, str]) -> list[dict]:
    """The rows with this machine's folders (environments, the throwaway plans, the checkout) named
    as anyone's checkout would name them."""
    text = json.dumps(rows)
    for path, name in names.items():
        text = text.replace(path, name)
    return json.loads(text)


def markdown(doc: dict) -> str:
    lines = ["# plan --for TOOL: each tool's own parser and a short CPU run", "",
             f"{doc['command']}; {doc['model']}. Versions: "
             + ", ".join(f"{t} {v}" for t, v in doc["versions"].items()) + ".", "",
             "| tool | case | parsed by the tool | short CPU run (2 steps) |", "|---|---|---|---|"]
    for row in doc["rows"]:
        parsed = "yes" if row["parsed"] else f"no: {row.get('why', '')}"
        run = row.get("run", {})
        if not run:
            started = "not tried (--no-runs)"
        elif run["started"]:
            started = f"yes, {run['seconds']} s" + (f" ({run['note']})" if run.get("note") else "")
        else:
            started = f"no: {run['why']}"
        lines.append(f"| {row['tool']} | {row['case']} | {parsed} | {started} |")
    lines += ["", "The QLoRA files are for the plan's RTX 4090 (bitsandbytes 4-bit weights, and there bf16 weights and "
              "flash-attention 2 where the plan chose them): on this CPU machine Axolotl, LLaMA-Factory and LitGPT stop "
              "at the first GPU-only requirement they meet (the error above); torchtune quantises with torchao's NF4, "
              "which runs on CPU, given device=cpu on its command line. A GPU plan's LLaMA-Factory file is parsed by "
              "its HfArgumentParser with TrainingArguments told that bf16 runs (as on the plan's GPU); get_train_args' "
              "own checks ask the machine it runs on. LLaMA-Factory's trainer imports torchaudio at import time and no "
              "torchaudio build exists for torch 2.13.0, so bench/_tool_checks.py starts it with an empty torchaudio "
              "module (no audio is read).", ""]
    return "\n".join(lines)


def versions(venvs: Path) -> dict[str, str]:
    dists = {"axolotl": "axolotl", "llama-factory": "llamafactory", "torchtune": "torchtune", "litgpt": "litgpt"}
    out = {}
    for tool in TOOLS:
        py = venvs / tool / "bin" / "python"
        code = f"import importlib.metadata as m; print(m.version('{dists[tool]}'))"
        done = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
        out[tool] = done.stdout.strip() or "not installed"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venvs", default=str(ROOT / ".venv-tools"), help="folder of the per-tool environments")
    ap.add_argument("--no-runs", action="store_true", help="parse only; start no runs")
    args = ap.parse_args()
    venvs = Path(args.venvs).resolve()  # the runs start in the plan folders
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-qwen2"
        litgpt_py = venvs / "litgpt" / "bin" / "python"
        subprocess.run([str(litgpt_py), str(ROOT / "bench" / "_tiny_checkpoint.py"), str(model)], check=True,
                       env=tool_env(litgpt_py), capture_output=True)
        for tool in TOOLS:
            python = venvs / tool / "bin" / "python"
            for case in CASES:
                path = plan(tool, case, model, Path(tmp) / f"{tool}-{case}")
                row = {"tool": tool, "case": case, **parse(tool, path, python)}
                if not args.no_runs:
                    row["run"] = short_run(tool, case, path, python)
                rows.append(row)
                print(json.dumps(row)[:400], file=sys.stderr)
        rows = portable(rows, {str(venvs): ".venv-tools", tmp: "<temporary folder>", str(ROOT): "."})
    doc = {"command": "python bench/tool_exports.py" + (" --no-runs" if args.no_runs else ""),
           "model": "tiny random Qwen2 (bench/_tiny_checkpoint.py: 2 layers, hidden 128, 384-token BPE)",
           "versions": versions(venvs), "rows": rows}
    write_results(ROOT / "bench" / "results", "tool_exports", doc, markdown(doc))


if __name__ == "__main__":
    main()
