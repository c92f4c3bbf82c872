"""FSDP gradient accumulation with and without no_sync, measured on this CPU against the memory model.

Checks the memory model's `fsdp_no_sync` term (trainfit.core.memory.framework_effects
`no_sync_gradient_bytes`): under FSDP full shard with gradient sync disabled between micro-batches,
every wrapped unit keeps its *unsharded* gradient until the last micro-batch, so each rank holds the
whole model's gradient in the gathered dtype (fp32 here: 4 B x every parameter) instead of its
1/N shard.

Two processes on this CPU (gloo, OMP_NUM_THREADS=1) each build the same tiny Llama
(LlamaForCausalLM from a LlamaConfig, random weights, fp32), shard it with FSDP2 `fully_shard` on
every decoder layer and then on the root (what Transformers / Accelerate use), and step AdamW
(foreach=False, fused=False; no activation checkpointing) with grad_accum=4 micro-batches of one
64-token sequence (labels = input ids). One warm-up step creates the optimizer states; the second
step is measured, in two runs:

* sync: the default, a reduce-scatter after every micro-batch (sharded gradients accumulate);
* no_sync: `model.set_requires_gradient_sync(False)` before micro-batches 1-3, `True` before the
  4th (FSDP2's equivalent of FSDP1's `no_sync()`; Accelerate 1.15's `Accelerator.no_sync` and the HF
  Trainer call it for an FSDP2 model).

On rank 0 a live tensor-bytes counter (trainfit.train.tensor_counter.TensorBytesCounter, extended
here for FSDP2: see FsdpTensorCounter) records the peak live tensor bytes of the measured step, the
live bytes right after the 3rd micro-batch's backward (before the 4th forward), and the gradients
held at that point: the sharded `p.grad` of the model's DTensor parameters and the unsharded
gradients FSDP2 keeps on each FSDPParam's `_unsharded_param.grad` (not reachable through
`model.parameters()`).

The prediction is `estimate_memory(...)` for the same setup, with fsdp_no_sync False / True. The
memory model refuses FSDP on device "cpu" (it needs NCCL), so the setup says device "cuda" with
optimizer_impl "for-loop" (torch's per-parameter AdamW, what foreach=False, fused=False runs): for a
full fp32 run without dropout no tensor term depends on the device, and only the tensor peak (no
margins) is compared.

Run:  .venv/bin/python bench/fsdp_no_sync_cpu.py [--repeats N] [--out-dir DIR]
Writes bench/results/fsdp_no_sync_cpu.md and .json (about 50 s on 2 cores: each mode is launched
3 times, each launch about 7 s, and the launch with the median peak is reported, because tensors
that gloo's threads release make a micro-batch's peak vary by up to a MiB). Tensor bytes do not
depend on machine load or timings, so the figures hold on any CPU with the same torch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from trainfit.core.memory import estimate_memory  # noqa: E402
from trainfit.core.memory.phases import peak_phase  # noqa: E402
from trainfit.core.memory.framework_effects import no_sync_gradient_bytes  # noqa: E402
from trainfit.core.memory.fsdp import compute_bytes, no_sync_applies, root_params  # noqa: E402
from trainfit.core.memory.states import model_states  # noqa: E402
from trainfit.core.memory.stats import model_stats  # noqa: E402
from trainfit.core.models.loader import spec_from_config  # noqa: E402
from trainfit.core.models.spec import ModelSpec  # noqa: E402
from trainfit.core.setup import TrainingSetup  # noqa: E402
from trainfit.train.tensor_counter import TensorBytesCounter  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = ".venv/bin/python bench/fsdp_no_sync_cpu.py"
MODES = ("sync", "no_sync")
WORLD = 2
GRAD_ACCUM = 4
MICRO_BATCH = 1
SEQ_LEN = 64
# The tiny Llama: 5.26 M parameters (21 MB fp32), a step in about a second per process.
CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
MIB = 2 ** 20


# -- prediction (pure: no torch.distributed) -------------------------------------------------------
def config_dict(**overrides: Any) -> dict:
    """The tiny LlamaConfig as a config.json dict (what the worker builds and the spec reads)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(**{**CONFIG, **overrides}, use_cache=False, attention_dropout=0.0)
    data = cfg.to_dict()
    data["torch_dtype"] = data["dtype"] = "float32"
    return data


def tiny_spec(**overrides: Any) -> ModelSpec:
    """trainfit's ModelSpec of the tiny config, read the way a local config.json is (spec_from_config)."""
    return spec_from_config(config_dict(**overrides), origin="bench/fsdp_no_sync_cpu.py CONFIG",
                            model_id="bench:tiny-llama")


def make_setup(no_sync: bool, *, world: int = WORLD, grad_accum: int = GRAD_ACCUM, micro_batch: int = MICRO_BATCH,
               seq_len: int = SEQ_LEN) -> TrainingSetup:
    """The measured run as a TrainingSetup. device "cuda": estimate_memory refuses FSDP on "cpu" (no NCCL);
    optimizer_impl "for-loop" is the AdamW the workers run (foreach=False, fused=False)."""
    return TrainingSetup(method="full", precision="fp32", optimizer="adamw", micro_batch=micro_batch,
                         seq_len=seq_len, grad_accum=grad_accum, num_gpus=world, zero_stage=3,
                         fsdp_strategy="full-shard", device="cuda", optimizer_impl="for-loop",
                         attention="sdpa", grad_checkpointing="none", fsdp_no_sync=no_sync)


def predict(spec: ModelSpec, no_sync: bool, **setup_kw: Any) -> dict:
    """trainfit's figures for one mode: the tensor peak, its phase and components, and the gradient
    bytes the model says a rank holds between micro-batches."""
    setup = make_setup(no_sync, **setup_kw)
    est = estimate_memory(spec, setup)
    dev = est.devices[0]
    st = model_stats(spec)
    states = model_states(spec, st, setup, 0)
    between = no_sync_gradient_bytes(st, setup, states.trainable) if no_sync_applies(setup) else states.gradients
    phase = peak_phase(est.notes)
    return dict(setup=dataclasses.asdict(setup), params=st.total, tensor_peak_bytes=dev.tensor_peak_bytes,
                peak_phase=phase, sharded_gradient_bytes=float(states.gradients),
                no_sync_gradient_bytes=float(no_sync_gradient_bytes(st, setup, states.trainable)),
                gradients_between_microbatches_bytes=float(between),
                # what stays alive from one micro-batch to the next: weights, optimizer states, gradients
                live_between_microbatches_bytes=float(states.weights + states.optimizer + states.master_weights
                                                      + between),
                components={c.name: c.bytes for c in dev.components if c.in_tensor_peak})


def predict_pair(spec: ModelSpec, **setup_kw: Any) -> dict:
    """Both modes and the differences the measurement is compared with."""
    sync, nosync = predict(spec, False, **setup_kw), predict(spec, True, **setup_kw)
    st = model_stats(spec)
    return dict(sync=sync, no_sync=nosync, root_share_pct=100.0 * root_params(st) / st.total,
                layer_gradient_bytes=float(st.per_layer * compute_bytes(make_setup(False, **setup_kw))),
                peak_delta_bytes=nosync["tensor_peak_bytes"] - sync["tensor_peak_bytes"],
                extra_gradient_bytes=nosync["no_sync_gradient_bytes"] - sync["sharded_gradient_bytes"])


def compare(measured: dict, predicted: dict) -> dict:
    """Measured vs predicted: the differences between the modes and both absolute peaks.
    measured: {mode: worker result}; errors are (predicted - measured) / measured."""
    def err(p: float, m: float) -> float | None:
        return round((p - m) / m * 100, 2) if m else None

    s, n = measured["sync"], measured["no_sync"]
    between = {mode: predicted[mode]["live_between_microbatches_bytes"] for mode in MODES}
    grads = {mode: measured[mode]["grads_after_mb3"]["total_bytes"] for mode in MODES}
    rows = [
        ("peak delta (no_sync - sync)", n["peak_bytes"] - s["peak_bytes"], predicted["peak_delta_bytes"]),
        ("live after 3rd backward: delta", n["live_after_mb3_bytes"] - s["live_after_mb3_bytes"],
         between["no_sync"] - between["sync"]),
        ("gradient bytes after 3rd backward: delta", grads["no_sync"] - grads["sync"],
         predicted["extra_gradient_bytes"]),
        ("gradient bytes after 3rd backward, sync", grads["sync"], predicted["sync"]["sharded_gradient_bytes"]),
        ("gradient bytes after 3rd backward, no_sync", grads["no_sync"],
         predicted["no_sync"]["no_sync_gradient_bytes"]),
        ("live after 3rd backward, sync", s["live_after_mb3_bytes"], between["sync"]),
        ("live after 3rd backward, no_sync", n["live_after_mb3_bytes"], between["no_sync"]),
        ("tensor peak, sync", s["peak_bytes"], predicted["sync"]["tensor_peak_bytes"]),
        ("tensor peak, no_sync", n["peak_bytes"], predicted["no_sync"]["tensor_peak_bytes"]),
    ]
    return dict(rows=[dict(quantity=q, measured_bytes=int(m), predicted_bytes=int(p), error_pct=err(p, m))
                      for q, m, p in rows])


# -- measurement ----------------------------------------------------------------------------------
class FsdpTensorCounter(TensorBytesCounter):
    """TensorBytesCounter that also sees FSDP2's tensors.

    * A TorchDispatchMode sees a DTensor op once, at the DTensor level; the local ops DTensor runs
      inside it (AdamW's states and temporaries on sharded parameters) are not dispatched to the
      mode again. A DTensor output is counted by its local tensor's storage.
    * FSDP2 frees and re-allocates the unsharded parameters by resizing one storage in place
      (`free_storage` / `alloc_storage` in torch.distributed.fsdp._fully_shard._fsdp_param), which no
      op reports: `patched_fsdp_storage` routes both through `storage_freed` / `storage_allocated`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.on_peak = None  # called at every new high-water mark (and at reset_peak): its result is peak_info
        self.peak_info = None

    def _add_storage(self, storage: Any) -> None:
        before = self.peak_bytes
        super()._add_storage(storage)
        if self.on_peak is not None and self.peak_bytes > before:
            self.peak_info = self.on_peak(dict(self._live))

    def reset_peak(self) -> None:
        super().reset_peak()
        self.peak_info = self.on_peak(dict(self._live)) if self.on_peak is not None else None

    def track_tensor(self, value: Any) -> None:
        from torch.distributed.tensor import DTensor

        if isinstance(value, DTensor):
            value = value._local_tensor
        super().track_tensor(value)

    def storage_freed(self, tensor: Any) -> None:
        storage = tensor.untyped_storage()
        if storage.nbytes():
            self._release(storage.data_ptr())

    def storage_allocated(self, tensor: Any) -> None:
        self._add_storage(tensor.untyped_storage())


@contextlib.contextmanager
def patched_fsdp_storage(counter: FsdpTensorCounter):
    """Report FSDP2's in-place storage resizes (unshard / reshard) to `counter`."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    orig_alloc, orig_free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc(tensor):
        orig_alloc(tensor)
        counter.storage_allocated(tensor)

    def free(tensor):
        counter.storage_freed(tensor)
        orig_free(tensor)

    _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc, free
    _fsdp_param_group.alloc_storage = alloc
    try:
        yield
    finally:
        _fsdp_param.alloc_storage, _fsdp_param.free_storage = orig_alloc, orig_free
        _fsdp_param_group.alloc_storage = orig_alloc


def _fsdp_params(model) -> list:
    params = []
    for module in model.modules():
        if hasattr(module, "_get_fsdp_state"):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                params.extend(group.fsdp_params)
    return params


def gradient_bytes(model) -> dict:
    """Gradients alive on this rank: the sharded `p.grad` (DTensor, local shard) of the model's
    parameters (FSDPParam.sharded_param, what model.parameters() returns between units) and the unsharded
    gradients FSDP2 keeps between micro-batches without sync (on each FSDPParam's `_unsharded_param.grad`,
    or `unsharded_accumulated_grad` when reduce_dtype differs).
    Bytes are numel x itemsize; `*_storage_bytes` counts each underlying storage once."""
    def add(tensors) -> tuple[int, int, int]:
        logical, storages = 0, {}
        for t in tensors:
            logical += t.numel() * t.element_size()
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return logical, sum(storages.values()), len(tensors)

    fps = _fsdp_params(model)  # every parameter is in one (the root unit holds the rest)
    sharded = [getattr(g, "_local_tensor", g) for g in (fp.sharded_param.grad for fp in fps) if g is not None]
    unsharded = [fp._unsharded_param.grad for fp in fps
                 if getattr(fp, "_unsharded_param", None) is not None and fp._unsharded_param.grad is not None]
    accumulated = [fp.unsharded_accumulated_grad for fp in fps if fp.unsharded_accumulated_grad is not None]
    out = {}
    for name, ts in (("sharded_param_grad", sharded), ("unsharded_param_grad", unsharded),
                     ("unsharded_accumulated_grad", accumulated)):
        logical, physical, count = add(ts)
        out[name] = dict(bytes=logical, storage_bytes=physical, tensors=count)
    out["total_bytes"] = sum(v["bytes"] for v in out.values())
    return out


def _ptr(t: Any) -> int:
    t = getattr(t, "_local_tensor", t)  # DTensor: its local shard
    return t.untyped_storage().data_ptr()


BREAKDOWN = ("parameter shards", "optimizer states", "sharded gradients (p.grad)",
             "unsharded gradients (FSDPParam._unsharded_param.grad)", "unsharded parameters (all-gather outputs)",
             "FSDP communication buffers", "inputs and buffers", "activations and temporaries")
# "activations and temporaries" also holds what only FSDP's local variables reference for a moment: the
# gradients and buffers of a reduce-scatter in progress (popped from `_unsharded_param.grad` before it).


def live_breakdown(live: dict[int, int], model, opt, inputs: list) -> dict:
    """Bytes of the live storages `live` (data_ptr -> bytes) by what holds them (first match wins, in
    BREAKDOWN order); whatever no model / optimizer / FSDP structure names is activations and temporaries."""
    fps = _fsdp_params(model)
    groups = [g for m in model.modules() if hasattr(m, "_get_fsdp_state")
              for g in m._get_fsdp_state()._fsdp_param_groups]
    owners: dict[str, list] = {name: [] for name in BREAKDOWN[:-1]}
    # model.parameters() are the unsharded parameters while a unit is unsharded: read FSDPParam's own fields.
    owners["parameter shards"] = [fp.sharded_param for fp in fps]
    owners["optimizer states"] = [v for st in opt.state.values() for v in st.values()
                                  if hasattr(v, "untyped_storage") and v.dim() > 0]
    owners["sharded gradients (p.grad)"] = [fp.sharded_param.grad for fp in fps if fp.sharded_param.grad is not None]
    owners["unsharded gradients (FSDPParam._unsharded_param.grad)"] = [
        g for fp in fps for g in (getattr(getattr(fp, "_unsharded_param", None), "grad", None),
                                  fp.unsharded_accumulated_grad) if g is not None]
    owners["unsharded parameters (all-gather outputs)"] = [
        t for fp in fps for t in list(fp.all_gather_outputs) + list(getattr(fp, "_unsharded_inner_tensors", []))]
    comm = []
    for g in groups:
        if g._all_gather_result is not None:
            comm.append(g._all_gather_result.all_gather_output)
        comm.extend(s.reduce_scatter_input for s in g.comm_ctx.reduce_scatter_states)
        if getattr(g, "_partial_reduce_output", None) is not None:
            comm.append(g._partial_reduce_output)
    owners["FSDP communication buffers"] = comm
    owners["inputs and buffers"] = list(inputs) + list(model.buffers())
    out, seen = {}, set()
    for name, tensors in owners.items():
        ptrs = {_ptr(t) for t in tensors} - seen
        seen |= ptrs
        out[name] = sum(live.get(p, 0) for p in ptrs)
    out["activations and temporaries"] = sum(b for p, b in live.items() if p not in seen)
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, mode: str, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _run_rank(rank, world, mode, out_path)
    finally:
        dist.destroy_process_group()


def _run_rank(rank: int, world: int, mode: str, out_path: str) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**CONFIG}, use_cache=False, attention_dropout=0.0)
    torch.manual_seed(0)  # the same weights on every rank (fully_shard keeps each rank's own slice)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    params_before = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False, fused=False)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own data (data parallel)
    batches = [torch.randint(0, cfg.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=gen) for _ in range(2 * GRAD_ACCUM)]
    record: dict[str, Any] = dict(mode=mode, rank=rank, world=world, params=params_before)
    counter = FsdpTensorCounter() if rank == 0 else None
    phase = ["build"]

    def at_peak(live: dict[int, int]) -> dict:
        return dict(phase=phase[0], bytes=sum(live.values()), breakdown=live_breakdown(live, model, opt, batches))

    def step(index: int, measured: bool) -> None:
        peaks = []  # (bytes, phase, breakdown) of each micro-batch's forward, backward and the optimizer step
        for micro in range(GRAD_ACCUM):
            if mode == "no_sync":
                model.set_requires_gradient_sync(micro == GRAD_ACCUM - 1)
            if counter is not None and measured:
                counter.reset_peak()
            ids = batches[index * GRAD_ACCUM + micro]
            phase[0] = f"forward {micro + 1}"
            loss = model(input_ids=ids, labels=ids).loss
            phase[0] = f"backward {micro + 1}"
            (loss / GRAD_ACCUM).backward()
            del loss
            # A reduce-scatter buffer is sometimes left in a reference cycle (gloo's work finishing on its own
            # thread): free such garbage now, so that what is read below is what the run holds.
            live_before_gc = counter.current_bytes if counter is not None else 0
            gc.collect()
            if counter is not None and measured:
                record["gc_freed_after_backward_bytes"].append(live_before_gc - counter.current_bytes)
                peaks.append(counter.peak_info)
                record["microbatch_peaks_bytes"].append(counter.peak_bytes)
                record["live_after_backward_bytes"].append(counter.current_bytes)
                record["breakdown_after_backward"].append(live_breakdown(dict(counter._live), model, opt, batches))
                if micro == GRAD_ACCUM - 2:  # after the 3rd backward, before the 4th forward
                    record["live_after_mb3_bytes"] = counter.current_bytes
                    record["grads_after_mb3"] = gradient_bytes(model)
                    record["breakdown_after_mb3"] = live_breakdown(dict(counter._live), model, opt, batches)
        phase[0] = "optimizer step"
        if counter is not None and measured:
            record["grads_before_step"] = gradient_bytes(model)
            counter.reset_peak()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if counter is not None and measured:
            record["optimizer_step_peak_bytes"] = counter.peak_bytes
            peaks.append(counter.peak_info)
            record["peak_at"] = max(peaks, key=lambda p: p["bytes"])
            record["peaks_at"] = peaks  # each micro-batch's, then the optimizer step's

    if counter is None:
        step(0, False)
        step(1, False)
    else:
        local = [p.to_local() for p in model.parameters()]
        counter.track_existing(local + list(model.buffers()) + batches)
        record["params_local_bytes"] = sum(t.numel() * t.element_size() for t in local)
        with patched_fsdp_storage(counter), counter:
            t0 = time.perf_counter()
            step(0, False)  # warm-up: AdamW's states exist from here on
            record["after_warmup_live_bytes"] = counter.current_bytes
            record["warmup_peak_bytes"] = counter.peak_bytes
            record.update(microbatch_peaks_bytes=[], live_after_backward_bytes=[], breakdown_after_backward=[],
                          gc_freed_after_backward_bytes=[])
            counter.on_peak = at_peak  # from here on every new high-water mark is broken down
            counter.reset_peak()
            step(1, True)
            counter.on_peak = None
            record["seconds_counted"] = round(time.perf_counter() - t0, 2)
        record["peak_bytes"] = max(record["microbatch_peaks_bytes"] + [record["optimizer_step_peak_bytes"]])
        record["live_after_step_bytes"] = counter.current_bytes
        record["optimizer_state_local_bytes"] = sum(
            (v.to_local() if hasattr(v, "to_local") else v).numel() * v.element_size()
            for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    # the same update either way: a checksum of this rank's parameter shard after the measured step
    with torch.no_grad():
        record["param_checksum"] = float(sum(p.to_local().double().abs().sum() for p in model.parameters()))
    if rank == 0:
        Path(out_path).write_text(json.dumps(record))


def measure(mode: str, world: int = WORLD) -> dict:
    """One warm-up + one measured step of `mode` ("sync" / "no_sync") in `world` CPU processes;
    rank 0's readings."""
    import torch.multiprocessing as mp

    assert mode in MODES, mode
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned workers
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, f"{mode}.json")
        mp.spawn(_worker, args=(world, _free_port(), mode, out), nprocs=world, join=True)
        return json.loads(Path(out).read_text())


# -- report ---------------------------------------------------------------------------------------
def _mib(b: float) -> str:
    return f"{b / MIB:.2f}"


def _pct(error: float | None) -> str:
    return "n/a" if error is None else f"{error:+.1f} %"


def holds_whole_gradient(measured: dict, predicted: dict, tolerance: float = 0.02) -> bool:
    """Between micro-batches under no_sync, a rank holds every parameter's unsharded gradient (within
    `tolerance`), and that much more than with a sync per micro-batch holds."""
    held = measured["no_sync"]["grads_after_mb3"]["total_bytes"]
    whole = predicted["no_sync"]["no_sync_gradient_bytes"]
    extra = held - measured["sync"]["grads_after_mb3"]["total_bytes"]
    return abs(held - whole) <= tolerance * whole and abs(extra - predicted["extra_gradient_bytes"]) <= (
        tolerance * predicted["extra_gradient_bytes"])


def conclusion(comparison: dict, measured: dict, predicted: dict) -> str:
    rows = {r["quantity"]: r for r in comparison["rows"]}
    g = rows["gradient bytes after 3rd backward: delta"]
    d = rows["peak delta (no_sync - sync)"]
    ps, pn = rows["tensor peak, sync"], rows["tensor peak, no_sync"]
    held = measured["no_sync"]["grads_after_mb3"]["total_bytes"]
    whole = predicted["no_sync"]["no_sync_gradient_bytes"]
    verdict = "supports" if holds_whole_gradient(measured, predicted) else "does not support"
    text = (f"The measurement {verdict} \"no_sync keeps the whole model's unsharded gradient per rank\": between "
            f"micro-batches (after the 3rd backward) rank 0 holds {_mib(held)} MiB of unsharded gradients under "
            f"no_sync (model: {_mib(whole)} MiB, every parameter x 4 B) against "
            f"{_mib(measured['sync']['grads_after_mb3']['total_bytes'])} MiB of 1/{WORLD} shards with a sync per "
            f"micro-batch: {_mib(g['measured_bytes'])} MiB more, {_mib(g['predicted_bytes'])} MiB predicted "
            f"({_pct(g['error_pct'])}). ")
    if d["error_pct"] is not None and abs(d["error_pct"]) <= 10:
        return text + (f"The step's peak grows by {_mib(d['measured_bytes'])} MiB, {_mib(d['predicted_bytes'])} MiB "
                       f"predicted ({_pct(d['error_pct'])}).")
    at = {mode: measured[mode]["peak_at"] for mode in MODES}
    above = {mode: measured[mode]["peak_bytes"] - measured[mode]["live_after_mb3_bytes"] for mode in MODES}
    model_above = {mode: predicted[mode]["tensor_peak_bytes"] - predicted[mode]["live_between_microbatches_bytes"]
                   for mode in MODES}
    bs, bn = at["sync"]["breakdown"], at["no_sync"]["breakdown"]
    return text + (
        f"The step's peak, though, grows by {_mib(d['measured_bytes'])} MiB, against the "
        f"{_mib(d['predicted_bytes'])} MiB the model adds ({_pct(d['error_pct'])}). Above what each mode holds "
        f"between micro-batches the model puts {_mib(model_above['sync'])} MiB (sync, at its "
        f"{predicted['sync']['peak_phase']}: gathered units, the unsharded gradients of the layer in backward, of the "
        f"previous layer (its reduce-scatter input, which FSDP2 keeps until the next unit reduces) and of the "
        f"lm_head, which the root unit reduce-scatters last, and activations) and "
        f"{_mib(model_above['no_sync'])} MiB (no_sync: gathered units, activations and logits, the gradients being "
        f"inside the accumulated whole); measured, it is {_mib(above['sync'])} MiB "
        f"and {_mib(above['no_sync'])} MiB. The sync peak is in the "
        f"{at['sync']['phase']}, where unsharded gradients ({_mib(bs[BREAKDOWN[3]])} MiB: the lm_head's, held until "
        f"the root unit reduces after the embedding's backward, and the unit being reduced) and reduce-scatter "
        f"buffers ({_mib(bs[BREAKDOWN[5]])} MiB) sit on top of the "
        f"accumulated shards. Under no_sync the gradients are part of the accumulated whole: micro-batches 1-3 add "
        f"into it in place and reduce nothing, and the last one reduce-scatters it unit by unit, freeing each unit's "
        f"unsharded gradient as it goes; its peak ({at['no_sync']['phase']}) holds "
        f"{_mib(bn[BREAKDOWN[3]])} MiB of unsharded gradients and {_mib(bn[BREAKDOWN[5]])} MiB of communication "
        f"buffers. So the whole-model term is right as what is held, and the difference of the peaks follows from "
        f"what each peak holds beside it: the sync one's gradients being reduced and their buffers. Absolute "
        f"peaks: sync {_mib(ps['measured_bytes'])} MiB measured vs {_mib(ps['predicted_bytes'])} MiB predicted "
        f"({_pct(ps['error_pct'])}), no_sync {_mib(pn['measured_bytes'])} vs {_mib(pn['predicted_bytes'])} MiB "
        f"({_pct(pn['error_pct'])}{', on the safe side' if pn['error_pct'] and pn['error_pct'] > 0 else ''}). "
        f"In this tiny model the root unit (embeddings + lm_head) is {predicted['root_share_pct']:.0f} % of the "
        f"parameters, so one unit's gradient transients are large next to the whole gradient; in a larger model "
        f"they stay about one unit's worth while the whole gradient grows with every layer (reasoning, not "
        f"measured here).")


def write(doc: dict, out_dir: Path = RESULTS) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "fsdp_no_sync_cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    m, p = doc["measured"], doc["predicted"]
    lines = ["# FSDP no_sync gradient accumulation: measured on CPU vs the memory model", "",
             f"Command: `{doc['command']}` (torch {doc['versions']['torch']}, transformers "
             f"{doc['versions']['transformers']}, {doc['engine']}; MiB = 2^20 bytes; error = (predicted - measured) "
             "/ measured).", "",
             f"Setup: tiny Llama ({doc['model']['params']:,} parameters, {_mib(doc['model']['params'] * 4)} MiB "
             f"fp32; hidden {CONFIG['hidden_size']}, {CONFIG['num_hidden_layers']} layers, vocab "
             f"{CONFIG['vocab_size']}), {WORLD} processes (gloo), FSDP2 fully_shard per decoder layer + root, fp32, "
             f"AdamW (per-parameter loop), micro-batch {MICRO_BATCH} x {SEQ_LEN} tokens, grad_accum {GRAD_ACCUM}; "
             "rank 0, second step (after a warm-up step), live-tensor counter.", "",
             "| quantity | measured MiB | predicted MiB | error % |", "|---|---:|---:|---:|"]
    for r in doc["comparison"]["rows"]:
        e = "" if r["error_pct"] is None else f"{r['error_pct']:+.1f}"
        lines.append(f"| {r['quantity']} | {_mib(r['measured_bytes'])} | {_mib(r['predicted_bytes'])} | {e} |")
    lines += ["", "Per mode (rank 0, MiB):", "",
              "| | sync | no_sync |", "|---|---:|---:|"]

    def row(label: str, key) -> None:
        lines.append(f"| {label} | {key(m['sync'])} | {key(m['no_sync'])} |")

    row("live at the start of the measured step", lambda r: _mib(r["after_warmup_live_bytes"]))
    row("peak of each micro-batch", lambda r: " / ".join(_mib(b) for b in r["microbatch_peaks_bytes"]))
    row("live after each backward", lambda r: " / ".join(_mib(b) for b in r["live_after_backward_bytes"]))
    row("step peak of each launch (the median one is reported)",
        lambda r: " / ".join(_mib(b) for b in r["repeat_peak_bytes"]))
    row("optimizer step peak", lambda r: _mib(r["optimizer_step_peak_bytes"]))
    row("sharded p.grad after 3rd backward", lambda r: _mib(r["grads_after_mb3"]["sharded_param_grad"]["bytes"]))
    row("unsharded grads after 3rd backward (FSDPParam._unsharded_param.grad)",
        lambda r: _mib(r["grads_after_mb3"]["unsharded_param_grad"]["bytes"]))
    row("sharded p.grad before the optimizer step",
        lambda r: _mib(r["grads_before_step"]["sharded_param_grad"]["bytes"]))
    row("parameter shard checksum after the step", lambda r: f"{r['param_checksum']:.6f}")
    lines += ["", "What is alive at the measured peak and after the 3rd backward (rank 0, MiB; every live storage "
              "attributed to what holds it, the rest is activations and temporaries):", "",
              f"| | sync: peak ({m['sync']['peak_at']['phase']}) | no_sync: peak ({m['no_sync']['peak_at']['phase']}) "
              "| sync: after 3rd backward | no_sync: after 3rd backward |", "|---|---:|---:|---:|---:|"]
    for name in BREAKDOWN:
        cells = [m[mode]["peak_at"]["breakdown"][name] for mode in MODES] + [
            m[mode]["breakdown_after_mb3"][name] for mode in MODES]
        lines.append(f"| {name} | " + " | ".join(_mib(b) for b in cells) + " |")
    lines.append(f"| total | {_mib(m['sync']['peak_at']['bytes'])} | {_mib(m['no_sync']['peak_at']['bytes'])} | "
                 f"{_mib(m['sync']['live_after_mb3_bytes'])} | {_mib(m['no_sync']['live_after_mb3_bytes'])} |")
    names = list(dict.fromkeys(k for mode in MODES for k in p[mode]["components"]))
    lines += ["", f"Predicted components at the peak (MiB; the model's peak phase: sync {p['sync']['peak_phase']}, "
              f"no_sync {p['no_sync']['peak_phase']}):", "", "| component | sync | no_sync |", "|---|---:|---:|"]
    for k in names:
        lines.append(f"| {k} | " + " | ".join(_mib(p[mode]["components"].get(k, 0)) for mode in MODES) + " |")
    lines.append("| tensor peak | " + " | ".join(_mib(p[mode]["tensor_peak_bytes"]) for mode in MODES) + " |")
    lines += ["", "## Conclusion", "", doc["conclusion"], ""]
    lines += ["## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    (out_dir / "fsdp_no_sync_cpu.md").write_text("\n".join(lines) + "\n")


NOTES = [
    "Where the unsharded gradients live (FSDP2): the model's parameters are sharded DTensors; without sync "
    "their `.grad` stays None (or the shard from an earlier sync) and autograd accumulates into the unsharded "
    "parameter of each FSDPParam (`fsdp_param._unsharded_param.grad`), which FSDP2 keeps across the reshard "
    "after backward (only the parameter storage is freed). With a reduce_dtype different from the gradient's "
    "it is moved to `unsharded_accumulated_grad` instead (not the case here: no mixed-precision policy). The "
    "last micro-batch with sync reduce-scatters the accumulated gradient and frees it.",
    "Counter: trainfit's TensorBytesCounter sees DTensor ops only at the DTensor level (their local "
    "allocations, e.g. AdamW states on sharded parameters, are not dispatched to the mode again) and does "
    "not see FSDP2's in-place storage resizes (unshard / reshard of parameters). FsdpTensorCounter in this "
    "script counts a DTensor by its local tensor and hooks FSDP2's alloc_storage / free_storage.",
    "Prediction device: estimate_memory refuses FSDP with device 'cpu' (it needs NCCL), so the setup says "
    "'cuda' with optimizer_impl 'for-loop'; no tensor term of a full fp32 run without dropout depends on the "
    "device, and only tensor peaks (no CUDA context / NCCL / fragmentation margins) are compared.",
    "gloo's own communication buffers are not torch tensors (not counted; NCCL's are not counted by "
    "max_memory_allocated either). Some tensors are released on gloo's threads when asynchronous work "
    "completes, so a micro-batch's peak can differ by about a MiB from launch to launch: each mode is "
    "launched --repeats times and the launch with the median peak is reported. A reduce-scatter buffer is "
    "sometimes left in a reference cycle after a backward; gc.collect() runs after every backward, before "
    "anything is read (gc_freed_after_backward_bytes says what it freed).",
]


def median_run(runs: list[dict]) -> dict:
    """The run whose peak is the median (the lower middle one for an even count), with every run's peak."""
    chosen = dict(sorted(runs, key=lambda r: r["peak_bytes"])[(len(runs) - 1) // 2])
    chosen["repeat_peak_bytes"] = [r["peak_bytes"] for r in runs]
    return chosen


def run(repeats: int = 3) -> dict:
    import torch
    import transformers

    spec = tiny_spec()
    predicted = predict_pair(spec)
    measured = {}
    for mode in MODES:
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runs.append(measure(mode))
            runs[-1]["seconds"] = round(time.perf_counter() - t0, 1)
            r = runs[-1]
            print(f"{mode:8s} peak {_mib(r['peak_bytes'])} MiB (predicted "
                  f"{_mib(predicted[mode]['tensor_peak_bytes'])}), live after 3rd backward "
                  f"{_mib(r['live_after_mb3_bytes'])} MiB, grads then {_mib(r['grads_after_mb3']['total_bytes'])} MiB, "
                  f"{r['seconds']} s", flush=True)
        measured[mode] = median_run(runs)
    if measured["sync"]["params"] != predicted["sync"]["params"]:
        raise SystemExit(f"the spec counts {predicted['sync']['params']:,} parameters, the model has "
                         f"{measured['sync']['params']:,}")
    versions = dict(torch=torch.__version__, transformers=transformers.__version__, python=sys.version.split()[0])
    return assemble(measured, predicted, versions)


def assemble(measured: dict, predicted: dict, versions: dict) -> dict:
    """The result document from rank 0's readings per mode and predict_pair's figures."""
    comparison = compare(measured, predicted)
    doc = dict(command=COMMAND, engine="FSDP2 (torch.distributed.fsdp.fully_shard), gloo, 2 CPU processes",
               versions=versions, model=dict(config=CONFIG, params=predicted["sync"]["params"]),
               setup=dict(world=WORLD, grad_accum=GRAD_ACCUM, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN,
                          precision="fp32", optimizer="AdamW(foreach=False, fused=False)",
                          activation_checkpointing=False),
               measured=measured, predicted=predicted, comparison=comparison, notes=NOTES)
    doc["conclusion"] = conclusion(comparison, measured, predicted)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where to write fsdp_no_sync_cpu.{md,json}")
    ap.add_argument("--repeats", type=int, default=3,
                    help="launches per mode; the run with the median peak is reported (default 3)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    doc = run(args.repeats)
    doc["command"] = COMMAND + ("" if args.repeats == 3 else f" --repeats {args.repeats}")
    write(doc, args.out_dir)
    for r in doc["comparison"]["rows"]:
        e = "" if r["error_pct"] is None else f"{r['error_pct']:+.1f} %"
        print(f"{r['quantity']:45s} measured {_mib(r['measured_bytes']):>8s} MiB  predicted "
              f"{_mib(r['predicted_bytes']):>8s} MiB  {e}")
    print(doc["conclusion"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
