"""The causal-LM loss of older transformers releases vs. the memory model, measured on this CPU.

transformers before 4.49 copies the shifted logits before cross_entropy (fp32 after the upcast;
gpt_bigcode and a few others in 16 bits, without the upcast): TrainingSetup.logits_shift_copy,
trainfit.core.runtime, Runtime.legacy_loss_in_16bit. This runs a few cases of bench/memory_accuracy.py (the same
live-tensor counter, two full steps) with whichever transformers is importable, sets the knob from
its version (logits_shift_copy, logits_returned_fp32), and records measured and predicted peaks under
that version. Run it once with the
installed release and once with an older one on the path:

    .venv/bin/python bench/loss_versions_cpu.py
    pip install --no-deps --target /tmp/tf448 transformers==4.48.1 "tokenizers<0.22" "huggingface_hub<1.0" \
        requests urllib3 idna certifi charset_normalizer
    PYTHONPATH=/tmp/tf448 .venv/bin/python bench/loss_versions_cpu.py
    pip install --no-deps --target /tmp/tf437 transformers==4.37.2 "tokenizers<0.19" "huggingface_hub>=0.26,<0.28" \
        peft==0.10.0 requests urllib3 idna certifi charset_normalizer
    PYTHONPATH=/tmp/tf437 .venv/bin/python bench/loss_versions_cpu.py

The "output kept" cases keep the model's output through backward and the step (TrainingSetup.output_kept),
which holds the returned logits: fp32 before 4.46 (logits_returned_fp32), in the compute dtype after.

Each run replaces its version's rows in bench/results/loss_versions_cpu.json and rewrites the .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import memory_accuracy as ma

from trainfit.core.memory import estimate_memory
from trainfit.core.runtime import transformers_knobs
from trainfit.core.models.loader import spec_from_config
from trainfit.core.setup import LoraSettings

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "loss_versions_cpu"

# Logits dominate: vocab 16k-32k on a 2-layer model, so the copy is a large share of the peak.
ARCHS = {
    "llama": ma._spec("llama", vocab_size=32000),
    "mistral": ma._spec("mistral", vocab_size=32000, hidden_size=384, num_heads=6, num_kv_heads=2, head_dim=64,
                        intermediate_size=1024),
}
# gpt_bigcode (SantaCoder's multi-query layout, shrunk): built from its config, as trainfit's trainer
# does not build this family.
BIGCODE_CONFIG = dict(model_type="gpt_bigcode", n_embd=256, n_head=8, n_layer=2, n_inner=1024, vocab_size=16384,
                      n_positions=1024, multi_query=True, activation_function="gelu_pytorch_tanh",
                      attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, layer_norm_epsilon=1e-5,
                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
# Deeper and with a small vocabulary, so the layers (and a cache kept per layer) outweigh the loss.
BIGCODE_DEEP_CONFIG = dict(BIGCODE_CONFIG, n_layer=8, vocab_size=2048)
BIGCODE_CONFIGS = {"bench:gpt_bigcode": BIGCODE_CONFIG, "bench:gpt_bigcode-deep": BIGCODE_DEEP_CONFIG}
ARCHS["gpt_bigcode"] = spec_from_config(BIGCODE_CONFIG, model_id="bench:gpt_bigcode")
ARCHS["gpt_bigcode-deep"] = spec_from_config(BIGCODE_DEEP_CONFIG, model_id="bench:gpt_bigcode-deep")
Q_V = LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules=["q_proj", "v_proj"])
CASES = [
    ("llama full pure-bf16", "llama", ma._s(precision="bf16")),
    ("llama full fp32", "llama", ma._s()),
    ("llama lora q,v pure-bf16", "llama", ma._s("lora", precision="bf16", lora=Q_V)),
    ("llama lora q,v pure-bf16 output kept", "llama", ma._s("lora", precision="bf16", lora=Q_V, output_kept=True)),
    ("mistral full bf16-autocast", "mistral", ma._s(precision="bf16-mixed")),
    ("mistral full bf16-autocast output kept", "mistral", ma._s(precision="bf16-mixed", output_kept=True)),
    ("gpt_bigcode full pure-bf16", "gpt_bigcode", ma._s(precision="bf16")),
    ("gpt_bigcode full bf16-autocast", "gpt_bigcode", ma._s(precision="bf16-mixed")),
    # use_cache left on (the config's default) under checkpointing: cache_under_checkpointing
    ("gpt_bigcode-deep full pure-bf16 ckpt", "gpt_bigcode-deep",
     ma._s(precision="bf16", grad_checkpointing="full", micro_batch=4, seq_len=512)),
    ("gpt_bigcode full fp32", "gpt_bigcode", ma._s()),
]


def _build(spec, setup):
    """memory_accuracy.build, and gpt_bigcode from its own config (trainfit's trainer does not build it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.architecture != "gpt_bigcode":
        return _build_catalog(spec, setup)
    cfg = dict(BIGCODE_CONFIGS[spec.id])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg),
                                             attn_implementation="sdpa")
    model = model.to(torch.bfloat16 if setup.precision == "bf16" else torch.float32)
    if setup.grad_checkpointing == "full":  # use_cache stays the config's (True), as in a Trainer run
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


_build_catalog = ma.build
ma.build = _build


def run() -> tuple[str, list[dict]]:
    import transformers

    version = transformers.__version__
    knobs = transformers_knobs(version)
    rows = []
    for name, arch, setup in CASES:
        setup = dataclasses.replace(setup, **knobs)
        spec = ARCHS[arch]
        measured = ma.measure(spec, setup)
        predicted = estimate_memory(spec, setup).devices[0].tensor_peak_bytes
        err = (predicted - measured) / measured * 100
        rows.append(dict(transformers=version, **knobs, config=name, measured_bytes=measured,
                         predicted_bytes=predicted, error_pct=round(err, 2)))
        print(f"{version:10s} {name:30s} measured {measured / 2**20:8.2f} MiB  predicted "
              f"{predicted / 2**20:8.2f} MiB  error {err:+6.1f} %", flush=True)
    return version, rows


def write(version: str, rows: list[dict]) -> None:
    path = RESULTS / f"{NAME}.json"
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    merged = [r for r in old if r["transformers"] != version] + rows
    merged.sort(key=lambda r: (r["transformers"], r["config"]))
    errs = [abs(r["error_pct"]) for r in merged]
    summary = dict(cases=len(merged), versions=sorted({r["transformers"] for r in merged}),
                   median_abs_error_pct=round(statistics.median(errs), 2), worst_abs_error_pct=round(max(errs), 2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(summary=summary, rows=merged), indent=2) + "\n")
    lines = ["# The causal-LM loss across transformers releases (CPU, live-tensor counter)", "",
             "Command: see the docstring of `bench/loss_versions_cpu.py` (one run per transformers release; "
             "MiB = 2^20 bytes; error = (predicted - measured) / measured). The knob "
             "`logits_shift_copy` and `logits_returned_fp32` are set from the release that ran (before 4.49 the "
             "shifted logits are copied before cross_entropy; before 4.46 the forward returns fp32 logits).", "",
             f"Summary: {summary['cases']} cases over transformers {', '.join(summary['versions'])}: "
             f"median |error| {summary['median_abs_error_pct']} %, worst {summary['worst_abs_error_pct']} %.", "",
             "| transformers | shift copy | config | measured MiB | predicted MiB | error % |",
             "|---|---|---|---:|---:|---:|"]
    for r in merged:
        lines.append(f"| {r['transformers']} | {r['logits_shift_copy']} | {r['config']} | "
                     f"{r['measured_bytes'] / 2**20:.2f} | {r['predicted_bytes'] / 2**20:.2f} | {r['error_pct']:+.1f} |")
    lines += ["", "Shapes: 2 layers, hidden 256-384, vocab 16k-32k, batch 2 x seq 256, random weights, dropout 0.",
              "", "gpt_bigcode under 4.37.2 holds about 10 MiB more in fp32 and in bf16 alike: its loss code is the "
              "same as 4.48.1's, which matches, so the difference is elsewhere in that release's model code "
              "(its SDPA attention class), which the memory model does not describe."]
    (RESULTS / f"{NAME}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    version, rows = run()
    write(version, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
