"""The estimate / plan command lines whose outputs tests/memory/data/knob_golden.json holds, recorded
from the code before the knob table existed, and the compact view of each output that is compared.

Record again (only when an output is meant to change, and say why in the commit):
    PYTHONPATH=src python tests/memory/golden_cases.py > tests/memory/data/knob_golden.json
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys

os.environ.setdefault("TRAINFIT_NO_PROBE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

Q7 = "Qwen/Qwen2.5-7B-Instruct"
L8 = "meta-llama/Llama-3.1-8B"
CASES: dict[str, list[str]] = {
    "full-default": ["estimate", "qwen2.5-0.5b", "--hardware", "rtx-4090"],
    "lora-ckpt": ["estimate", Q7, "--hardware", "a10g", "--method", "lora", "--grad-checkpointing", "full",
                  "--seq-len", "1024", "--micro-batch", "2", "--lora-r", "32", "--lora-targets", "q_proj,v_proj"],
    "qlora-examples": ["estimate", L8, "--hardware", "t4", "--method", "qlora", "--examples", "5000",
                       "--epochs", "2"],
    "qlora-emulation": ["estimate", L8, "--hardware", "a100-80gb", "--method", "qlora", "--kbit-upcast",
                        "--autocast-16bit-weights", "--bitsandbytes-version", "0.42.0",
                        "--transformers-version", "4.44.0", "--output-kept", "--optimizer-impl", "foreach"],
    "dpo-lora": ["estimate", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--method", "dpo", "--lora-r", "8",
                 "--dpo-reference", "lora-base"],
    "zero3-offload": ["estimate", L8, "--hardware", "a100-80gb", "--zero", "3", "--offload", "optimizer+params"],
    "fsdp-no-sync": ["estimate", L8, "--hardware", "8x a100-80gb", "--fsdp", "full-shard", "--method", "lora",
                     "--grad-accum", "4", "--fsdp-no-sync", "--fsdp-mixed-units", "--activation-offload"],
    "litgpt": ["estimate", L8, "--hardware", "a100-80gb", "--method", "qlora", "--model-code", "litgpt",
               "--previous-step-kept", "--quantize-lm-head", "--bnb-fp16-quant-state", "--loss", "chunked-16bit",
               "--precision", "bf16"],
    "compile-dora": ["estimate", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--method", "lora", "--dora",
                     "--torch-compile", "--loss", "chunked", "--optimizer-in-backward"],
    "does-not-fit": ["estimate", L8, "--hardware", "rtx-4090"],
    "inference": ["estimate", Q7, "--hardware", "a10g", "--method", "inference", "--quant", "nf4",
                  "--generate", "256"],
    "shape-cpu": ["estimate", "--params", "30m", "--hardware", "cpu", "--seq-len", "128", "--dataset-tokens", "1m"],
    "err-offload-no-zero": ["estimate", L8, "--hardware", "a100-80gb", "--offload", "optimizer"],
    "err-no-sync-no-accum": ["estimate", L8, "--hardware", "8x a100-80gb", "--fsdp", "full-shard", "--fsdp-no-sync"],
    "err-bad-choice": ["estimate", L8, "--hardware", "a100-80gb", "--optimizer-impl", "fastest"],
    "err-bad-number": ["estimate", L8, "--hardware", "a100-80gb", "--micro-batch", "0"],
    "err-dora-full": ["estimate", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--dora"],
    "plan-lora": ["plan", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--method", "lora", "--examples", "2000",
                  "--image-size", "0"],
    "plan-fallback": ["plan", L8, "--hardware", "rtx-4090", "--seq-len", "512", "--examples", "1000"],
}


def _digest(doc) -> str:
    return hashlib.sha256(json.dumps(_setups_reduced(doc), sort_keys=True).encode()).hexdigest()[:16]


def _not_default(setup: dict) -> dict:
    """A setup's fields that differ from TrainingSetup's defaults: a knob added later, at its
    default, changes no recorded output."""
    from trainfit.core.serde import to_jsonable
    from trainfit.core.setup import TrainingSetup

    default = to_jsonable(TrainingSetup())
    return {k: v for k, v in setup.items() if k not in default or default[k] != v}


def _setups_reduced(node):
    if isinstance(node, dict):
        return {k: _not_default(v) if k == "setup" and isinstance(v, dict) else _setups_reduced(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_setups_reduced(v) for v in node]
    return node


def compact(doc: dict) -> dict:
    """What a reader checks first, beside a digest of the whole document."""
    if "devices" in doc:  # estimate
        return {"fits": doc["fits"], "setup_not_default": _not_default(doc["setup"]),
                "devices": [[d["device"], d["total_bytes"], d["tensor_peak_bytes"]] for d in doc["devices"]],
                "nearest_changes": (doc["nearest_fitting"] or {}).get("changes"),
                "step_seconds": (doc["run"] or {}).get("speed", {}).get("step_seconds")}
    return {"modes": [[mode, used, fits] for mode, _, used, fits in doc["modes"]]}


def run_case(argv: list[str]) -> dict:
    """Exit code, the compact view and digest of the JSON on stdout, and stderr's last line."""
    from trainfit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*argv, "--json", "--no-calibration"] if argv[0] == "estimate" else [*argv, "--json"])
        except SystemExit as exc:
            code = exc.code
    stderr_lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    result = {"exit": code, "stderr": stderr_lines[-1] if code not in (0, 3) and stderr_lines else None}
    if out.getvalue().strip():
        doc = json.loads(out.getvalue())
        # The `framework` field (which tool the figures describe: trainfit's own run here) was added
        # after the recording, on purpose; every figure beside it must stay as recorded.
        assert doc.pop("framework", {"name": "trainfit"})["name"] == "trainfit"
        if argv[0] == "plan":  # the plan's text mentions timings of this machine: compare its modes only
            doc = {"modes": [[m["mode"], _not_default(m["setup"]), m["memory_used_bytes"], m["fits"]]
                             for m in doc["modes"]]}
        result["digest"] = _digest(doc)
        result["compact"] = compact(doc)
    return result


if __name__ == "__main__":
    json.dump({name: run_case(argv) for name, argv in CASES.items()}, sys.stdout, indent=1, sort_keys=True)
    print()
