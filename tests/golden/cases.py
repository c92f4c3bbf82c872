"""The golden set: estimate / plan / cloud / analyze command lines across architectures, methods and
machines, whose whole JSON output (and exit code) tests/golden/data/outputs.json.gz records. A
refactor must leave every byte of every output as recorded.

Every case names its hardware (a catalog GPU, a cloud flavor or a saved profile), so no output
depends on the machine the test runs on, and the plan's on-machine probe is off.

Record again (only when an output is meant to change, and say why in the commit):
    PYTHONPATH=src python tests/golden/cases.py
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRAINFIT_NO_PROBE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(__file__).parent / "data"
OUTPUTS = DATA / "outputs.json.gz"

L8 = "meta-llama/Meta-Llama-3-8B"
L70 = "meta-llama/Meta-Llama-3-70B"
Q05 = "Qwen/Qwen2.5-0.5B"
Q7 = "Qwen/Qwen2.5-7B-Instruct"
MISTRAL = "mistralai/Mistral-7B-v0.3"
MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"
GEMMA2 = "google/gemma-2-9b"
PHI3 = "microsoft/Phi-3-mini-4k-instruct"
QWEN3 = "Qwen/Qwen3-1.7B"
QWEN3_MOE = "Qwen/Qwen3-30B-A3B"
VL = "Qwen/Qwen2-VL-2B-Instruct"

_ESTIMATES: dict[str, list[str]] = {
    # architectures, full fine-tuning and the usual methods
    "llama8b-full-a100": [L8, "--hardware", "a100-80gb", "--optimizer", "adamw-8bit", "--grad-checkpointing", "full"],
    "llama8b-lora-4090": [L8, "--hardware", "rtx-4090", "--method", "lora", "--seq-len", "1024"],
    "llama8b-qlora-t4": [L8, "--hardware", "t4", "--method", "qlora", "--examples", "5000"],
    "llama8b-dpo-lora-h100": [L8, "--hardware", "h100-sxm", "--method", "dpo", "--lora-r", "16"],
    "llama70b-zero3-8h100": [L70, "--hardware", "8x h100-sxm", "--zero", "3", "--grad-checkpointing", "full"],
    "llama70b-qlora-fsdp-2x4090": [L70, "--hardware", "2x rtx-4090", "--method", "qlora", "--fsdp", "full-shard", "--seq-len", "1024"],
    "qwen05-full-cpu": [Q05, "--hardware", "cpu", "--seq-len", "512"],
    "qwen7-lora-a10g": [Q7, "--hardware", "a10g", "--method", "lora", "--seq-len", "2048", "--micro-batch", "2"],
    "qwen7-inference-nf4": [Q7, "--hardware", "a10g", "--method", "inference", "--quant", "nf4", "--generate", "256"],
    "mistral-lora-3090": [MISTRAL, "--hardware", "rtx-3090", "--method", "lora", "--grad-checkpointing", "full"],
    "mixtral-qlora-a100": [MIXTRAL, "--hardware", "a100-80gb", "--method", "qlora"],
    "gemma2-lora-l4": [GEMMA2, "--hardware", "l4", "--method", "lora", "--seq-len", "1024"],
    "gemma2-eager-full-h100": [GEMMA2, "--hardware", "h100-sxm", "--attn", "eager", "--grad-checkpointing", "full"],
    "phi3-full-4090": [PHI3, "--hardware", "rtx-4090", "--precision", "bf16", "--optimizer", "adamw-8bit"],
    "phi2-lora-3060": ["microsoft/phi-2", "--hardware", "rtx-3060", "--method", "lora"],
    "qwen3-full-a10g": [QWEN3, "--hardware", "a10g", "--grad-checkpointing", "full", "--optimizer", "adamw-8bit"],
    "qwen3moe-lora-h100": [QWEN3_MOE, "--hardware", "h100-sxm", "--method", "lora", "--lora-targets", "all-linear"],
    "qwen2moe-lora-a100": ["Qwen/Qwen1.5-MoE-A2.7B", "--hardware", "a100-80gb", "--method", "lora"],
    "olmo2-full-zero2-4a100": ["allenai/OLMo-2-1124-7B", "--hardware", "4x a100-80gb", "--zero", "2"],
    "gemma3-lora-t4": ["google/gemma-3-1b-it", "--hardware", "t4", "--method", "lora"],
    "smollm3-qlora-3060": ["HuggingFaceTB/SmolLM3-3B", "--hardware", "rtx-3060", "--method", "qlora"],
    "gpt2-full-cpu": ["openai-community/gpt2", "--hardware", "cpu", "--seq-len", "256", "--micro-batch", "4"],
    "pythia-full-t4": ["EleutherAI/pythia-410m", "--hardware", "t4"],
    "falcon-lora-a100": ["tiiuae/falcon-7b", "--hardware", "a100-80gb", "--method", "lora"],
    "bigcode-qlora-t4": ["bigcode/gpt_bigcode-santacoder", "--hardware", "t4", "--method", "qlora"],
    "bloom-full-cpu": ["bigscience/bloom-560m", "--hardware", "cpu", "--seq-len", "256"],
    "qwen1-lora-a10g": ["Qwen/Qwen-7B", "--hardware", "a10g", "--method", "lora"],
    "t5-full-t4": ["google-t5/t5-small", "--hardware", "t4"],
    "bert-full-cpu": ["google-bert/bert-base-uncased", "--hardware", "cpu", "--seq-len", "128"],
    "roberta-lora-t4": ["FacebookAI/roberta-base", "--hardware", "t4", "--method", "lora"],
    "granite-lora-a100": ["ibm-granite/granite-3.3-8b-instruct", "--hardware", "a100-80gb", "--method", "lora"],
    "qwen05-lora-m2": [Q05, "--hardware", "m2-16gb", "--method", "lora", "--seq-len", "1024"],
    "gemma-full-mi300x": ["google/gemma-7b", "--hardware", "mi300x"],
    "vl-lora-images": [VL, "--hardware", "a10g", "--method", "lora", "--image-size", "448"],
    "shape-pretrain-cpu": ["--params", "30m", "--hardware", "cpu", "--seq-len", "128", "--dataset-tokens", "1m"],
    # knobs: offload, sharding, the runtime emulation, frameworks
    "zero2-offload-2x4090": [L8, "--hardware", "2x rtx-4090", "--zero", "2", "--offload", "optimizer"],
    "fsdp-lora-8a100": [L8, "--hardware", "8x a100-80gb", "--fsdp", "full-shard", "--method", "lora",
                        "--grad-accum", "4"],
    "framework-trl-qlora": [L8, "--hardware", "a100-80gb", "--method", "qlora", "--framework", "trl@0.12"],
    "framework-torchtune-lora": [L8, "--hardware", "a100-80gb", "--method", "lora", "--framework", "torchtune"],
    "framework-unsloth-qlora": [MISTRAL, "--hardware", "t4", "--method", "qlora", "--framework", "unsloth"],
    "runtime-knob": [L8, "--hardware", "a100-80gb", "--method", "qlora", "--runtime", "kbit_upcast=true"],
    "dora-compile": [Q05, "--hardware", "rtx-4090", "--method", "lora", "--dora", "--torch-compile"],
    "adamw8bit-full": [Q05, "--hardware", "rtx-4090", "--optimizer", "adamw-8bit", "--micro-batch", "8"],
    "does-not-fit-4090": [L8, "--hardware", "rtx-4090"],
    "err-dora-full": [Q05, "--hardware", "rtx-4090", "--dora"],
    "err-unknown-gpu": [L8, "--hardware", "rtx-9999"],
}

_PLANS: dict[str, list[str]] = {
    "plan-q05-lora-4090": [Q05, "--hardware", "rtx-4090", "--method", "lora", "--examples", "2000"],
    "plan-l8-auto-4090": [L8, "--hardware", "rtx-4090", "--examples", "1000", "--seq-len", "1024"],
    "plan-l8-dpo-3060": [L8, "--hardware", "rtx-3060", "--method", "dpo", "--examples", "1000"],
    "plan-q7-lora-a10g": [Q7, "--hardware", "a10g", "--method", "lora", "--examples", "10000"],
    "plan-l70-full-8h100": [L70, "--hardware", "8x h100-sxm", "--method", "full", "--examples", "20000"],
    "plan-mixtral-qlora-a100": [MIXTRAL, "--hardware", "a100-80gb", "--method", "qlora", "--examples", "5000"],
    "plan-gemma2-lora-l4": [GEMMA2, "--hardware", "l4", "--method", "lora", "--examples", "3000"],
    "plan-phi3-cpu": [PHI3, "--hardware", "cpu", "--method", "lora", "--examples", "200"],
    "plan-vl-images": [VL, "--hardware", "a10g", "--method", "lora", "--examples", "2000", "--image-size", "448"],
    "plan-flavor-t4-small": ["Qwen/Qwen2.5-1.5B-Instruct", "--flavor", "t4-small", "--method", "full",
                             "--examples", "10000", "--seq-len", "1024"],
    "plan-for-axolotl": [L8, "--hardware", "a100-80gb", "--method", "qlora", "--examples", "2000", "--for", "axolotl"],
    "plan-framework-trl": [Q7, "--hardware", "a100-80gb", "--method", "lora", "--examples", "2000",
                           "--framework", "trl"],
    "plan-multinode": [L70, "--hardware", "2x 8x h100-sxm", "--method", "full", "--examples", "20000"],
    "plan-shape-pretrain": ["shape:1m", "--hardware", "cpu", "--method", "pretrain", "--dataset-tokens", "2m"],
}

_CLOUDS: dict[str, list[str]] = {
    "cloud-q15-full": ["Qwen/Qwen2.5-1.5B-Instruct", "--method", "full", "--examples", "10000", "--seq-len", "1024"],
    "cloud-l8-lora": [L8, "--method", "lora", "--examples", "5000"],
    "cloud-l8-qlora-spot": [L8, "--method", "qlora", "--examples", "5000", "--spot"],
    "cloud-l70-full": [L70, "--method", "full", "--examples", "20000"],
    "cloud-mixtral-qlora": [MIXTRAL, "--method", "qlora", "--examples", "2000"],
    "cloud-gemma2-dpo": [GEMMA2, "--method", "dpo", "--examples", "2000"],
}

_ANALYZES: dict[str, list[str]] = {
    "analyze-4090": ["--hardware", "rtx-4090"],
    "analyze-cpu": ["--hardware", "cpu"],
    "analyze-8h100-l8": ["--hardware", "8x h100-sxm", "--model", L8, "--examples", "5000"],
    "analyze-t4-q05-lora": ["--hardware", "t4", "--model", Q05, "--method", "lora", "--examples", "2000"],
    "analyze-m2-16gb": ["--hardware", "m2-16gb", "--model", Q05, "--method", "lora", "--examples", "500"],
    "analyze-mi300x": ["--hardware", "mi300x", "--model", MISTRAL, "--examples", "1000"],
}

CASES: dict[str, list[str]] = {
    **{f"estimate-{k}": ["estimate", *v, "--no-calibration"] for k, v in _ESTIMATES.items()},
    **{k: ["plan", *v] for k, v in _PLANS.items()},
    **{k: ["cloud", *v] for k, v in _CLOUDS.items()},
    **{k: ["analyze", *v] for k, v in _ANALYZES.items()},
}


def run_case(argv: list[str]) -> dict:
    """The exit code, the whole of stdout, and stderr's last line when the command refused."""
    from trainfit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*argv, "--json"])
        except SystemExit as exc:
            code = exc.code
    stderr_lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    return {"exit": code, "stdout": out.getvalue(),
            "stderr": stderr_lines[-1] if code not in (0, 3) and stderr_lines else None}


def recorded() -> dict[str, dict]:
    return json.loads(gzip.decompress(OUTPUTS.read_bytes()))


if __name__ == "__main__":
    outputs = {name: run_case(argv) for name, argv in CASES.items()}
    text = json.dumps(outputs, indent=0, sort_keys=True).encode()
    DATA.mkdir(exist_ok=True)
    OUTPUTS.write_bytes(gzip.compress(text, mtime=0))
    codes = {}
    for v in outputs.values():
        codes[v["exit"]] = codes.get(v["exit"], 0) + 1
    print(f"{len(outputs)} cases recorded; exit codes {codes}; {OUTPUTS.stat().st_size} bytes", file=sys.stderr)
