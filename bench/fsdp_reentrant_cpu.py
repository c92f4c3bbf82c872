"""Reentrant gradient checkpointing around FSDP units, measured on this CPU against the memory model.

Checks the memory model's `reentrant_checkpoint_around_fsdp_units` term
(trainfit.core.runtime, `Runtime.held_layer_input_grads`): transformers before 4.52
checkpoints each decoder layer's `__call__`, which under FSDP1 is the FSDP unit's call, with a
reentrant checkpoint by default. In backward the recompute runs FSDP's pre-forward on the
checkpoint's detached input, a leaf; for a unit whose parameters are all frozen (LoRA with PEFT's
wrap policy) FSDP registers its reshard-only hook on that leaf and keeps the handle until backward
ends, so every layer's input and its gradient stay alive: one more hidden-state tensor per layer
and token at the peak. transformers 4.52's GradientCheckpointingLayer checkpoints inside the unit.

Two processes on this CPU (gloo, OMP_NUM_THREADS=1) build the same tiny Llama (LlamaForCausalLM
from a LlamaConfig, random weights, fp32), add PEFT LoRA on q/k/v/o, wrap it with FSDP1
(FullyShardedDataParallel, FULL_SHARD, PEFT's fsdp_auto_wrap_policy, use_orig_params=True: what the
HF Trainer does for a PEFT model) and step AdamW (foreach=False) on one batch. Three placements of
the checkpoint, each at 8 and 16 layers:

* inside: transformers' own gradient checkpointing (the installed release has
  GradientCheckpointingLayer), reentrant;
* around: transformers' checkpointing off, each FSDP-wrapped decoder layer called through
  `torch.utils.checkpoint.checkpoint(unit, ..., use_reentrant=True)`, which is what
  `self._gradient_checkpointing_func(decoder_layer.__call__, ...)` does before 4.52;
* around-non-reentrant: the same with use_reentrant=False (PEFT's run_peft_fsdp.sh).

Rank 0 counts live tensor storage bytes through the second step (the live-tensor counter of
bench/fsdp_no_sync_cpu.py, FsdpTensorCounter). FSDP1 frees an unsharded flat parameter by resizing its storage to 0 and gathers
into it again, which no op reports: `fsdp1_storage_reported` tells the counter. The prediction is `estimate_memory(...)` with the flag set
for "around" (device "cuda": the memory model refuses FSDP on "cpu"; for-loop AdamW and fp32, so no
tensor term depends on the device). The checked figures are the differences between placements and
the growth per layer; the absolute peaks are reported too.

Run:  .venv/bin/python bench/fsdp_reentrant_cpu.py
Writes bench/results/fsdp_reentrant_cpu.md and .json (about 2 minutes on 2 cores: 6 launches of about
20 s; launching each run three times gave the same bytes every time).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from _results import write_results  # noqa: E402
from fsdp_no_sync_cpu import FsdpTensorCounter, _free_port  # noqa: E402

from trainfit.core.memory import estimate_memory  # noqa: E402
from trainfit.core.memory.phases import peak_phase  # noqa: E402
from trainfit.core.models.loader import spec_from_config  # noqa: E402
from trainfit.core.models.spec import ModelSpec  # noqa: E402
from trainfit.core.setup import LoraSettings, TrainingSetup  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = ".venv/bin/python bench/fsdp_reentrant_cpu.py"
PLACEMENTS = ("inside", "around", "around-non-reentrant")
LAYERS = (8, 16)
WORLD = 2
MICRO_BATCH = 2
SEQ_LEN = 512
LORA_RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
# Small weights and a small vocabulary next to the batch, so that the hidden states (0.5 MiB each) and
# not the gathered parameters or the logits decide the peak.
CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4,
              num_key_value_heads=4, tie_word_embeddings=False)
MIB = 2 ** 20


# -- prediction (pure: no torch.distributed) -------------------------------------------------------
def config_dict(layers: int) -> dict:
    from transformers import LlamaConfig

    data = LlamaConfig(**CONFIG, num_hidden_layers=layers, use_cache=False, attention_dropout=0.0).to_dict()
    data["torch_dtype"] = data["dtype"] = "float32"
    return data


def tiny_spec(layers: int) -> ModelSpec:
    return spec_from_config(config_dict(layers), origin="bench/fsdp_reentrant_cpu.py CONFIG",
                            model_id=f"bench:tiny-llama-{layers}")


def make_setup(placement: str) -> TrainingSetup:
    """The measured run; only the reentrant checkpoint around the units is a memory knob."""
    return TrainingSetup(method="lora", precision="fp32", optimizer="adamw", micro_batch=MICRO_BATCH,
                         seq_len=SEQ_LEN, grad_checkpointing="full", num_gpus=WORLD, zero_stage=3,
                         fsdp_strategy="full-shard", device="cuda", optimizer_impl="for-loop", attention="sdpa",
                         lora=LoraSettings(rank=LORA_RANK, target_modules=TARGETS),
                         reentrant_checkpoint_around_fsdp_units=placement == "around")


def predict(layers: int, placement: str) -> dict:
    est = estimate_memory(tiny_spec(layers), make_setup(placement))
    phase = peak_phase(est.notes)
    return dict(tensor_peak_bytes=float(est.devices[0].tensor_peak_bytes), peak_phase=phase)


def hidden_state_bytes() -> int:
    """One fp32 hidden-state tensor of the measured batch."""
    return MICRO_BATCH * SEQ_LEN * CONFIG["hidden_size"] * 4


# -- measurement ----------------------------------------------------------------------------------
@contextlib.contextmanager
def fsdp1_storage_reported(counter: FsdpTensorCounter):
    """Report FSDP1's in-place storage resizes to `counter`: it frees an unsharded flat parameter with
    `storage.resize_(0)` and gathers into the same storage again (torch.distributed.fsdp._flat_param's
    `_free_storage` / `_alloc_storage`), which no op shows the dispatch mode."""
    from torch.distributed.fsdp import _flat_param

    orig_alloc, orig_free = _flat_param._alloc_storage, _flat_param._free_storage

    def alloc(tensor, size):
        orig_alloc(tensor, size)
        counter.storage_allocated(tensor)

    def free(tensor):
        counter.storage_freed(tensor)
        orig_free(tensor)

    _flat_param._alloc_storage, _flat_param._free_storage = alloc, free
    try:
        yield
    finally:
        _flat_param._alloc_storage, _flat_param._free_storage = orig_alloc, orig_free


def _checkpointed_units(model, use_reentrant: bool) -> None:
    """transformers < 4.52's placement: each FSDP-wrapped decoder layer called through a checkpoint."""
    import torch

    class CheckpointAround(torch.nn.Module):
        def __init__(self, unit):
            super().__init__()
            self.unit = unit

        def forward(self, hidden_states, *args, **kwargs):
            call = functools.partial(self.unit, *args, **kwargs)
            return torch.utils.checkpoint.checkpoint(call, hidden_states, use_reentrant=use_reentrant)

    layers = model.get_base_model().model.layers
    for i in range(len(layers)):
        layers[i] = CheckpointAround(layers[i])


def _worker(rank: int, port: int, layers: int, placement: str, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig.from_dict(config_dict(layers)))
    if placement == "inside":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()  # what PEFT / TRL do for a reentrant checkpoint
    model = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS))
    fsdp = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), sharding_strategy=ShardingStrategy.FULL_SHARD,
                use_orig_params=True, device_id=torch.device("cpu"))
    if placement != "inside":
        _checkpointed_units(model, use_reentrant=placement == "around")
    fsdp.train()
    opt = torch.optim.AdamW([p for p in fsdp.parameters() if p.requires_grad], lr=1e-4, foreach=False)
    ids = torch.randint(0, CONFIG["vocab_size"], (MICRO_BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(rank))
    result = {}
    for step in range(2):
        gc.collect()
        counter = FsdpTensorCounter()
        with warnings.catch_warnings():  # isinstance on some library objects warns
            warnings.simplefilter("ignore")
            counter.track_existing(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
        start = counter.current_bytes
        counter.reset_peak()
        with fsdp1_storage_reported(counter), counter:
            loss = fsdp(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        result = dict(start_bytes=start, peak_bytes=counter.peak_bytes, step_peak_bytes=counter.peak_bytes - start)
    if rank == 0:
        Path(out_path).write_text(json.dumps(result))
    dist.destroy_process_group()


def measure(layers: int, placement: str) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rank0.json")
        mp.spawn(_worker, args=(_free_port(), layers, placement, out), nprocs=WORLD)
        return json.loads(Path(out).read_text())


# -- comparison and report ------------------------------------------------------------------------
def compare(measured: dict, predicted: dict) -> list[dict]:
    """Differences that isolate the placement: each placement vs "inside", and the growth of the peak per
    layer. measured / predicted: {(layers, placement): {"peak_bytes" / "tensor_peak_bytes": ...}}."""
    def m(key):
        return measured[key]["peak_bytes"]

    def p(key):
        return predicted[key]["tensor_peak_bytes"]

    rows = []
    for layers in LAYERS:
        for placement in PLACEMENTS[1:]:
            rows.append((f"{layers} layers: {placement} - inside", m((layers, placement)) - m((layers, "inside")),
                         p((layers, placement)) - p((layers, "inside"))))
    lo, hi = LAYERS
    for placement in PLACEMENTS:
        rows.append((f"{placement}: growth per layer", (m((hi, placement)) - m((lo, placement))) / (hi - lo),
                     (p((hi, placement)) - p((lo, placement))) / (hi - lo)))
    out = []
    for quantity, mv, pv in rows:
        out.append(dict(quantity=quantity, measured_bytes=round(mv), predicted_bytes=round(pv),
                        measured_hidden_states=round(mv / hidden_state_bytes(), 2),
                        predicted_hidden_states=round(pv / hidden_state_bytes(), 2)))
    return out


def run() -> dict:
    keys = [(layers, placement) for layers in LAYERS for placement in PLACEMENTS]
    measured = {k: measure(*k) for k in keys}
    predicted = {k: predict(*k) for k in keys}
    import torch
    import transformers

    return dict(
        torch=torch.__version__, transformers=transformers.__version__,
        hidden_state_bytes=hidden_state_bytes(),
        runs=[dict(layers=k[0], placement=k[1], **measured[k], predicted_tensor_peak_bytes=predicted[k][
            "tensor_peak_bytes"], predicted_peak_phase=predicted[k]["peak_phase"]) for k in keys],
        comparison=compare(measured, predicted))


def to_markdown(doc: dict) -> str:
    lines = [
        "# Reentrant checkpointing around FSDP units: measured on CPU vs the memory model", "",
        f"Command: `{COMMAND}` (torch {doc['torch']}, transformers {doc['transformers']}, FSDP1, gloo, "
        f"{WORLD} CPU processes; rank 0, second step; MiB = 2^20 bytes).", "",
        f"Setup: tiny Llama (hidden {CONFIG['hidden_size']}, vocab {CONFIG['vocab_size']}, fp32), PEFT LoRA "
        f"r={LORA_RANK} on q/k/v/o, FSDP1 FULL_SHARD with PEFT's fsdp_auto_wrap_policy (use_orig_params=True), "
        f"AdamW (per-parameter loop), batch {MICRO_BATCH} x {SEQ_LEN} tokens. One hidden-state tensor is "
        f"{doc['hidden_state_bytes'] / MIB:.2f} MiB. \"around\" is transformers < 4.52's placement "
        "(`checkpoint(decoder_layer.__call__)`, the FSDP unit's call), \"inside\" 4.52's "
        "GradientCheckpointingLayer.", "",
        "| quantity | measured MiB | predicted MiB | measured hidden states | predicted hidden states |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in doc["comparison"]:
        lines.append(f"| {r['quantity']} | {r['measured_bytes'] / MIB:.2f} | {r['predicted_bytes'] / MIB:.2f} | "
                     f"{r['measured_hidden_states']:.2f} | {r['predicted_hidden_states']:.2f} |")
    lines += ["", "Each run (tensor peak = live bytes at the step's start, weights and states, plus its step peak; "
              "error = (predicted - measured) / measured):", "",
              "| layers | placement | tensor peak MiB | predicted MiB | error % | predicted phase | live at start MiB "
              "| step peak MiB |",
              "|---:|---|---:|---:|---:|---|---:|---:|"]
    for r in doc["runs"]:
        err = (r["predicted_tensor_peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"] * 100
        lines.append(f"| {r['layers']} | {r['placement']} | {r['peak_bytes'] / MIB:.2f} | "
                     f"{r['predicted_tensor_peak_bytes'] / MIB:.2f} | {err:+.1f} | {r['predicted_peak_phase']} | "
                     f"{r['start_bytes'] / MIB:.2f} | {r['step_peak_bytes'] / MIB:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where to write fsdp_reentrant_cpu.{md,json}")
    args = ap.parse_args(argv)
    doc = run()
    write_results(args.out_dir, "fsdp_reentrant_cpu", doc, to_markdown(doc))
    for r in doc["comparison"]:
        print(f"{r['quantity']:45s} measured {r['measured_hidden_states']:6.2f}  predicted "
              f"{r['predicted_hidden_states']:6.2f} hidden states")
    return 0


if __name__ == "__main__":
    sys.exit(main())
