"""The memory model at full size, without a GPU: real training steps traced on the meta device.

The CPU benchmark (memory_accuracy.py) checks the model on tiny shapes, where it can run the
steps. Here the full-size models of the catalog (7-9B, their real widths, depths, vocabularies and
sequence lengths) run their real transformers / PEFT / torch.optim code on the meta device: every
tensor has its shape and dtype but no storage and no compute, so a step of an 8B model at 16k tokens
takes seconds. A TorchDispatchMode records every storage each op creates and a weakref callback its
release (the live-tensor counter of trainfit.train.tensor_counter, keyed by the storage instead of
its data pointer, which meta tensors lack): the peak of that sequence is what
torch.cuda.max_memory_allocated would report for the same code on a GPU, less what the GPU kernels
allocate inside themselves. Attention is flash-attention 2 as the GPU runs it: q, k, v, the output
and the fp32 log-sum-exp kept for backward, with keys and values not repeated for grouped-query
attention; its backward allocates what flash-attn's mha_bwd does (dq, dk, dv, the fp32 dq
accumulator and softmax sum, and dk / dv expanded to every query head when the key heads are
fewer). The loop is the HF Trainer's: the output is dropped before backward, zero_grad(set_to_none)
after the step, torch's foreach AdamW (optimizer_impl "foreach").

The same sequence replayed through PyTorch's caching-allocator rules (bench/_allocator_replay.py)
gives the reserved peak that sizes and order alone produce, with room to spare, and the least
capacity the step runs in when the allocator has to free its cache and retry (what the fit verdict
needs: core.memory.overheads.SLACK_UNDER_PRESSURE).

Run:  .venv/bin/python bench/meta_trace.py [--only TEXT]
Writes bench/results/meta_trace.md and .json (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import weakref
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from _allocator_replay import least_capacity, replay  # noqa: E402

from trainfit.core.memory import estimate_memory, overheads  # noqa: E402
from trainfit.core.models.catalog import get_model  # noqa: E402
from trainfit.core.models.spec import ModelSpec  # noqa: E402
from trainfit.core.setup import LoraSettings, TrainingSetup  # noqa: E402
from trainfit.train.tensor_counter import TensorBytesCounter  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ATTENTION = "trainfit_meta_attention"  # flash-attention 2 on meta, registered with transformers' AttentionInterface below
QKVO = LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
ALL_LINEAR = LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules="all-linear")  # type: ignore[arg-type]


def _s(method: str = "full", **kw) -> TrainingSetup:
    kw.setdefault("precision", "bf16")
    kw.setdefault("attention", "flash")
    kw.setdefault("grad_checkpointing", "full")
    kw.setdefault("optimizer_impl", "foreach")
    kw.setdefault("device", "cuda")
    if method == "lora":
        kw.setdefault("lora", QKVO)
    return TrainingSetup(method=method, **kw)


CASES: list[tuple[str, str, TrainingSetup]] = [
    ("mistral-7b lora qkvo b4 s4096", "mistralai/Mistral-7B-v0.1", _s("lora", micro_batch=4, seq_len=4096)),
    ("mistral-7b lora qkvo b8 s4096", "mistralai/Mistral-7B-v0.1", _s("lora", micro_batch=8, seq_len=4096)),
    ("mistral-7b full b4 s4096", "mistralai/Mistral-7B-v0.1", _s(micro_batch=4, seq_len=4096)),
    ("llama-3.1-8b lora all-linear b2 s2048", "meta-llama/Llama-3.1-8B",
     _s("lora", micro_batch=2, seq_len=2048, lora=ALL_LINEAR)),
    ("llama-3.1-8b lora qkvo b1 s8192 no-ckpt", "meta-llama/Llama-3.1-8B",
     _s("lora", micro_batch=1, seq_len=8192, grad_checkpointing="none")),
    ("llama-3.2-3b full b4 s2048", "meta-llama/Llama-3.2-3B", _s(micro_batch=4, seq_len=2048)),
    ("qwen2.5-7b lora qkvo b4 s2048", "Qwen/Qwen2.5-7B", _s("lora", micro_batch=4, seq_len=2048)),
    ("qwen2.5-1.5b full b8 s1024 no-ckpt", "Qwen/Qwen2.5-1.5B",
     _s(micro_batch=8, seq_len=1024, grad_checkpointing="none")),
    ("gemma-7b lora qkvo b2 s2048", "google/gemma-7b", _s("lora", micro_batch=2, seq_len=2048)),
    ("pythia-2.8b lora qkv b4 s2048 no-ckpt", "EleutherAI/pythia-2.8b",
     _s("lora", micro_batch=4, seq_len=2048, grad_checkpointing="none",
        lora=LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules=["query_key_value"]))),
    ("phi-3-mini lora all b2 s2048 no-ckpt", "microsoft/Phi-3-mini-4k-instruct",
     _s("lora", micro_batch=2, seq_len=2048, grad_checkpointing="none",
        lora=LoraSettings(rank=16, alpha=32, dropout=0.0,
                          target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]))),
    ("phi-2 lora qkv,dense b4 s2048", "microsoft/phi-2",
     _s("lora", micro_batch=4, seq_len=2048,
        lora=LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "dense"]))),
]


class MetaTrace(TensorBytesCounter):
    """Allocation events of every tensor storage created under it (and of tensors tracked before):
    the live-tensor counter's dispatch mode, keyed by the storage's address (meta tensors have no
    data pointer) and recording the sequence instead of a running total."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, int]] = []
        self._next = 0

    def track_tensor(self, value) -> None:
        import torch

        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            return
        storage = value.untyped_storage()
        address, nbytes = storage._cdata, storage.nbytes()
        if address in self._live or nbytes == 0:
            return
        key = self._next = self._next + 1
        self._live[address] = key
        self.events.append(("alloc", key, nbytes))
        self._refs[address] = weakref.ref(storage, lambda _r, a=address, k=key: self._freed(a, k))

    def _freed(self, address: int, key: int) -> None:
        if self._live.get(address) == key:
            del self._live[address]
            self._refs.pop(address, None)
            self.events.append(("free", key, 0))

    def live_bytes(self) -> int:
        """Bytes of the storages alive now, those tracked before the trace included."""
        sizes = {key: nbytes for kind, key, nbytes in self.events if kind == "alloc"}
        return sum(sizes[key] for key in self._live.values())

    def traced_peak_bytes(self) -> int:
        now = peak = 0
        sizes: dict[int, int] = {}
        for kind, key, nbytes in self.events:
            if kind == "alloc":
                sizes[key] = nbytes
                now += nbytes
                peak = max(peak, now)
            else:
                now -= sizes.pop(key)
        return peak


def flash_function():
    """flash-attention 2 as an autograd Function for meta tensors: what it keeps and allocates."""
    import torch

    class Flash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # (batch, heads, seq, head_dim); k, v may have fewer heads
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, out, lse = ctx.saved_tensors
            b, h, s, d = q.shape
            dq = torch.empty_like(q)
            dq_accum = torch.empty(b, s, h, d, dtype=torch.float32, device=q.device)
            softmax_d = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
            if k.shape[1] != h:  # mha_bwd: dk, dv for every query head, then summed per key head
                group = h // k.shape[1]
                dk = torch.empty_like(q).view(b, k.shape[1], group, s, d).sum(2)
                dv = torch.empty_like(q).view(b, k.shape[1], group, s, d).sum(2)
            else:
                dk, dv = torch.empty_like(k), torch.empty_like(v)
            del dq_accum, softmax_d
            return dq, dk, dv

    return Flash


def _register_flash_attention() -> None:
    from transformers import AttentionInterface

    flash = flash_function()

    def attention(module, query, key, value, attention_mask, **kwargs):
        return flash.apply(query, key, value).transpose(1, 2), None

    AttentionInterface.register(ATTENTION, attention)


def build(spec: ModelSpec, setup: TrainingSetup):
    import torch
    from transformers import AutoModelForCausalLM

    from trainfit.train.hf_config import build_hf_config

    cfg = build_hf_config(spec)  # dropout-free: the spec's dropout is zeroed where the cases are read
    cfg.use_cache = False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=ATTENTION, dtype=torch.bfloat16)
    if setup.lora is not None:
        from peft import LoraConfig, get_peft_model

        targets = setup.lora.target_modules
        model = get_peft_model(model, LoraConfig(r=setup.lora.rank, lora_alpha=setup.lora.alpha, lora_dropout=0.0,
                                                 target_modules=targets))
    if setup.grad_checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if setup.lora is not None:
            model.enable_input_require_grads()
    return model


def trace(spec: ModelSpec, setup: TrainingSetup, steps: int = 2) -> MetaTrace:
    return trace_model(build(spec, setup), setup, steps)


def trace_model(model, setup: TrainingSetup, steps: int = 2, after_backward=None) -> MetaTrace:
    """`steps` HF-Trainer-style training steps of a meta-device `model`; `after_backward()` runs
    between each backward and its optimizer step."""
    import torch

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    ids = torch.zeros(setup.micro_batch, setup.seq_len, dtype=torch.long, device="meta")
    rec = MetaTrace()
    rec.track_existing(list(model.parameters()) + list(model.buffers()) + [ids])
    with rec:
        for _ in range(steps):
            loss = model(input_ids=ids, labels=ids).loss  # the HF Trainer drops the output here
            loss.backward()
            del loss
            if after_backward is not None:
                after_backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return rec


def run(only: str | None = None) -> list[dict]:
    _register_flash_attention()
    rows = []
    for name, model_id, setup in CASES:
        if only and only not in name:
            continue
        # The trace runs without the model's dropout (on the meta device dropout takes CPU's unfused path,
        # not CUDA's 1-byte mask), so the prediction describes the same dropout-free model.
        spec = dataclasses.replace(get_model(model_id), hidden_dropout=0.0, attention_dropout=0.0,
                                   embedding_dropout=0.0)
        t0 = time.perf_counter()
        rec = trace(spec, setup)
        traced = rec.traced_peak_bytes()
        alloc = replay(rec.events)
        gpu = estimate_memory(spec, setup).devices[0]
        predicted = gpu.tensor_peak_bytes
        # the model's free-running slack: its flat share or its phase pool (core.memory.overheads)
        model_slack = sum(c.bytes for c in gpu.components if c.name == "fragmentation") / predicted * 100
        err = (predicted - traced) / traced * 100
        slack = (alloc.reserved_peak - alloc.allocated_peak) / alloc.allocated_peak * 100
        least = least_capacity(rec.events, free=alloc)
        pressure = (least - alloc.allocated_peak) / alloc.allocated_peak * 100
        rows.append(dict(config=name, model=model_id, setup=dataclasses.asdict(setup), traced_bytes=traced,
                         predicted_bytes=predicted, error_pct=round(err, 2),
                         replayed_reserved_bytes=alloc.reserved_peak, replayed_slack_pct=round(slack, 1),
                         model_slack_pct=round(model_slack, 1),
                         least_capacity_bytes=least, pressure_slack_pct=round(pressure, 2),
                         seconds=round(time.perf_counter() - t0, 1)))
        print(f"{name:40s} traced {traced / 2**30:7.2f} GiB  predicted {predicted / 2**30:7.2f} GiB  "
              f"error {err:+6.1f} %  replayed reserved {alloc.reserved_peak / 2**30:7.2f} GiB (+{slack:.1f} %), "
              f"least capacity +{pressure:.2f} %",
              flush=True)
    return rows


def write(rows: list[dict]) -> None:
    errs = [abs(r["error_pct"]) for r in rows]
    summary = dict(cases=len(rows), median_abs_error_pct=round(statistics.median(errs), 2),
                   worst_abs_error_pct=round(max(errs), 2),
                   replayed_slack_pct=[min(r["replayed_slack_pct"] for r in rows),
                                       max(r["replayed_slack_pct"] for r in rows)],
                   pressure_slack_pct=[min(r["pressure_slack_pct"] for r in rows),
                                       max(r["pressure_slack_pct"] for r in rows)],
                   pressure_slack_median_pct=round(statistics.median(r["pressure_slack_pct"] for r in rows), 2),
                   pressure_slack_within_5pct=sum(r["pressure_slack_pct"] <= 5 for r in rows))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "meta_trace.json").write_text(json.dumps(dict(summary=summary, rows=rows), indent=2) + "\n")
    lines = ["# The memory model at full size: training steps traced on the meta device", "",
             "Command: `.venv/bin/python bench/meta_trace.py` (two steps per case, pure bf16, flash attention, "
             "foreach AdamW, HF Trainer loop; GiB = 2^30 bytes; error = (predicted - traced) / traced).", "",
             f"Summary: {summary['cases']} cases, median |error| {summary['median_abs_error_pct']} %, worst "
             f"{summary['worst_abs_error_pct']} %. Replaying the traces through the caching allocator's rules "
             f"gives a reserved-over-allocated slack of {summary['replayed_slack_pct'][0]}-"
             f"{summary['replayed_slack_pct'][1]} % with room to spare. The least capacity each step runs in "
             f"(the allocator frees its wholly free segments and retries before an OOM) is "
             f"{summary['pressure_slack_pct'][0]}-{summary['pressure_slack_pct'][1]} % above the allocated peak, "
             f"median {summary['pressure_slack_median_pct']} %, at most 5 % in {summary['pressure_slack_within_5pct']} "
             f"of {summary['cases']}.", "",
             "The model's free-running slack (`fragmentation`: "
             f"{round(overheads.SLACK_TRAINING * 100)} % of the tensor peak, or a full fine-tune's "
             "phase pool where larger) is shown next to the replayed slack, which leaves out what the "
             "published pairs also hold (kernels' own allocations, other streams).", "",
             "| config | traced GiB | predicted GiB | error % | replayed reserved GiB | slack % | model slack % "
             "| least capacity % |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['traced_bytes'] / 2**30:.2f} | {r['predicted_bytes'] / 2**30:.2f} | "
                     f"{r['error_pct']:+.1f} | {r['replayed_reserved_bytes'] / 2**30:.2f} | "
                     f"{r['replayed_slack_pct']:.1f} | {r['model_slack_pct']:.1f} | +{r['pressure_slack_pct']:.2f} |")
    lines += ["", "What the trace cannot see: memory GPU kernels allocate inside themselves outside PyTorch's "
              "allocator, cuBLAS workspaces, the CUDA context. What the replay cannot see: other streams "
              "(NCCL), and kernels' own allocation order where it differs from the ops'."]
    (RESULTS / "meta_trace.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the cases whose name contains this text (results not written)")
    only = ap.parse_args(argv).only
    rows = run(only)
    return 0 if only else write(rows) or 0


if __name__ == "__main__":
    sys.exit(main())
