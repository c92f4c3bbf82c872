"""What FSDP2 holds gathered in each phase of a step, measured on CPU at emulated world sizes.

trainfit's FSDP memory (core/memory/fsdp.py, gathered_by_phase) says what a rank holds unsharded in
each phase of the step: the root unit and the current and next layer in the forward; the root and
the last layer, prefetched, at the loss's backward; in a layer's backward the root, two layers and
two layers' gradients (FSDP2 keeps the previous unit's reduce-scatter input until the next reduce);
nothing at the optimizer step. Which phase holds the peak then depends on the shapes: the loss at a
large vocabulary, a layer's backward where the units are large next to the activations.

Each case here is one fresh process running rank 0 of 2, 4 or 8 FSDP2 ranks (fully_shard per decoder
layer and the root, fp32, torch's AdamW) in torch's fake process group (bench/_cuda_harness.py's CPU
mode: every buffer FSDP allocates, no data moved), a tiny Llama of the catalog's features at a few
widths, vocabularies and micro-batches, with and without full checkpointing, full fine-tune and LoRA.
The peak is the live-tensor counter's over two steps (FSDP2's DTensor shards and in-place storage
resizes counted); the prediction is estimate_memory's tensor peak for the same TrainingSetup.

Run:  .venv/bin/python bench/fsdp_phases_cpu.py
Writes bench/results/fsdp_phases_cpu.md and .json (about two minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import _cuda_harness as harness
from _results import write_results

from trainfit.core.memory.phases import peak_phase

COMMAND = ".venv/bin/python bench/fsdp_phases_cpu.py"
LORA = harness.LoraSettings(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def cases() -> list[harness.Case]:
    """(world, method, micro-batch, sequence, checkpointing, layers, hidden, vocab)."""
    grid = [
        (2, "full", 2, 128, "none", 4, 256, 4096),  # the loss's backward at a large vocabulary
        (4, "full", 2, 128, "none", 4, 256, 4096),
        (2, "full", 1, 64, "none", 4, 256, 512),  # a layer's backward: units large next to activations
        (8, "full", 2, 64, "none", 4, 256, 512),
        (2, "full", 2, 128, "full", 4, 256, 4096),
        (4, "full", 1, 128, "full", 4, 256, 4096),
        (2, "full", 4, 256, "full", 4, 256, 512),
        (2, "full", 2, 128, "none", 6, 384, 8192),
        (2, "lora", 2, 128, "none", 4, 256, 4096),  # a frozen base: no gradient to reduce
        (4, "lora", 4, 128, "full", 4, 256, 4096),
    ]
    out = []
    for world, method, mb, seq, ckpt, layers, hidden, vocab in grid:
        setup = harness._sharded(world, method, precision="fp32", micro_batch=mb, seq_len=seq, device="cpu",
                                 grad_checkpointing=ckpt, **({"lora": LORA} if method == "lora" else {}))
        name = f"x{world} {method} b{mb} s{seq} {ckpt}-ckpt L{layers} h{hidden} v{vocab}"
        out.append(harness.Case(name, "llama3.2-1b", setup, engine="fsdp", cpu_shape=(layers, hidden, vocab)))
    return out


def measure(case: harness.Case, workdir: Path) -> dict:
    measured = harness.run_case_subprocess(case, "cpu", 1, 1, workdir)
    predicted = harness.predict(case, "cpu", "cpu")
    phase = peak_phase(predicted.get("notes", []))
    row = {"config": case.name, "world": case.setup.num_gpus, "method": case.setup.method,
           "status": measured["status"], "measured_bytes": measured.get("max_memory_allocated_bytes"),
           "predicted_bytes": predicted.get("tensor_peak_bytes"), "predicted_phase": phase,
           "gathered_at_peak_bytes": (predicted.get("components") or {}).get("fsdp_gathered")}
    row["error_pct"] = harness.signed_error_pct(row["predicted_bytes"], row["measured_bytes"])
    if measured["status"] != "ok":
        row["detail"] = measured.get("stderr_tail") or measured.get("reason")
    return row


def report(rows: list[dict]) -> tuple[dict, str]:
    errors = [r["error_pct"] for r in rows if r["error_pct"] is not None]
    summary = {"cases": len(rows), "measured": len(errors),
               "median_abs_error_pct": round(statistics.median(abs(e) for e in errors), 2) if errors else None,
               "max_abs_error_pct": round(max(abs(e) for e in errors), 2) if errors else None}
    mib = 2**20
    lines = [
        "# FSDP2's gathered units by phase: measured on CPU at emulated world sizes vs the memory model",
        "",
        f"Command: `{COMMAND}` (rank 0 of N FSDP2 ranks in torch's fake process group, one process per case; "
        "tiny Llama, fp32, AdamW; live-tensor peak over two steps; MiB = 2^20 bytes; error = (predicted - "
        "measured) / measured).",
        "",
        f"Summary: {summary['measured']} of {summary['cases']} cases measured, median |error| "
        f"{summary['median_abs_error_pct']} %, worst {summary['max_abs_error_pct']} %.",
        "",
        "| case | measured MiB | predicted MiB | error % | predicted peak phase | gathered at it MiB |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        def f(v):
            return f"{v / mib:.2f}" if v is not None else "-"
        err = f"{r['error_pct']:+.1f}" if r["error_pct"] is not None else r["status"]
        lines.append(f"| {r['config']} | {f(r['measured_bytes'])} | {f(r['predicted_bytes'])} | {err} | "
                     f"{r['predicted_phase']} | {f(r['gathered_at_peak_bytes'])} |")
    lines += ["", "What is not here: NCCL's buffers and the CUDA allocator (bench/cuda_memory.py measures the same "
              "emulated ranks on a GPU), and the all-gather stream running ahead of compute, which on a GPU can "
              "hold the next layer's buffer a little earlier than on the CPU."]
    return summary, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the cases whose name contains this text")
    ap.add_argument("--out-dir", type=Path, default=harness.RESULTS)
    args = ap.parse_args(argv)
    selected = [c for c in cases() if not args.only or args.only in c.name]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in selected:
            row = measure(case, Path(tmp))
            rows.append(row)
            print(f"{case.name:45s} {row['status']:8s} error {row['error_pct']} % ({row['predicted_phase']})",
                  file=sys.stderr)
    summary, md = report(rows)
    write_results(args.out_dir, "fsdp_phases_cpu", {"command": COMMAND, "summary": summary, "rows": rows}, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
