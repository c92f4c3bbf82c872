"""Held layer-input gradients at full size: fms-acceleration's Llama 2 70B FSDP QLoRA step, traced on the
meta device and replayed through the caching allocator's rules.

fms-acceleration's reference runs (transformers 4.48.1, HF Trainer, FSDP1 on 2 A100 80GB, reentrant
gradient checkpointing) fit Llama 2 70B QLoRA at micro-batch 2 (46.69 GB allocated) and ran out of
memory at micro-batch 4 (79.5 GiB on nvidia-smi). Reentrant checkpointing around FSDP units holds
every layer's input gradient until backward ends (trainfit.core.memory.framework_effects,
`held_layer_input_grads`; measured on CPU by bench/fsdp_reentrant_cpu.py). This script checks, at the
run's real shapes, (1) the extra memory the model charges for it and (2) how much allocator slack
survives a free-and-retry in that backward, which the fit verdict takes as 5 % of the tensor peak.

One process runs Llama 2 70B's shapes (80 layers, hidden 8192, MLP 28672, vocab 32000, bf16) on the
meta device with PEFT LoRA r=16 on q/k/v/o (bench/meta_trace.py's tracer, flash-attention 2 as the GPU
runs it), each decoder layer called through `checkpoint(..., use_reentrant=True)` as transformers 4.48
does, and each frozen q/k/v/o/MLP weight de-quantised into a 16-bit temporary in its forward and
backward, as bitsandbytes' 4-bit matmul does. "held" registers, in the recompute, a multi-grad hook
on the layer's input leaf and keeps its handle until backward ends: what FSDP's reshard-only hook
does for a frozen unit. FSDP's sharding, its all-gather stream and the packed 4-bit weights are not
in the trace: the frozen weights are static blocks here, so the figures compared are the traced
bytes above them and the slack in GiB.

Run:  .venv/bin/python bench/held_grads_replay.py
Writes bench/results/held_grads_replay.md and .json (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import meta_trace
import published_memory
from _allocator_replay import least_capacity, replay
from _results import write_results

from trainfit.core.setup import LoraSettings

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = ".venv/bin/python bench/held_grads_replay.py"
ROW = "fms-llama2-70b-bnb-2gpu-bs2"  # the published row whose model and settings are traced
SEQ_LEN = 4096
MICRO_BATCHES = (2, 4)
GIB = 2 ** 30
QUANTISED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def llama2_70b_row(doc: dict | None = None) -> dict:
    return next(r for r in (doc or published_memory.load())["runs"] if r["id"] == ROW)


def llama2_70b():
    doc = published_memory.load()
    return published_memory.model_for(llama2_70b_row(doc), doc.get("models", {}))


def _dequantised_linear():
    """A frozen linear whose weight is copied into a temporary for each matmul, forward and backward."""
    import torch

    class Dequantised(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight):
            ctx.weight = weight
            return x @ weight.clone().t()

        @staticmethod
        def backward(ctx, grad):
            return grad @ ctx.weight.clone(), None

    return Dequantised


def traced_setup(micro_batch: int):
    """LoRA q/k/v/o; checkpointing is off in transformers and placed around each layer by build()."""
    return meta_trace._s("lora", lora=LoraSettings(rank=16, alpha=16, dropout=0.0,
                                                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                         micro_batch=micro_batch, seq_len=SEQ_LEN, grad_checkpointing="none")


def build(spec, setup, held: bool, handles: list):
    import torch

    model = meta_trace.build(spec, setup)
    model.enable_input_require_grads()
    fn = _dequantised_linear()
    for name, module in model.named_modules():
        if name.endswith(QUANTISED + tuple(q + ".base_layer" for q in QUANTISED)) and isinstance(
                module, torch.nn.Linear) and not module.weight.requires_grad:
            module.forward = (lambda m: (lambda x: fn.apply(x, m.weight)))(module)

    class CheckpointAround(torch.nn.Module):
        """transformers < 4.52: the decoder layer's call (FSDP's unit) inside a reentrant checkpoint."""

        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, hidden_states, *args, **kwargs):
            def call(x):
                if held and torch.is_grad_enabled() and x.grad_fn is None:  # the recompute's input leaf
                    handles.append(torch.autograd.graph.register_multi_grad_hook([x], lambda grads: None))
                return self.layer(x, *args, **kwargs)

            return torch.utils.checkpoint.checkpoint(call, hidden_states, use_reentrant=True)

    layers = model.base_model.model.model.layers
    for i in range(len(layers)):
        layers[i] = CheckpointAround(layers[i])
    return model


def trace(spec, micro_batch: int, held: bool) -> tuple[meta_trace.MetaTrace, int]:
    """The traced step and the bytes of the model's parameters and buffers (static in the trace)."""
    handles: list = []
    setup = traced_setup(micro_batch)
    model = build(spec, setup, held, handles)
    everything = list(model.parameters()) + list(model.buffers())
    static = sum(t.untyped_storage().nbytes() for t in {id(t): t for t in everything}.values())
    # FSDP's end-of-backward callback drops the hooks
    return meta_trace.trace_model(model, setup, steps=1, after_backward=handles.clear), static


def predicted_held_bytes(spec, micro_batch: int) -> int:
    """The memory model's held input gradients: n - 1 bf16 hidden states."""
    return (spec.num_layers - 1) * 2 * spec.hidden_size * micro_batch * SEQ_LEN


def run() -> dict:
    meta_trace._register_flash_attention()
    spec = llama2_70b()
    rows = []
    for mb in MICRO_BATCHES:
        for held in (False, True):
            rec, static = trace(spec, mb, held)
            alloc = replay(rec.events)
            least = least_capacity(rec.events, free=alloc)
            rows.append(dict(micro_batch=mb, held=held, static_bytes=static,
                             traced_above_static_bytes=rec.traced_peak_bytes() - static,
                             replayed_slack_bytes=alloc.reserved_peak - alloc.allocated_peak,
                             surviving_slack_bytes=least - alloc.allocated_peak))
            print(f"micro-batch {mb} held={held}: above static {rows[-1]['traced_above_static_bytes'] / GIB:.2f} GiB, "
                  f"slack {rows[-1]['replayed_slack_bytes'] / GIB:.2f} GiB, after free-and-retry "
                  f"{rows[-1]['surviving_slack_bytes'] / GIB:.2f} GiB", flush=True)
    held_rows = []
    for mb in MICRO_BATCHES:
        off, on = (next(r for r in rows if r["micro_batch"] == mb and r["held"] is h) for h in (False, True))
        held_rows.append(dict(micro_batch=mb, traced_bytes=on["traced_above_static_bytes"] - off[
            "traced_above_static_bytes"], predicted_bytes=predicted_held_bytes(spec, mb)))
    return dict(model=llama2_70b_row()["model"], runs=rows, held=held_rows)


def to_markdown(doc: dict) -> str:
    lines = ["# Held layer-input gradients at full size: traced on the meta device, replayed", "",
             f"Command: `{COMMAND}`. Model: {doc['model']} shapes, LoRA r=16 on q/k/v/o, {SEQ_LEN} tokens per "
             "sequence, reentrant checkpoint around each decoder layer, 4-bit de-quantisation emulated; "
             "GiB = 2^30 bytes.", "",
             "| micro-batch | held input gradients | traced above the static weights GiB | replayed slack GiB | "
             "slack after a free-and-retry GiB |", "|---:|---|---:|---:|---:|"]
    for r in doc["runs"]:
        held = "yes" if r["held"] else "no"
        lines.append(f"| {r['micro_batch']} | {held} | {r['traced_above_static_bytes'] / GIB:.2f} "
                     f"| {r['replayed_slack_bytes'] / GIB:.2f} | {r['surviving_slack_bytes'] / GIB:.2f} |")
    lines += ["", "What holding the gradients adds, traced vs the memory model ((layers - 1) x hidden x tokens x 2 B):",
              "", "| micro-batch | traced GiB | predicted GiB | error % |", "|---:|---:|---:|---:|"]
    for r in doc["held"]:
        err = (r["predicted_bytes"] - r["traced_bytes"]) / r["traced_bytes"] * 100
        lines.append(f"| {r['micro_batch']} | {r['traced_bytes'] / GIB:.2f} | {r['predicted_bytes'] / GIB:.2f} "
                     f"| {err:+.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where to write held_grads_replay.{md,json}")
    args = ap.parse_args(argv)
    doc = run()
    write_results(args.out_dir, "held_grads_replay", doc, to_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
