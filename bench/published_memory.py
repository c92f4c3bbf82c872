"""Memory model vs. published GPU peak-memory measurements.

Every run in bench/data/published_memory.yaml is a fine-tuning run someone measured on a GPU and
published (the source, section and settings are in the file). For each we call trainfit's
`estimate_memory` (the core function, no subprocess) with the published settings, run by the row's
tool as `--framework` names it (`framework: litgpt@0.4.13`, resolved and applied by
trainfit.core.frameworks; no row sets a knob of its own), and compare the metric the source reports
(and, beside it, the same settings as trainfit's own run, no framework named):

* allocated (torch.cuda.max_memory_allocated)  <->  tensor_peak_bytes
* reserved (torch.cuda.max_memory_reserved)     <->  tensor peak + the margins inside the caching
                                                     allocator (DeviceMemory.reserved_peak_bytes)
* nvidia-smi                                    <->  device_total_bytes (+ CUDA context and NCCL buffers)

A run that fits only under memory pressure (its free-running total exceeds the card) is predicted to
show at most the card: the allocator frees its cache and retries there instead of growing.

Signed error = (predicted - published) / published: negative means under-predicted, the direction
that turns into an OOM. A published OOM is "caught" when trainfit says the run does not fit: its
verdict compares `required_bytes` (the total with only the slack that survives the allocator's
free-and-retry) with the card, not the free-running total.

Run:  .venv/bin/python bench/published_memory.py [--only SUBSTRING]
Writes bench/results/published_memory.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from trainfit import yaml_io  # noqa: E402
from trainfit.core.machines.hardware_spec import resolve_hardware  # noqa: E402
from trainfit.core.memory import estimate_memory  # noqa: E402
from trainfit.core.frameworks import apply_framework, resolve_framework  # noqa: E402
from trainfit.errors import BadInputError  # noqa: E402
from trainfit.core.models.catalog import get_model  # noqa: E402
from trainfit.core.models.loader import spec_from_config  # noqa: E402
from trainfit.core.models.spec import ModelSpec  # noqa: E402
from trainfit.core.setup import LoraSettings, TrainingSetup  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "published_memory.yaml"
RESULTS = HERE / "results"

UNIT_BYTES = {"B": 1.0, "GB": 1e9, "GiB": 2.0**30, "MB": 1e6, "MiB": 2.0**20}
METRICS = ("allocated", "reserved", "nvidia-smi")
SHARDING_ZERO_STAGE = {"none": 0, "ddp": 0, "fsdp-full-shard": 3, "zero3": 3, "zero2": 2, "fsdp-shard-grad-op": 2}
REQUIRED = ("id", "source", "section", "framework", "model", "method", "precision", "optimizer", "micro_batch",
            "seq_len", "grad_checkpointing", "quant", "hardware", "sharding", "metric", "unit", "oom")
UNDER_LIMIT = -0.10  # "under-predicted by more than 10 %"


def load(path: Path = DATA) -> dict[str, Any]:
    return yaml_io.load_yaml(path.read_text())


def schema_problems(doc: dict[str, Any]) -> list[str]:
    """Every row names a known source (with a URL), a metric, and a figure unless it is an OOM."""
    problems = []
    sources = doc.get("sources") or {}
    for name, src in sources.items():
        if not str((src or {}).get("url", "")).startswith("https://"):
            problems.append(f"source {name}: no https url")
    seen = set()
    for i, row in enumerate(doc.get("runs") or []):
        rid = row.get("id", f"#{i}")
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            problems.append(f"{rid}: missing {', '.join(missing)}")
        if rid in seen:
            problems.append(f"{rid}: duplicate id")
        seen.add(rid)
        if row.get("source") not in sources:
            problems.append(f"{rid}: source {row.get('source')!r} is not in `sources`")
        if row.get("metric") not in METRICS:
            problems.append(f"{rid}: metric {row.get('metric')!r} not one of {METRICS}")
        if row.get("unit") not in UNIT_BYTES:
            problems.append(f"{rid}: unit {row.get('unit')!r} not one of {tuple(UNIT_BYTES)}")
        if row.get("sharding") not in SHARDING_ZERO_STAGE:
            problems.append(f"{rid}: sharding {row.get('sharding')!r} not one of {tuple(SHARDING_ZERO_STAGE)}")
        if bool(row.get("oom")) == (row.get("figure") is not None):
            problems.append(f"{rid}: a run has a figure or is an OOM, exactly one")
        try:  # the tool as a user names it: `--framework NAME[@VERSION]`
            resolve_framework(str(row.get("framework")), key="framework")
        except BadInputError as exc:
            problems.append(f"{rid}: {exc.message}")
        if row.get("method") in ("lora", "qlora") and not (row.get("lora") or {}).get("targets"):
            problems.append(f"{rid}: LoRA run without lora.targets")
    return problems


def model_for(row: dict[str, Any], models: dict[str, dict[str, Any]]) -> ModelSpec:
    name = row["model"]
    if name in models:
        return spec_from_config(dict(models[name]), origin="bench/data/published_memory.yaml", model_id=name)
    return get_model(name)


SHARDING_FSDP = {"fsdp-full-shard": "full-shard", "fsdp-shard-grad-op": "shard-grad-op"}


def framed_setup(row: dict[str, Any], setup: TrainingSetup) -> TrainingSetup:
    """The row's setup as its tool runs it: `framework` resolved and applied exactly as a user's
    `--framework` is (trainfit.core.frameworks), with no knob of the row's own."""
    framed, _ = apply_framework(setup, resolve_framework(str(row["framework"]), key=f"{row['id']}: framework"))
    return framed


def setup_for(row: dict[str, Any], *, framework: bool = True) -> TrainingSetup:
    """The published settings as a TrainingSetup, run by the row's tool (framework=False: trainfit's own run)."""
    lora = None
    if row.get("lora"):
        targets = list(row["lora"]["targets"])
        # PEFT's "all-linear" is a string, not a module name
        lora = LoraSettings(rank=int(row["lora"]["rank"]),
                            target_modules="all-linear" if targets == ["all-linear"] else targets)
    num_gpus = int(str(row["hardware"]).split("x", 1)[0]) if "x " in str(row["hardware"]) else 1
    setup = TrainingSetup(
        method=row["method"], precision=row["precision"], optimizer=row["optimizer"],
        micro_batch=int(row["micro_batch"]), seq_len=int(row["seq_len"]),
        grad_accum=int(row.get("grad_accum", 1)), grad_checkpointing=row["grad_checkpointing"],
        lora=lora, quant=row["quant"], num_gpus=num_gpus, zero_stage=SHARDING_ZERO_STAGE[row["sharding"]],
        offload=row.get("offload", "none"), attention=row.get("attention", "sdpa"), device="cuda",
        fsdp_strategy=SHARDING_FSDP.get(row["sharding"], "none"),
        optimizer_in_backward=bool(row.get("optimizer_in_backward", False)),
        torch_compile=bool(row.get("torch_compile", False)))
    return framed_setup(row, setup) if framework else setup


def _predicted(row: dict[str, Any], models: dict[str, dict[str, Any]], setup: TrainingSetup):
    est = estimate_memory(model_for(row, models), setup, resolve_hardware(row["hardware"]))
    gpu = est.devices[0]
    return gpu, {"allocated": gpu.tensor_peak_bytes, "reserved": gpu.reserved_peak_bytes,
                 "nvidia-smi": gpu.device_total_bytes}[row["metric"]]


def evaluate(row: dict[str, Any], models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The row predicted for its framework, and for trainfit's own run (no --framework) beside it."""
    setup = setup_for(row)
    gpu, predicted = _predicted(row, models, setup)
    own_gpu, own_predicted = _predicted(row, models, setup_for(row, framework=False))
    out = {
        "id": row["id"], "framework": row["framework"], "method": row["method"], "model": row["model"],
        "hardware": row["hardware"], "metric": row["metric"], "multi_gpu": setup.num_gpus > 1,
        "predicted_bytes": int(predicted), "tensor_peak_bytes": int(gpu.tensor_peak_bytes),
        "reserved_bytes": gpu.reserved_peak_bytes, "total_bytes": int(gpu.total_bytes),
        "device_total_bytes": gpu.device_total_bytes,
        "capacity_bytes": gpu.capacity_bytes,
        "predicted_fits": gpu.fits, "published_oom": bool(row["oom"]),
        "unmodelled": row.get("unmodelled"),
        "no_framework": {"predicted_bytes": int(own_predicted), "predicted_fits": own_gpu.fits},
    }
    if row.get("figure") is not None:
        published = float(row["figure"]) * UNIT_BYTES[row["unit"]]
        out["published_bytes"] = int(published)
        out["error"] = (predicted - published) / published
        out["no_framework"]["error"] = (own_predicted - published) / published
    return out


def group_medians(rows: list[dict[str, Any]], key) -> dict[str, dict[str, float]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        if "error" in r:
            groups.setdefault(key(r), []).append(r["error"])
    return {k: {"n": len(v), "median_abs_error": statistics.median(abs(e) for e in v),
                "median_signed_error": statistics.median(v),
                "under_10pct_share": sum(e < UNDER_LIMIT for e in v) / len(v)}
            for k, v in sorted(groups.items())}


def _group_errors(rows: list[dict[str, Any]], key, *, own: bool = False) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r["no_framework"]["error"] if own else r["error"])
    return dict(sorted(groups.items()))


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in results if "error" in r]
    errors = [r["error"] for r in scored]
    ooms = [r for r in results if r["published_oom"]]
    missed = [r["id"] for r in ooms if r["predicted_fits"]]
    own_errors = [r["no_framework"]["error"] for r in scored]
    return {
        "runs": len(results), "scored_runs": len(scored), "published_ooms": len(ooms),
        # the same rows predicted for trainfit's own run (no --framework): what naming the tool changes
        "no_framework": {
            "median_abs_error": statistics.median(abs(e) for e in own_errors) if own_errors else None,
            "under_10pct_share": sum(e < UNDER_LIMIT for e in own_errors) / len(own_errors) if own_errors else None,
            "ooms_predicted_fitting": [r["id"] for r in ooms if r["no_framework"]["predicted_fits"]],
            "by_framework": {g: {"n": len(v), "median_abs_error": statistics.median(abs(e) for e in v)}
                             for g, v in _group_errors(scored, lambda r: r["framework"], own=True).items()},
        },
        "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
        "under_10pct_share": sum(e < UNDER_LIMIT for e in errors) / len(errors) if errors else None,
        "over_10pct_share": sum(e > 0.10 for e in errors) / len(errors) if errors else None,
        "ooms_predicted_fitting": missed,
        "fitting_runs_predicted_oom": [r["id"] for r in scored if r["predicted_fits"] is False],
        "by_method": group_medians(scored, lambda r: r["method"]),
        "by_gpus": group_medians(scored, lambda r: "multi-GPU" if r["multi_gpu"] else "single GPU"),
        "by_framework": group_medians(scored, lambda r: r["framework"]),
        "by_modelled": group_medians(scored, lambda r: "has unmodelled knobs" if r["unmodelled"] else "fully modelled"),
    }


def run(only: str | None = None, path: Path = DATA) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    doc = load(path)
    problems = schema_problems(doc)
    if problems:
        raise SystemExit("published_memory.yaml: " + "; ".join(problems))
    models = doc.get("models") or {}
    rows = [r for r in doc["runs"] if not only or only in r["id"]]
    results = [evaluate(r, models) for r in rows]
    return results, summarise(results)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f} %"


def _abs_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def to_markdown(results: list[dict[str, Any]], summary: dict[str, Any], findings: str = "",
                slack: dict[str, Any] | None = None) -> str:
    own = summary["no_framework"]
    lines = ["# Memory model vs. published GPU measurements", "",
             "Generated by `bench/published_memory.py` from `bench/data/published_memory.yaml` (sources,",
             "settings and assumptions cited there). Error = (predicted - published) / published; the metric",
             "compared is the one each source reports (allocated <-> tensor_peak_bytes,",
             "reserved <-> reserved_peak_bytes, nvidia-smi <-> device_total_bytes, both at most the card). The fit verdict",
             "compares required_bytes (the slack that survives the allocator's free-and-retry) with the card.", "",
             f"* runs: {summary['runs']} ({summary['scored_runs']} with a figure, "
             f"{summary['published_ooms']} published OOMs)",
             f"* median |error|: {_abs_pct(summary['median_abs_error'])} (target <= 3 %)",
             f"* under-predicted by > 10 %: {_abs_pct(summary['under_10pct_share'])} of runs (target <= 3 %)",
             f"* over-predicted by > 10 %: {_abs_pct(summary['over_10pct_share'])} of runs",
             f"* published OOMs predicted as fitting: {len(summary['ooms_predicted_fitting'])} "
             f"{summary['ooms_predicted_fitting'] or ''}",
             f"* runs that fit but are predicted not to: {len(summary['fitting_runs_predicted_oom'])} "
             f"{summary['fitting_runs_predicted_oom'] or ''}", "",
             "Each row's tool is set by `framework` exactly as `--framework NAME[@VERSION]` sets it",
             "(src/trainfit/data/frameworks.yaml). The same rows with no framework named, predicted for",
             "trainfit's own run as a user who does not name the tool gets them:", "",
             f"* median |error| with no framework: {_abs_pct(own['median_abs_error'])}",
             f"* under-predicted by > 10 % with no framework: {_abs_pct(own['under_10pct_share'])} of runs",
             f"* published OOMs predicted as fitting with no framework: {len(own['ooms_predicted_fitting'])}", "",
             "| framework | n | median abs error (named) | median abs error (not named) |", "|---|---|---|---|"]
    for g, s in summary["by_framework"].items():
        lines.append(f"| {g} | {s['n']} | {_abs_pct(s['median_abs_error'])} | "
                     f"{_abs_pct(own['by_framework'][g]['median_abs_error'])} |")
    lines.append("")
    for title, key in (("method", "by_method"), ("GPUs", "by_gpus"), ("framework", "by_framework"),
                       ("knobs", "by_modelled")):
        lines += [f"## By {title}", "", "| group | n | median abs error | median signed | under > 10 % |",
                  "|---|---|---|---|---|"]
        for g, s in summary[key].items():
            lines.append(f"| {g} | {s['n']} | {_abs_pct(s['median_abs_error'])} | {_pct(s['median_signed_error'])} "
                         f"| {_abs_pct(s['under_10pct_share'])} |")
        lines.append("")
    if slack:
        lines += ["## Allocator slack (published pairs)", "",
                  "(reserved or nvidia-smi - CUDA context - NCCL - allocated) / allocated, same run:", "",
                  "| group | n | median | min | max |", "|---|---|---|---|---|"]
        for g, v in slack.items():
            lines.append(f"| {g} | {v['n']} | {_abs_pct(v['median'])} | {_abs_pct(v['min'])} | {_abs_pct(v['max'])} |")
        lines.append("")
    if findings:
        lines += [findings.rstrip(), ""]
    lines += ["## Runs", "", "| id | framework | method | hardware | metric | published GB | predicted GB | error "
              "| fits? | error, no framework |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        pub = f"{r['published_bytes'] / 1e9:.2f}" if "published_bytes" in r else "OOM"
        err = _pct(r.get("error")) if "error" in r else ("caught" if r["predicted_fits"] is False else "MISSED")
        lines.append(f"| {r['id']} | {r['framework']} | {r['method']} | {r['hardware']} | {r['metric']} | {pub} "
                     f"| {r['predicted_bytes'] / 1e9:.2f} | {err} | {r['predicted_fits']} | {_own_cell(r)} |")
    return "\n".join(lines) + "\n"


def _own_cell(r: dict[str, Any]) -> str:
    own = r["no_framework"]
    if "error" in own:
        return _pct(own["error"])
    return "caught" if own["predicted_fits"] is False else "MISSED"


def allocator_slack(doc: dict[str, Any]) -> dict[str, Any]:
    """Reserved-over-allocated slack from runs whose source publishes both peak allocated and peak
    reserved / nvidia-smi: (other - allocated - margins outside the pool) / allocated, where the
    margins outside the pool (context, NCCL) are trainfit's. Independent of trainfit's tensor model."""
    rows = {r["id"]: r for r in doc["runs"]}
    models = doc.get("models") or {}
    groups: dict[str, list[float]] = {}
    for rid, row in rows.items():
        if row["metric"] != "allocated" or row.get("figure") is None:
            continue
        other = rows.get(rid + "-smi") or rows.get(rid.removesuffix("-alloc"))
        if other is None or other is row or other.get("figure") is None:
            continue
        alloc = float(row["figure"]) * UNIT_BYTES[row["unit"]]
        seen = float(other["figure"]) * UNIT_BYTES[other["unit"]]
        if other["metric"] == "nvidia-smi":
            gpu = evaluate(row, models)
            seen -= gpu["device_total_bytes"] - gpu["reserved_bytes"]  # context + NCCL: outside the pool
        # the workspaces are inside the pool too: count what is left as slack
        sharded = SHARDING_ZERO_STAGE[row["sharding"]] >= 3
        groups.setdefault("FSDP full shard / ZeRO-3" if sharded else "unsharded", []).append((seen - alloc) / alloc)
    return {k: {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in sorted(groups.items())}


FINDINGS = """## What the errors show

Figures are signed errors (predicted - published) / published of individual rows (see the table).
Each framework's behaviour is a TrainingSetup knob (core/memory/framework_effects.py), set by the
tool's profile (src/trainfit/data/frameworks.yaml, by release, from its code or pinned versions)
through the same resolver as a user's `--framework NAME[@VERSION]`, never per row to fit a figure.

1. **Allocator slack depends on sharding** (overheads.py). Published pairs of peak allocated and
   peak reserved / nvidia-smi of the same run (section "Allocator slack") give a median slack of
   15 % of the allocated peak on one GPU and 26 % under FSDP full shard (also 26-35 % in
   meta-llama/llama-cookbook#41): 30 % is applied when `zero_stage >= 3` on more than one GPU,
   15 % otherwise. reserved is not nvidia-smi: it excludes the CUDA context and NCCL's buffers, so
   `DeviceMemory.reserved_peak_bytes` is the prediction for reserved. That is the slack of a run with
   room to spare. Near the card's capacity the allocator frees its cached segments and retries
   before it raises an OOM, so the verdict counts only what survives that (5 % of the tensor peak:
   the least capacity of twelve full-size steps replayed through the allocator's rules is 0.7-15.5 %
   above their allocated peak, median 2.4 %, bench/meta_trace.py). Until that split the verdict
   used the free-running total, and the one-GPU slack was held at 10 % (the lower quartile) to
   limit false "does not fit" verdicts: 11 of them, all runs measured within 2 GiB of their card.
   With it, 15 % (the median then; 25 % since item 26) is applied and 3 remain; the missed OOM stays the one below.
   A full fine-tune's free-running pool also spans phases (`overheads.phase_pool_bytes`): the
   gradients and the optimizer step's temporaries sit beside the blocks the forward and backward left
   cached, so the slack is at least the resident states plus both phases' transients minus the peak.
   fms's Mistral 7B full fine-tune on 2 GPUs has one allocated peak (its optimizer step) at batch 2
   and 4 but 9 GiB more nvidia-smi at batch 4, which no share of the peak can give; the allocator
   replay gives 40.4 % for Llama 3.2 3B full where the pool gives 38.4 % (bench/meta_trace.py). On
   the published rows: SantaCoder full 1 GPU nvidia-smi -15.0 / -16.3 % -> -4.8 / -3.2 %, Mistral 7B
   full 2 GPUs bs4 -10.5 % -> -9.1 %, SantaCoder 2 GPUs bs4 -24.5 % -> -23.7 %; Mistral 7B full
   1 GPU bs4 +3.5 % -> +5.1 % and bs8 +9.5 % -> +27.1 % (its pool, 90 GiB, is over the 80 GB card:
   the run frees its cache and shows 71 GiB). LoRA and QLoRA rows, whose optimizer step is small,
   and the fit verdicts are unchanged.
2. **FSDP rows now run the FSDP model.** The harness used to pass FSDP rows as DeepSpeed ZeRO-3
   (zero_stage 3 without fsdp_strategy); they now set `fsdp_strategy` (fsdp.py's floor).
3. **foreach AdamW** (`optimizer_impl: foreach`): torch.optim.AdamW without foreach/fused, as LitGPT
   and the HF Trainer's `adamw_torch` build it, takes the sqrt of every second moment at once at
   the step. Mistral 7B full, pure bf16, 1x A100 (fms): -19.7 % -> -0.0 %; phi-2 full on 2x A10G
   (LitGPT FSDP): -18.9 % -> +3.1 %.
4. **bitsandbytes before 0.43.2 kept each 4-bit layer's input** (`bitsandbytes:` version; commit
   9e75374, PR #1270): LitGPT pinned 0.41.1 / 0.42.0. LitGPT QLoRA rows without checkpointing:
   stablelm-3b -17.0 % -> -8.2 %, Llama 2 7B (config hub) -19.1 % -> -9.7 %.
5. **PEFT's k-bit preparation casts the non-quantised weights to fp32** (`kbit_upcast`): TRL's
   SFTTrainer does it for a bitsandbytes base, not for sharded QLoRA. fms single-GPU QLoRA rows:
   Mistral 7B -24.6 % -> -1.3 %, Mixtral -5.4 % -> +5.9 %, and the 70B OOM on one 80 GB GPU is
   now caught. trainfit's own runner prepares the base without that cast (2.1 GB less for
   Llama 3 8B), so the default estimate keeps 16-bit embeddings.
6. **FSDP units that mix frozen weights and adapters** (`fsdp_mixed_units`): LitGPT wraps each
   Block with its LoRA weights inside, and FSDP then keeps gradients for the whole unit
   (Lightning-AI/litgpt#1417, #1538). LitGPT 2-GPU LoRA: Llama 2 7B -61.8 % -> -32.4 %.
7. **Accumulation under FSDP's no_sync** (`fsdp_no_sync`, with each row's stated `grad_accum`):
   LitGPT runs every micro-batch but the last under `fabric.no_backward_sync`, i.e. FSDP's
   `no_sync()`, which "will accumulate the full model gradients (instead of gradient shards)"
   (torch FSDP docs). With mixed units that is every decoder weight's bf16 gradient, unsharded:
   the "W + W / N whatever the micro-batch" floor those runs showed. LitGPT FSDP LoRA (10 runs,
   phi-1.5 / StableLM 3B / Llama 2 7B and 13B, 2 and 4 GPUs, micro-batch 1-4): -30..-57 % ->
   -5.0..+1.7 %; the 13B on 2x A100-40GB OOM is now caught. Full fine-tunes: TinyLlama -22.0 % ->
   -7.5 % (its 8 accumulated micro-batches keep the whole gradient), Llama 2 7B on 4x A10G OOM
   now caught. The HF Trainer does the same unless Accelerate's sync_each_batch is set, which
   trainfit's exports now set for FSDP with accumulation (export/training_args.py).
8. **LitGPT's loss** (`loss: chunked-16bit`): lm_head and cross-entropy in 128-token chunks in bf16,
   no fp32 upcast. phi-2 LoRA +85.7 % -> +79.8 %, TinyLlama LoRA +62.1 % -> +54.5 %: these small
   models stayed over-predicted; the rest of the gap was LitGPT's own model code (item 16).
9. **Quantisation scales are not sharded**: bitsandbytes keeps a 4-bit weight's absmax on its
   QuantState, not in a parameter, so FSDP and ZeRO-3 leave a whole copy on every rank
   (fsdp_qlora train.py: "FSDP only syncs parameters and buffers, so the quant_state isn't
   copied"). fms FSDP QLoRA 70B on 2x A100: -14.8 % -> -10.2 % (2.1 GB of fp32 absmax per GPU).
   A packed-storage gather floor for QLoRA (what FSDP flattens is the 4-bit storage) was tried and
   not kept: it moved Mixtral and the ZeRO-3 70B row closer but four FSDP QLoRA rows below -10 %,
   so those runs hold something the 16-bit floor happens to cover; a GPU measurement must tell.
10. **LitGPT's QLoRA runs through Lightning Fabric's bitsandbytes plugin** (`quantize_lm_head`,
   `bnb_fp16_quant_state`): the plugin swaps every nn.Linear for a 4-bit one while the model is
   built, LitGPT's own lm_head included, and quantises each weight from an fp16 copy, so
   bitsandbytes' 4-bit matmul holds the fp16 de-quantised weight and its bf16 cast at once; the
   largest such weight is now the lm_head. Config-hub QLoRA: Llama 3 / 3.1 8B -12.9 % -> -5.8 %,
   StableLM 3B -15.6 % -> -7.9 %, Mistral 7B -8.0 % -> -6.4 %; resource tables: StableLM 3B
   -8.1 % -> -1.7 %, Llama 2 7B and 13B +1.6..2.2 % -> +3.3..3.4 %.
11. **transformers before 4.49 copies the shifted logits** (`transformers:` version ->
   `logits_shift_copy`): ForCausalLMLoss (4.46-4.48) and the older model forwards upcast the logits
   to fp32 and then run `logits[..., :-1, :].contiguous()`, a second fp32 logits-sized tensor in the
   loss forward; gpt_bigcode (and bloom, falcon, gpt_neox, opt, mpt, dbrx) computed the loss in its
   own forward on the 16-bit logits, with the same copy in 16 bits. fms pins 4.48.1: Mistral 7B
   allocated LoRA 1 GPU -4.5 / -6.2 % -> -0.6 / -0.7 %, 2 GPUs -6.6 / -10.9 % -> -3.1 / -6.1 %,
   QLoRA -1.3..-6.7 % -> -0.2..+6.0 %; SantaCoder allocated +10.6..+22.2 % -> -12.2..+6.5 %. Before
   4.46 the forward returns the logits upcast to fp32 (`logits_returned_fp32`), and fsdp_qlora's loop
   keeps the model output until after the optimizer step (`output_kept`): its fp32 logits live
   through backward. fsdp_qlora NO_SHARD QLoRA bs8 -14.6 % -> -4.3 %, LoRA CPU offload bs10 -20.2 %
   -> -6.2 %; its other rows, already over, rise 1-7 points. Checked on CPU under transformers
   4.37.2, 4.48.1 and 5.23 (bench/loss_versions_cpu.py: 24 cases, median 0.4 %; Llama and Mistral
   within 0.6 % in every release, the output kept or not).
12. **FSDP QLoRA gathers the packed 4-bit storage** (fsdp.unit_bytes): FSDP shards and all-gathers
   bitsandbytes' quant_storage (bf16-typed, 0.5 B per weight), and the layer de-quantises one weight
   at a time; the floor had counted every gathered layer at 2 B per weight. Both frameworks that
   quantise here double-quantise (nf4-dq, from their code: fms-acceleration's bitsandbytes plugin
   sets bnb_4bit_use_double_quant=True, fsdp_qlora keeps Linear4bit's compress_statistics=True; the
   measured per-GPU weights of fms's 70B runs agree), and CPUOffload moves FSDP's flat parameters
   but not the QuantState's scales. fsdp_qlora QLoRA rows +12..+45 % -> -2..+24 %, fms Mixtral QLoRA
   2 GPUs +28..+42 % -> +4..+11 %, Yi 34B QLoRA no longer a false "does not fit", Llama 2 70B with
   CPU offload +12.9 % -> +0.9 %; fms Mistral QLoRA rows fall 1-9 points (-10.0..+2.2 %).
13. **MoE experts are quantised per expert under transformers 4** (`experts_fused`): fms pins 4.48.1,
   whose Mixtral builds one nn.Linear per expert, so one expert's weight is de-quantised at a time
   (0.11 GiB), not a whole layer's experts (2.6 GiB, which no release does: transformers 5 fuses them
   into 3-D parameters that bitsandbytes does not quantise at all, bitsandbytes#1849, so a current
   install keeps Mixtral's 45 B expert parameters 16-bit under --quant nf4). fms Mixtral QLoRA rows
   -0.3..+11 % -> -5.2..+2.4 %, nvidia-smi 2 GPUs bs2 -0.3 % -> -10.7 %.
14. **NCCL's buffers** are the published 544 / 688 MB per GPU of a 2-GPU / larger group on A100 with
   NVLink (NVIDIA/nccl#964; 300 MiB before): multi-GPU nvidia-smi rows rise 0.2-0.35 GiB.
15. **Reentrant checkpointing around FSDP units** (`reentrant_checkpoint_around_fsdp_units`):
   transformers before 4.52 checkpoints `decoder_layer.__call__`, under FSDP1 the unit's call, reentrant
   by default; in backward FSDP registers a frozen unit's reshard-only hook on the recomputed input, a
   leaf, and keeps it until backward ends, so every layer's input gradient is held: one more hidden
   state per layer and token (bench/fsdp_reentrant_cpu.py measures it on CPU). The fms and PEFT QLoRA
   runs use HF's default (PEFT's QLoRA scripts pass --use_reentrant True, its LoRA FSDP script False;
   fsdp_qlora checkpoints inside the units). fms Llama 2 70B QLoRA 2 GPUs bs2 allocated -22.5 % ->
   +0.2 %, nvidia-smi -11.8 % -> +13.5 %; PEFT's 70B QLoRA with CPU offload -20.2 % -> +12.6 %; fms
   Mistral QLoRA 2 GPUs -7.5..-0.4 % -> -3.7..-0.4 %; Mixtral QLoRA bs2 nvidia-smi -10.7 % -> -5.2 %;
   fms Mistral / Mixtral LoRA 2 GPUs rise 3-5 points (-1.6..+20.5 %).
16. **LitGPT runs its own model code** (`model_code: litgpt`): not transformers and PEFT but LitGPT's
   GPT and LoRA classes, which keep other tensors: one LoRAQKVLinear for q/k/v (one dropout and one
   stacked A; zero_pad keeps a q+v-wide output when k is not adapted), keys and values
   repeat_interleave'd to every query head, the attention output's reshape copy for an adapted
   projection, v as a view that keeps the whole fused q+k+v output in MHA models, GELU-tanh as one
   op, no fp32 norm output for Gemma, adapters in bf16 under bf16-true, an lm_head of its own
   (convert_hf_checkpoint copies a tied embedding), and Falcon's single key head repeated before
   SDPA, so its fused kernel runs where transformers' falcon falls back to the math path and keeps
   the scores (Falcon 7B config hub LoRA / QLoRA +20.0 / +38.2 % -> -1.4 / +0.4 %). Traced from LitGPT's classes on the meta device
   (bench/litgpt_meta_trace.py: 18 models and target sets, 8 held out, and 5 run with dropout on
   CPU): median 0.1 %, worst 0.9 %. It took LitGPT's LoRA rows from PEFT's over-count (phi-2
   +80.2 %, TinyLlama +54.5 %, phi-1.5 +24..+43 %, Phi-3 +19.9 %) to -9.0..+1.6 %, and the
   config-hub QLoRA rows to -10.6..-16.0 %: their PEFT-style over-count had been hiding the next
   item. With the untied lm_head, Gemma 2B full on 4x A10G -37.1 % -> -19.4 %, and the tied-model
   LoRA / QLoRA rows it used to contradict now agree (Gemma 2B LoRA -8.2 %, QLoRA within 5 %).
17. **The previous step stays alive in LitGPT's loop** (`previous_step_kept`): `logits = model(...)`
   and `loss = chunked_cross_entropy(...)` are reassigned each iteration without `del`, so while the
   next forward runs the previous logits are alive and the previous loss keeps its graph, and with it
   every input bitsandbytes < 0.43.2 stored on its autograd ctx (MatMul4Bit's `ctx.tensors`, which
   backward does not free). The config hub draws batches at random, so two full-length batches in a
   row set the peak; the 2023 resource tables ran the longest batch first, with no step before it
   (`previous_step_kept: false` on those rows). Config-hub QLoRA: Llama 2 7B -11.3 % -> +0.3 %,
   Llama 3 / 3.1 8B -10.6 % -> +0.7 %, Mistral 7B -12.3 % -> +0.3 %, phi-2 -15.3 % -> +0.2 %,
   Phi-3 -16.0 % -> -3.4 %, TinyLlama -16.0 % -> -1.4 %; their LoRA rows rise by the logits alone
   (-4.5..-0.6 %).
18. **Usable memory is the driver's total less what it reserves** (gpus.yaml `driver_reserved_mib`):
   nvidia-smi -q lists "Reserved" apart from "Used" (763 MiB on an A100 80GB, 354 MiB on an RTX 4090),
   and PyTorch's out-of-memory message gives the rest as the card's capacity: 79.25 GiB and 23.64 GiB.
   Parts without a recorded figure take the median share of those with one (1.2 %). Fit verdicts near
   a card's limit move by 0.3-0.8 GiB; no published OOM or fit changes sides.
19. **What is left under-predicted** (4 rows) **and the missed OOM**: the FSDP nvidia-smi rows of
   fms's SantaCoder full fine-tune on 2 GPUs (-17.0 / -21.9 %), whose slack is 64-76 % of the
   allocated peak (the phase pool gives 27-31 %): the trace cannot show FSDP's other streams, whose
   freed blocks wait for them (record_stream); SantaCoder bs8 allocated (-12.2 %: the published growth
   per sequence is about twice what the model, exact on CPU under transformers 4.48.1, gives); LitGPT
   Gemma 2B full on 4x A10G (-19.4 %, explained since: item 24). fms's Llama 2 70B QLoRA on 2 GPUs at bs4 ran out of memory at
   79.5 GiB (nvidia-smi); the model puts its tensor peak at 67.5 GiB (its bs2 peak is within 0.2 %)
   and the verdict needs 71.9 GiB of the card's 79.25 GiB with the 5 % of slack that survives a
   free-and-retry. Replaying the layer backward of that run through the allocator's rules (a
   meta-device trace of Llama 2 70B's shapes with the held input gradients) leaves 8.5 GiB of slack
   after a free-and-retry at bs4 (5.3 GiB without the held gradients), which puts the run at 77 GiB:
   closer, but still not out of memory; FSDP's separate all-gather stream and bitsandbytes' kernels
   are not in the replay. torchtune rows still carry torch.compile (unmodelled).
20. **A run that fits only under pressure shows at most the card** (DeviceMemory.reserved_peak_bytes,
   device_total_bytes): when the free-running total exceeds the card but what survives the
   allocator's free-and-retry fits, the allocator frees and retries at the card's limit instead of
   growing, so reserved and nvidia-smi cannot show more than the card leaves. Yi 34B QLoRA on 2x
   RTX 3090 (reserved) +20.9 % -> -1.8 %, Mistral 7B full 1 GPU bs8 nvidia-smi +27.1 % -> +11.2 %,
   Llama 2 7B QLoRA bs10 +14.9 % -> +8.0 %; no verdict changes (it compares required_bytes).
21. **Held-out rows: fms-acceleration's accelerated-peft-bnb** (30 rows added after the model was
   fitted, never used to set a rule before this entry). Mistral 7B, Mixtral and Llama 2 70B:
   allocated -1.0..+4.8 %, nvidia-smi -7.6..+13.5 %. SantaCoder QLoRA came out at -52..-63 %: the
   QLoRA scenarios pass --bf16 over a bfloat16 model, and under autocast nn.LayerNorm returns fp32
   while bitsandbytes' Linear4bit returns its input's dtype, so a LayerNorm model's residual stream
   is fp32 (`autocast_16bit_weights`, framework_effects.py; RMSNorm models cast back and stay
   16-bit, which is why the Llama-family rows never showed it). With it SantaCoder QLoRA allocated
   is at -9.4..-11.7 %, with about 110 KB per token left, the same per-token shortfall as
   SantaCoder's full fine-tune at bs8 (-12.2 %): item 22. The Llama 2 70B accelerated bs4 OOM on 2
   GPUs is the same configuration as the baseline one (their bs2 figures are identical) and is
   missed the same way.
22. **SantaCoder's key/value cache under checkpointing** (`cache_under_checkpointing`, transformers
   < 4.53) and the 16-bit shifted copy of its own loss under autocast. gpt_bigcode's forward in
   4.48.1 has no "use_cache is incompatible with gradient checkpointing" override (every other
   supported architecture's has; 4.53's GradientCheckpointingLayer added it for all,
   transformers#38913), fms-hf-tuning 2.5.0 loads the model with the config's use_cache true, so
   every checkpointed layer returns `present = key_value`, a view of its fused c_attn output
   (q + k + v = 2304 wide), and the cache keeps all 24 outputs alive until the loss: 110.6 KB per
   token in bf16 (full fine-tune), 221 KB in the QLoRA rows, whose 4-bit c_attn returns the fp32
   stream's dtype. The same rows' loss under autocast shifts the bf16 logits and autocast then casts
   that copy to fp32, so the copy is 2 B per vocabulary entry, not 4 (98.6 KB per token less).
   Measured on CPU under 4.48.1 (bench/loss_versions_cpu.py, an 8-layer gpt_bigcode, bf16,
   checkpointed: -14.2 % without the cache, -1.9 % with it; bf16 autocast loss -0.5 %). With both,
   SantaCoder allocated is -0.2..+6.5 % on all 8 rows (full bs8 -12.2 -> -0.1 %, QLoRA -9.4..-11.7
   -> -0.1..+1.3 %). Its 2-GPU and QLoRA nvidia-smi rows stay 10-18 % under: nvidia-smi shows 1.6-1.9x
   the allocated peak on 2 GPUs (FSDP) and 1.4-1.5x for QLoRA on one, more than the allocator model
   grants (the full fine-tune on one GPU, 1.25-1.4x, is within 7 %).
   The model's own dropout (ModelSpec hidden/attention/embedding_dropout, 0.1 in SantaCoder's
   config, kept by the Trainer) adds its 1-byte CUDA masks too, small here under checkpointing.
23. **The missed OOM sits at the card's limit** (source fms-acceleration-a100-2024-10, 4 rows added
   after the model was set; no rule changed for them). One release earlier (transformers 4.45.2,
   accelerate 0.34.2) the same Llama 2 70B QLoRA run on 2 GPUs at bs4 trained: allocated peak
   72,625,788,416 B, which the model gives within 0.2 % (67.52 GiB), and nvidia-smi 81217 MiB, the
   whole card. The next release ran out of memory at that batch, and its bs2 run shows 443 MiB more
   on nvidia-smi for the same allocated peak. So the run needs the card to within a few hundred MiB,
   and which side it lands on depends on the release. The model's verdict needs 71.9 GiB with 5 %
   of surviving slack, about 7 GiB short of what this run needs. The allocator replay explains about
   5 GiB of that: 8.5 GiB of slack survives, against the 3.4 GiB that the 5 % allows. The rest is in
   what the replay cannot see. Telling the two releases apart needs the per-release overheads
   measured on a GPU to within 1 %. The release between them (9239802, 2024-11-14: accelerate
   1.0.1, transformers still 4.45.2) already ran out of memory at bs4, with its bs2 run 591 MiB
   lower on nvidia-smi than the release that fitted; accelerate 0.34.2 -> 1.0.1 resolves the same
   FSDP settings (backward_prefetch, limit_all_gathers, use_orig_params, sync_module_states), and
   the same release shows Mixtral's 2-GPU runs up to 6.8 GiB higher on nvidia-smi at identical
   allocated peaks: the difference is in the allocator's reserve, not in the tensors.
   What changed is how a quantised base reaches the GPUs. The release that fitted pinned
   fms-acceleration 8178cd5, whose bitsandbytes plugin made every rank load the whole quantised
   model itself (it patched transformers' is_local_dist_rank_0 to True, "Disabling low_cpu_mem_mode
   in the BNBAccelerationPlugin"); 9239802 pins 9cf8f65, after fc78b55 ("Fix Low CPU Memory Mode
   Issues for Quantized Peft") dropped that patch, so ranks above 0 build the model on the meta device
   and FSDP materialises each unit and receives rank 0's weights (sync_module_states); the GPTQ
   plugin changed the same way. The two releases' reference tables (refs/a100_80gb.csv at 97fc3c1 and
   9239802) split along exactly that line. The 2-GPU runs of a quantised base (34) moved on nvidia-smi
   at the same allocated peak (equal to the byte, or within 6 MB where Mixtral's routing varies):
   Mixtral 8x7B +4.9..+9.9 GiB with
   bitsandbytes and +0.6..+2.4 with GPTQ, Mistral 7B +0.2..+1.5, Llama 2 70B at bs2 -0.7..+2.3,
   SantaCoder under 0.15; and all five Llama 2 70B runs at bs4 (bitsandbytes, accelerated-peft-bnb
   with and without fused kernels, GPTQ with and without) trained in the first and ran out of memory
   in the second. The 16 runs without a quantised base moved by at most 0.36 GiB. So the OOM belongs
   to the loading path, which leaves the allocator's pool laid out differently from the first step on;
   it is no rule of sharded QLoRA at large: Answer.AI's fsdp_qlora loads the same way (low_memory:
   ranks above 0 on meta, rank 0's weights broadcast) and its 24 GB runs fit with 0.1-3 GiB to spare
   only because the allocator frees its cache and retries. How much of that reserve survives the
   retry is what `bench/cuda_memory.py --least-capacity` measures, and it needs two GPUs to measure
   this path; the model leaves the verdict as it is rather than fit a margin to one run.
24. **FSDP1's root-unit gradient** (`fsdp_flat_params`: FSDP1 for the HF Trainer before transformers
   5, Lightning's FSDPStrategy, fsdp_qlora; FSDP2 for torchtune). FSDP1's modules hold views of one
   flat parameter per unit, so autograd builds the unit's gradient by concatenating its parts once
   the last one arrives. For the root unit that is the embedding, at the very end of backward: the
   lm_head's gradient (waiting since the loss), the embedding's dense gradient and their
   concatenation (the whole root) are alive at once, beside the accumulated gradients, which are
   unsharded under no_sync. Measured on CPU with FSDP1 over gloo (bench/fsdp_flat_root_cpu.py,
   32k vocabulary): -23.5 % without the term, +1.6 % with it (sync -23.7 % -> +2.6 %). LitGPT full
   fine-tunes on several A10Gs: Gemma 2B (256k vocabulary, LitGPT's own lm_head copy) -19.4 % ->
   -0.5 %, StableLM 3B -5.5 % -> +1.2 %. Phi-2 and the fms full fine-tunes peak elsewhere and are
   unchanged.
25. **A paged optimizer's states are outside PyTorch's allocator** (`paged_optimizer`,
   core/memory/paged_states.py). bitsandbytes allocates the state of every parameter with at least
   1e5 elements with cudaMallocManaged (optim/optimizer.py get_state_buffer -> functional.get_paged);
   max_memory_allocated and max_memory_reserved never see it, and when the card runs short the
   driver evicts its pages to CPU RAM instead of failing. torchtune's Llama 3.1 8B full fine-tune on
   one RTX 4090 (PagedAdamW8bit stepped in backward) logged 18.9 GiB allocated; the model had the
   15 GiB of 8-bit states on the card: +80.5 % and "does not fit", the only fitting run it called a
   no-fit. Without them: +1.4 %, and it fits with 13.9 GiB of the states waiting in RAM. No other row
   uses a paged optimizer. The speed model charges the part in RAM one crossing of the host link per
   optimizer step (bench/published_speed.py: that run -18.5 % -> -31.7 %, beside -36.4 / -39.4 % for
   the same table's QLoRA and LoRA runs on that card, which page nothing; the table ran with
   torch.compile, which the speed model does not model).
26. **Held out: fms-acceleration's PowerLM-3B runs** (source fms-acceleration-a100-granite, 32 rows
   of a family the model had never seen, added after it was set; Granite support came with them:
   Llama's layout with multipliers that save nothing). Allocated, all 16: -1.1..+3.8 %, median |error| 0.6 %
   (full, LoRA, QLoRA with and without PEFT's cast, 1 and 2 GPUs), which also bears out the shapes
   taken from the paper. nvidia-smi on one GPU was under by 8.7-13.4 % for LoRA and QLoRA: their
   reserved-over-allocated slack is 25-32 % of the allocated peak, not the 15 % the model charged.
   With their 8 pairs the published unsharded pairs are 25, median 24.6 % (5.0-41.8 %; the first 17
   gave 15.8 %), and the share is re-derived by its rule: 25 % (overheads.SLACK_TRAINING). PowerLM
   nvidia-smi rows are then within -6.0..+11.0 %; Mixtral's one-GPU QLoRA rows, whose slack is
   7-10 %, go from -0.2..+7.0 % to +8.4..+16.2 %. Under more than 10 %: 11 rows (5.8 %) with the old share,
   5 (2.6 %) with the new. The fit verdict is unchanged (it keeps the 5 % that survives a
   free-and-retry); the free-running total, reserved and nvidia-smi figures grow with it.
27. **torchtune's chunked loss keeps every piece** (`loss: chunked`, core/memory/loss_kernels.py).
   CEWithChunkedOutputLoss upcasts one piece of the logits at a time but recomputes nothing: eager,
   every piece's fp32 log_softmax output is kept for the backward (4 B per vocabulary entry per
   token), beside the list of 16-bit logits the model returns; the model had taken the pieces as
   checkpointed, one alive at a time. On CPU, torchtune's pattern against the live-tensor counter
   (tests/memory/test_dora_loss_vision.py, a 16k vocabulary): full fp32 -12.6 % -> +0.2 %, full bf16
   -19.9 % -> -0.3 %, LoRA bf16 -50.3 % -> +0.3 %. The backward measured there also sums the lm_head's
   per-piece grads out of place (three copies at once from the second piece on, not two). The
   table's runs were compiled (`torch_compile: true`), and compile=True compiles the loss too:
   AOTAutograd's partition (Inductor's) keeps each piece's 16-bit logits and two fp32 per token and
   no fp32 copy (bench/results/compiled_loss_cpu.md: eager and compiled kept bytes equal the model's
   to the byte). torchtune's five rows: median +12.9 % before and after; 8B full +1.4 -> +5.9 %,
   70B full +35.1 -> +48.3 % (three unsharded lm_head grads under FSDP2; not modelled there: what
   compile does to the layers, and embeddings and output sharded as FSDP2 units of their own, which
   torchtune's configs can ask for), the other three unchanged.
28. **Each row names its tool as a user does** (`framework: litgpt@0.4.13`, `fms-hf-tuning@2.6`, ...:
   src/trainfit/data/frameworks.yaml through trainfit.core.frameworks, the resolver behind
   `--framework`). The per-row knobs and the data file's `frameworks:` section are gone: what differed
   between rows of one tool is a release (fms-hf-tuning 2.1 ran transformers 4.45, 2.6 ran 4.48;
   lit-gpt's 2023 scripts ran the longest batch first, litgpt 0.1-0.5.4 did not) or a plugin
   (fms-acceleration's accelerated-peft skips PEFT's fp32 cast). Six rows moved: fsdp_qlora's and
   the PEFT docs' QLoRA runs (2024-03) needed bitsandbytes >= 0.43.0 for its quant storage, and
   0.43.0 is a release whose 4-bit matmul keeps its input (fixed in 0.43.2), which the old data left
   unset: +0.6..+3.5 %. The same rows with no framework named (trainfit's own run) are reported
   beside them: median |error| 12 %, a third under-predicted by more than 10 %, 9 published OOMs
   predicted to fit.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only rows whose id contains this")
    args = ap.parse_args(argv)
    results, summary = run(args.only)
    if not args.only:
        slack = allocator_slack(load())
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "published_memory.json").write_text(
            json.dumps({"summary": summary, "allocator_slack": slack, "runs": results}, indent=1))
        (RESULTS / "published_memory.md").write_text(to_markdown(results, summary, FINDINGS, slack))
    print(json.dumps({k: v for k, v in summary.items() if not k.startswith("by_") and k != "no_framework"}, indent=1))
    own = summary["no_framework"]
    print(f"no framework: median |error| {own['median_abs_error']:.3f}, under -10 % {own['under_10pct_share']:.3f}, "
          f"OOMs predicted fitting {len(own['ooms_predicted_fitting'])}")
    for key in ("by_method", "by_gpus", "by_framework", "by_modelled"):
        print(key, {g: f"n={s['n']} med|e|={s['median_abs_error']:.3f} med={s['median_signed_error']:+.3f}"
                    for g, s in summary[key].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
