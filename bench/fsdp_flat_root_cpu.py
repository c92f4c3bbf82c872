"""FSDP1's root-unit gradient at the end of backward, measured on this CPU against the memory model.

Checks the memory model's `fsdp_flat_params` term (trainfit.core.memory.fsdp.flat_root_bytes). FSDP1
(torch's FullyShardedDataParallel: Accelerate's fsdp_version 1, Lightning's FSDPStrategy) flattens each
wrapped unit's parameters into one FlatParameter and hands the modules views of it, so autograd
builds the flat gradient in the split's backward: it waits for every part, then concatenates them.
For the root unit (embeddings, final norm, an untied lm_head) the lm_head's gradient arrives with the
loss and waits through every layer; when the embedding's dense gradient arrives, both parts and
their concatenation (the whole root in the gradient dtype) are alive at once.

Two processes on this CPU (gloo, OMP_NUM_THREADS=1) build the same tiny Llama with a 32k vocabulary
and untied embeddings (the root is 84 % of the parameters, so the term is large next to the rest),
wrap each decoder layer with FSDP1 FULL_SHARD (use_orig_params=True, as Accelerate and Lightning
do), fp32, AdamW (foreach=False), grad_accum 4 of one 64-token sequence, no checkpointing. One warm-up
step, then the measured one, in two modes: no_sync (FSDP1's `no_sync()` for micro-batches 1-3, what
the HF Trainer and Lightning Fabric do) and sync (a reduce-scatter after every micro-batch). Rank 0
counts live tensor bytes (bench/fsdp_no_sync_cpu.py's counter, with FSDP1's storage resizes reported
as bench/fsdp_reentrant_cpu.py does) and reports the peak of each micro-batch and of the step.

The prediction is `estimate_memory` for the same setup with fsdp_flat_params True (FSDP1) and False
(FSDP2's per-parameter gradients, what the model gave every FSDP run before); the tensor peak is
compared (device "cuda" as in bench/fsdp_no_sync_cpu.py: no tensor term here depends on it).

Run:  .venv/bin/python bench/fsdp_flat_root_cpu.py [--out-dir DIR]
Writes bench/results/fsdp_flat_root_cpu.md and .json (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import os
import tempfile
import warnings
from pathlib import Path

import fsdp_no_sync_cpu as no_sync_bench
from _results import write_results
from fsdp_reentrant_cpu import fsdp1_storage_reported

from trainfit.core.memory import estimate_memory

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = ".venv/bin/python bench/fsdp_flat_root_cpu.py"
WORLD = 2
GRAD_ACCUM = 4
SEQ_LEN = 64
MODES = ("no_sync", "sync")
VOCAB = 32768  # bench/fsdp_no_sync_cpu.py's tiny Llama (untied) with a larger vocabulary
CONFIG = {**no_sync_bench.CONFIG, "vocab_size": VOCAB}
MIB = 2 ** 20


def predict(mode: str, flat: bool) -> int:
    setup = dataclasses.replace(no_sync_bench.make_setup(mode == "no_sync", seq_len=SEQ_LEN), fsdp_flat_params=flat)
    return estimate_memory(no_sync_bench.tiny_spec(vocab_size=VOCAB), setup, None).devices[0].tensor_peak_bytes


def _worker(rank: int, port: int, mode: str, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(LlamaConfig(**CONFIG, use_cache=False, attention_dropout=0.0),
                                          attn_implementation="sdpa", dtype=torch.float32)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    fsdp = FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                device_id=torch.device("cpu"))
    fsdp.train()
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-4, foreach=False, fused=False)
    gen = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randint(0, CONFIG["vocab_size"], (1, SEQ_LEN), generator=gen) for _ in range(2 * GRAD_ACCUM)]
    counter = no_sync_bench.FsdpTensorCounter() if rank == 0 else None
    peaks: list[int] = []

    def step(index: int, measured: bool) -> None:
        for micro in range(GRAD_ACCUM):
            accumulating = mode == "no_sync" and micro < GRAD_ACCUM - 1
            with fsdp.no_sync() if accumulating else contextlib.nullcontext():
                if counter is not None and measured:
                    counter.reset_peak()
                ids = batches[index * GRAD_ACCUM + micro]
                loss = fsdp(input_ids=ids, labels=ids).loss
                (loss / GRAD_ACCUM).backward()
                del loss
                gc.collect()  # gloo's work objects can sit in reference cycles
                if counter is not None and measured:
                    peaks.append(counter.peak_bytes)
        if counter is not None and measured:
            counter.reset_peak()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if counter is not None and measured:
            peaks.append(counter.peak_bytes)

    if counter is None:
        step(0, False)
        step(1, False)
    else:
        with warnings.catch_warnings():  # isinstance on some library objects warns
            warnings.simplefilter("ignore")
            counter.track_existing(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
        with fsdp1_storage_reported(counter), counter:
            step(0, False)
            step(1, True)
        Path(out_path).write_text(json.dumps(dict(peaks_bytes=peaks, torch=torch.__version__)))
    dist.destroy_process_group()


def measure(mode: str) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        mp.spawn(_worker, args=(no_sync_bench._free_port(), mode, str(out)), nprocs=WORLD, join=True)
        return json.loads(out.read_text())


def run() -> dict:
    rows = []
    torch_version = None
    for mode in MODES:
        measured = measure(mode)
        torch_version = measured["torch"]
        peak = max(measured["peaks_bytes"])
        flat, per_param = predict(mode, True), predict(mode, False)
        rows.append(dict(mode=mode, peaks_bytes=measured["peaks_bytes"], measured_bytes=peak,
                         predicted_flat_bytes=flat, predicted_per_param_bytes=per_param,
                         error_flat_pct=round(100 * (flat - peak) / peak, 2),
                         error_per_param_pct=round(100 * (per_param - peak) / peak, 2)))
    return dict(command=COMMAND, torch=torch_version, config=CONFIG, world=WORLD, grad_accum=GRAD_ACCUM,
                seq_len=SEQ_LEN, rows=rows)


def to_markdown(doc: dict) -> str:
    lines = [
        "# FSDP1's root-unit gradient at the end of backward: measured on CPU vs the memory model",
        "",
        f"Command: `{doc['command']}` (torch {doc['torch']}, FSDP1 FULL_SHARD over gloo, {doc['world']} CPU "
        f"processes; tiny Llama, vocab {doc['config']['vocab_size']}, hidden {doc['config']['hidden_size']}, "
        f"{doc['config']['num_hidden_layers']} layers, untied embeddings; fp32, AdamW, grad_accum "
        f"{doc['grad_accum']} x one {doc['seq_len']}-token sequence; rank 0 live tensor bytes; MiB = 2^20 bytes).",
        "",
        "| mode | peak per micro-batch, then the optimizer step (MiB) | measured peak MiB | model, FSDP1 (flat) MiB | "
        "error % | model without the term MiB | error % |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        peaks = " / ".join(f"{p / MIB:.1f}" for p in r["peaks_bytes"])
        lines.append(f"| {r['mode']} | {peaks} | {r['measured_bytes'] / MIB:.2f} | {r['predicted_flat_bytes'] / MIB:.2f} | "
                     f"{r['error_flat_pct']:+.1f} | {r['predicted_per_param_bytes'] / MIB:.2f} | "
                     f"{r['error_per_param_pct']:+.1f} |")
    lines += [
        "",
        "The peak is the end of a micro-batch's backward, at the embedding: the lm_head's gradient (held since",
        "the loss), the embedding's dense gradient and their concatenation into the root's flat gradient are",
        "alive at once, on top of the accumulated gradients (unsharded under no_sync). Without the term the",
        "model puts the peak a quarter too low. FSDP2 keeps one gradient per parameter and",
        "bench/fsdp_no_sync_cpu.py measures it without such a peak.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    doc = run()
    write_results(args.out_dir, "fsdp_flat_root_cpu", doc, to_markdown(doc))
    print(to_markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
