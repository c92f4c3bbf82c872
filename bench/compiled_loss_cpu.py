"""What cross_entropy(logits.float()) keeps for its backward, eager and under torch.compile, on this CPU.

torchtune's CEWithChunkedOutputLoss upcasts one piece of 16-bit logits at a time and runs
cross_entropy on it; with compile=True its recipes compile that step (compute_cross_entropy). Eager,
log_softmax keeps its fp32 output for the backward (4 B per vocabulary entry per token); compiled,
AOTAutograd's min-cut partition decides what the backward reads. This script records the tensors
autograd packs for the backward (torch.autograd.graph.saved_tensors_hooks) for one piece, under
eager, the partitioner alone (backend aot_eager_decomp_partition) and Inductor, in bf16 and fp32, and
the memory model's figure for the same piece (trainfit.core.memory.loss_kernels, loss "chunked",
with and without TrainingSetup.torch_compile). A tensor that shares the logits' storage is the
logits themselves: kept alive by the backward, not a new allocation.

It also compiles a whole two-layer transformers Llama called with labels (its loss inside the graph)
and records the vocabulary-sized tensors kept: trainfit's `standard` loss under torch_compile.

Run:  .venv/bin/python bench/compiled_loss_cpu.py        (Inductor needs a C++ compiler; a minute or two)
Writes bench/results/compiled_loss_cpu.{md,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from _results import write_results

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = ".venv/bin/python bench/compiled_loss_cpu.py"
TOKENS, VOCAB = 512, 16384
BACKENDS = ("eager", "aot_eager_decomp_partition", "inductor")


def saved_for_backward(backend: str, dtype_name: str, tokens: int = TOKENS, vocab: int = VOCAB) -> dict:
    """Bytes autograd keeps for the backward of one piece's cross-entropy, and how many of them are
    the logits' own storage."""
    import torch
    import torch.nn.functional as F

    def ce(logits, labels):
        return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")

    torch._dynamo.reset()
    fn = ce if backend == "eager" else torch.compile(ce, backend=backend)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=gen).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    seen: dict[int, tuple[int, bool]] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = (storage.nbytes(), storage.data_ptr() == logits.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(logits, labels)
    loss.backward()
    labels_bytes = labels.untyped_storage().nbytes()
    kept = sum(n for ptr, (n, own) in seen.items() if ptr != labels.untyped_storage().data_ptr())
    return {"backend": backend, "dtype": dtype_name, "tokens": tokens, "vocab": vocab,
            "saved_bytes": kept, "of_which_logits_bytes": sum(n for n, own in seen.values() if own),
            "labels_bytes": labels_bytes, "grad_dtype": str(logits.grad.dtype).replace("torch.", "")}


def whole_model_vocab_saved(backend: str, tokens_per_seq: int = 128, vocab: int = 4096) -> dict:
    """A whole transformers Llama (2 layers, bf16) called with labels, eager or compiled: the
    vocabulary-sized tensors autograd keeps for the backward (the loss's; parameters left out)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch._dynamo.reset()
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    fn = model if backend == "eager" else torch.compile(model, backend=backend)
    ids = torch.randint(0, vocab, (2, tokens_per_seq), generator=torch.Generator().manual_seed(0))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, tuple[int, str]] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if t.dim() >= 2 and t.shape[-1] == vocab and ptr not in params:
            kept[ptr] = (t.untyped_storage().nbytes(), str(t.dtype).replace("torch.", ""))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(input_ids=ids, labels=ids)
    out.loss.backward()
    return {"backend": backend, "tokens": 2 * tokens_per_seq, "vocab": vocab,
            "vocab_sized_saved_bytes": sum(n for n, _ in kept.values()),
            "dtypes": sorted({d for _, d in kept.values()})}


def predicted_kept_per_token(dtype_name: str, compiled: bool, tokens: int = TOKENS, vocab: int = VOCAB,
                             loss: str = "chunked") -> float:
    """The memory model's bytes kept per token by the loss (LossTerms.saved / tokens)."""
    from trainfit.core.memory.loss_kernels import loss_terms
    from trainfit.core.models.catalog import get_model
    from trainfit.core.setup import LoraSettings, TrainingSetup

    spec = dataclasses.replace(get_model("llama3.2-1b"), vocab_size=vocab, exact_params=None)
    setup = TrainingSetup(method="lora", lora=LoraSettings(), precision="bf16" if dtype_name == "bfloat16" else "fp32",
                          loss=loss, torch_compile=compiled, device="cpu")
    return loss_terms(spec, setup, tokens, head_trains=False).saved / tokens


def run() -> dict:
    rows = []
    for dtype_name in ("bfloat16", "float32"):
        for backend in BACKENDS:
            row = saved_for_backward(backend, dtype_name)
            row["predicted_bytes"] = predicted_kept_per_token(dtype_name, backend != "eager") * TOKENS
            rows.append(row)
            print(f"{dtype_name:9s} {backend:28s} saved {row['saved_bytes']:>10,} B "
                  f"(logits' own {row['of_which_logits_bytes']:>10,}), predicted {row['predicted_bytes']:>12,.0f}",
                  flush=True)
    whole = []
    for backend in BACKENDS:
        row = whole_model_vocab_saved(backend)
        whole.append(row)
        print(f"whole model {backend:28s} vocabulary-sized saved {row['vocab_sized_saved_bytes']:>10,} B "
              f"{row['dtypes']}", flush=True)
    import torch

    return {"torch": torch.__version__, "tokens": TOKENS, "vocab": VOCAB, "rows": rows, "whole_model": whole}


def to_markdown(doc: dict) -> str:
    lines = ["# What cross_entropy(logits.float()) keeps for backward: eager vs torch.compile (CPU)", "",
             f"Command: `{COMMAND}` (torch {doc['torch']}). One piece of {doc['tokens']} tokens x {doc['vocab']} "
             "vocabulary; saved = the storages autograd packs for the backward (labels left out); "
             "\"logits' own\" = the part that is the logits' own storage (kept alive, not allocated); "
             "predicted = trainfit's loss \"chunked\" kept bytes for the piece (torch_compile for the "
             "compiled backends).", "",
             "| logits dtype | backend | saved B | of which the logits' own B | predicted B | grad dtype |",
             "|---|---|---:|---:|---:|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['dtype']} | {r['backend']} | {r['saved_bytes']:,} | {r['of_which_logits_bytes']:,} | "
                     f"{r['predicted_bytes']:,.0f} | {r['grad_dtype']} |")
    lines += ["", "Eager keeps log_softmax's fp32 output (4 B per entry); the compiled partition keeps the "
              "logits themselves and two fp32 per token (max and log-sum-exp), and recomputes the softmax "
              "in the backward.", "",
              "A whole transformers Llama (2 layers, hidden 128, bf16) called with labels, so its loss is in "
              "the compiled graph: the vocabulary-sized tensors kept for the backward (parameters left out). "
              "trainfit's `standard` loss under torch_compile keeps the 16-bit logits (2 B per entry).", "",
              "| backend | tokens | vocabulary | kept B | per token and entry | dtypes |", "|---|---:|---:|---:|---:|---|"]
    for r in doc.get("whole_model", []):
        per = r["vocab_sized_saved_bytes"] / (r["tokens"] * r["vocab"])
        lines.append(f"| {r['backend']} | {r['tokens']} | {r['vocab']} | {r['vocab_sized_saved_bytes']:,} | "
                     f"{per:.2f} | {', '.join(r['dtypes'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    doc = run()
    write_results(args.out_dir, "compiled_loss_cpu", doc, to_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
