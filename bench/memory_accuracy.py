"""Memory model vs. measured live-tensor peaks of real training steps on this CPU.

Each case builds a small model of a real architecture from a transformers config (random
weights), runs two full steps (forward, backward, optimizer step; DPO: reference forward +
policy forward on chosen+rejected + DPO loss; inference: model.generate with a KV cache) under
a live tensor-bytes counter (trainfit.train.tensor_counter, a TorchDispatchMode that sees every
storage; parameters, buffers, inputs and optimizer states are counted too), and compares the
peak with `estimate_memory(...).devices[0].tensor_peak_bytes` for device="cpu".

Run:  .venv/bin/python bench/memory_accuracy.py [--only NAME_SUBSTRING] [--quick]
Writes bench/results/memory_accuracy.md and .json. Memory counts do not depend on machine load,
so the results are reproducible on any CPU (timings are not recorded here).

Harness conventions (what trainfit's trainer does too): use_cache=False in training, fused AdamW
(transformers' default optimizer "adamw_torch_fused"), loss from the model (labels=input_ids),
outputs dropped before backward, zero_grad(set_to_none=True) after the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from trainfit.core.memory import estimate_memory  # noqa: E402
from trainfit.core.models.spec import ModelSpec  # noqa: E402
from trainfit.core.setup import LoraSettings, TrainingSetup  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _spec(arch: str, **kw) -> ModelSpec:
    base = dict(id=f"bench:{arch}", architecture=arch, vocab_size=8192, hidden_size=256, num_layers=2,
                num_heads=8, num_kv_heads=4, head_dim=32, intermediate_size=688, activation="silu",
                gated_mlp=True, tie_embeddings=False, position="rope", max_position_embeddings=2048,
                norm="rmsnorm", qkv_bias=False, o_bias=False, mlp_bias=False, lm_head_bias=False,
                stored_dtype="float32", source="bench")
    base.update(kw)
    return ModelSpec(**base)


ARCHS: dict[str, ModelSpec] = {
    "llama": _spec("llama"),
    "qwen2": _spec("qwen2", qkv_bias=True, vocab_size=16384, tie_embeddings=True, num_kv_heads=2),
    "mistral": _spec("mistral", hidden_size=384, num_heads=6, num_kv_heads=2, head_dim=64, intermediate_size=1024),
    "gpt2": _spec("gpt2", num_kv_heads=8, activation="gelu_new", gated_mlp=False, intermediate_size=1024,
                  tie_embeddings=True, position="learned", norm="layernorm", qkv_bias=True, o_bias=True,
                  mlp_bias=True, max_position_embeddings=1024),
    "phi": _spec("phi", num_kv_heads=8, activation="gelu_new", gated_mlp=False, intermediate_size=1024,
                 norm="layernorm", qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True),
    "gemma2": _spec("gemma2", activation="gelu_tanh", tie_embeddings=True, head_dim=32, sliding_window=4096),
    # head_dim 64 with 4 heads: q is wider than the hidden size, as in Qwen3 (head_dim 128)
    "qwen3": _spec("qwen3", num_heads=4, num_kv_heads=2, head_dim=64, vocab_size=16384, tie_embeddings=True),
    "phi3": _spec("phi3"),  # fused qkv_proj / gate_up_proj; grouped keys as in Phi-4 and Phi-3-medium
    "mixtral": _spec("mixtral", num_experts=4, experts_per_token=2, moe_intermediate_size=256,
                     intermediate_size=256),
}
# The model's own dropout at 0.1 (GPT-2's config; Phi-2's residual dropout), kept in training.
ARCHS["gpt2-dropout"] = dataclasses.replace(ARCHS["gpt2"], hidden_dropout=0.1, attention_dropout=0.1,
                                            embedding_dropout=0.1)
ARCHS["phi-dropout"] = dataclasses.replace(ARCHS["phi"], hidden_dropout=0.1)


def _s(method="full", **kw) -> TrainingSetup:
    kw.setdefault("micro_batch", 2)
    kw.setdefault("seq_len", 256)
    kw.setdefault("precision", "fp32")
    kw.setdefault("device", "cpu")
    if method in ("lora", "qlora") and "lora" not in kw:
        kw["lora"] = LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules=["q_proj", "v_proj"])
    return TrainingSetup(method=method, **kw)


ALL_LINEAR = LoraSettings(rank=8, alpha=16, dropout=0.0, target_modules="all-linear")  # type: ignore[arg-type]
DROP = LoraSettings(rank=16, alpha=32, dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
DROP_ALL = LoraSettings(rank=8, alpha=16, dropout=0.1, target_modules="all-linear")  # type: ignore[arg-type]

CASES: list[tuple[str, str, TrainingSetup]] = [
    ("llama full fp32 sdpa", "llama", _s()),
    ("llama full fp32 eager", "llama", _s(attention="eager")),
    ("llama full bf16-autocast", "llama", _s(precision="bf16-mixed")),
    ("llama full pure-bf16", "llama", _s(precision="bf16")),
    ("llama full sgd", "llama", _s(optimizer="sgd")),
    ("llama full sgd-momentum b4", "llama", _s(optimizer="sgd-momentum", micro_batch=4)),
    ("llama full ckpt", "llama", _s(grad_checkpointing="full", micro_batch=4)),
    ("llama full accum2", "llama", _s(grad_accum=2)),
    ("llama full s512 b1", "llama", _s(seq_len=512, micro_batch=1)),
    ("llama lora q,v", "llama", _s("lora")),
    ("llama lora all-linear bf16", "llama", _s("lora", precision="bf16", lora=ALL_LINEAR)),
    ("llama lora dropout autocast", "llama", _s("lora", precision="bf16-mixed", lora=DROP)),
    ("llama lora all-linear autocast", "llama", _s("lora", precision="bf16-mixed", lora=ALL_LINEAR)),
    ("llama lora all-linear dropout", "llama", _s("lora", lora=DROP_ALL)),
    ("llama dpo lora-base", "llama", _s("dpo", lora=LoraSettings(rank=8, dropout=0.0), dpo_reference="lora-base",
                                          micro_batch=1)),
    ("llama dpo full separate", "llama", _s("dpo", micro_batch=1)),
    ("llama inference gen64", "llama", _s("inference", generate_tokens=64, micro_batch=4)),
    ("qwen2 full fp32", "qwen2", _s()),
    ("qwen2 full bf16-autocast", "qwen2", _s(precision="bf16-mixed")),
    ("qwen2 lora ckpt", "qwen2", _s("lora", grad_checkpointing="full", micro_batch=4)),
    ("qwen2 inference eager", "qwen2", _s("inference", generate_tokens=32, attention="eager")),
    ("qwen3 full fp32", "qwen3", _s()),
    ("qwen3 full bf16-autocast", "qwen3", _s(precision="bf16-mixed")),
    ("qwen3 lora all-linear ckpt", "qwen3", _s("lora", lora=ALL_LINEAR, grad_checkpointing="full", micro_batch=4)),
    ("mistral full fp32", "mistral", _s()),
    ("mistral full eager bf16", "mistral", _s(attention="eager", precision="bf16")),
    ("mistral lora all-linear", "mistral", _s("lora", lora=ALL_LINEAR)),
    ("gpt2 full fp32", "gpt2", _s()),
    ("gpt2 full bf16-autocast", "gpt2", _s(precision="bf16-mixed")),
    ("gpt2 lora c_attn", "gpt2", _s("lora", lora=LoraSettings(rank=16, dropout=0.0, target_modules=["c_attn"]))),
    ("gpt2 inference", "gpt2", _s("inference", generate_tokens=64, micro_batch=2)),
    ("gpt2 full fp32 model-dropout", "gpt2-dropout", _s()),
    ("gpt2 full bf16-autocast model-dropout", "gpt2-dropout", _s(precision="bf16-mixed")),
    ("gpt2 lora c_attn ckpt model-dropout", "gpt2-dropout",
     _s("lora", grad_checkpointing="full", lora=LoraSettings(rank=16, dropout=0.0, target_modules=["c_attn"]))),
    ("phi full fp32", "phi", _s()),
    ("phi lora q,v bf16 resid-dropout", "phi-dropout", _s("lora", precision="bf16")),
    ("phi lora q,v bf16", "phi", _s("lora", precision="bf16")),
    ("phi lora all-linear dropout", "phi", _s("lora", lora=DROP_ALL)),
    ("phi3 full fp32", "phi3", _s()),
    ("phi3 lora all-linear bf16", "phi3", _s("lora", precision="bf16", lora=ALL_LINEAR)),
    ("gemma2 full fp32 eager", "gemma2", _s(attention="eager")),
    ("gemma2 lora eager bf16", "gemma2", _s("lora", attention="eager", precision="bf16")),
    ("mixtral full fp32", "mixtral", _s()),
    ("mixtral lora q,v", "mixtral", _s("lora")),
    ("mixtral full bf16-autocast", "mixtral", _s(precision="bf16-mixed")),
    ("mixtral lora all-linear", "mixtral", _s("lora", lora=ALL_LINEAR)),
    ("mixtral inference", "mixtral", _s("inference", generate_tokens=32)),
]


def build(spec: ModelSpec, setup: TrainingSetup):
    import torch
    from transformers import AutoModelForCausalLM

    from trainfit.train.hf_config import build_hf_config

    cfg = build_hf_config(spec)  # with the spec's own dropout (none unless a case sets it)
    cfg.use_cache = setup.method == "inference"
    torch.manual_seed(0)
    # cast after building: transformers before 4.56 reads `torch_dtype`, not `dtype`
    # (bench/loss_versions_cpu.py runs this under older releases)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=setup.attention if setup.attention != "flash"
                                             else "sdpa")
    model = model.to(torch.bfloat16 if setup.precision in ("bf16",) else torch.float32)
    if setup.grad_checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _peft(model, lora: LoraSettings):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                     target_modules=lora.target_modules, task_type="CAUSAL_LM",
                     fan_in_fan_out=False)
    return get_peft_model(model, cfg)


def _optimizer(params, setup: TrainingSetup):
    import torch

    if setup.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if setup.optimizer == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-4, fused=True)


def _selective_logps(logits, labels):
    """TRL's selective_log_softmax: per-row logsumexp (fp32) or log_softmax (16-bit)."""
    import torch

    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        return picked - lse
    rows = []
    for row_logits, row_labels in zip(logits, labels):
        row = torch.nn.functional.log_softmax(row_logits, dim=-1)
        rows.append(row.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def measure(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Peak live tensor bytes over two steps of `setup` (everything on the CPU)."""
    import contextlib

    import torch

    from trainfit.train.tensor_counter import TensorBytesCounter

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model = build(spec, setup)
    b, s = setup.micro_batch, setup.seq_len
    gen = torch.Generator().manual_seed(1)
    counter = TensorBytesCounter()
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if setup.precision == "bf16-mixed" \
        else contextlib.nullcontext
    if setup.method == "inference":
        model.eval()
        ids = torch.randint(0, spec.vocab_size, (b, s), generator=gen)
        counter.track_existing(list(model.parameters()) + list(model.buffers()) + [ids])
        with counter, torch.no_grad():
            for _ in range(2):
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=setup.generate_tokens,
                               min_new_tokens=setup.generate_tokens, do_sample=False, pad_token_id=0)
        return counter.peak_bytes
    ref = None
    if setup.method == "dpo" and setup.dpo_reference == "separate":
        import copy

        ref = copy.deepcopy(model).eval().requires_grad_(False)
    if setup.lora is not None:
        model = _peft(model, setup.lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _optimizer(params, setup)
    rows = 2 * b if setup.method == "dpo" else b
    batches = [torch.randint(0, spec.vocab_size, (rows, s), generator=gen) for _ in range(2 * setup.grad_accum)]
    existing = list(model.parameters()) + list(model.buffers()) + batches
    if ref is not None:
        existing += list(ref.parameters()) + list(ref.buffers())
    counter.track_existing(existing)
    with counter:
        for step in range(2):
            for micro in range(setup.grad_accum):
                ids = batches[step * setup.grad_accum + micro]
                if setup.method == "dpo":
                    loss = _dpo_loss(model, ref, ids, autocast)
                else:
                    with autocast():
                        out = model(input_ids=ids, labels=ids)
                    loss = out.loss
                    if not setup.output_kept:  # the HF Trainer's loop; a hand-written one may keep `out`
                        del out
                (loss / setup.grad_accum).backward()
                del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            out = None
    return counter.peak_bytes


def _dpo_loss(model, ref, ids, autocast):
    import contextlib

    import torch

    labels = ids[:, 1:]
    with torch.no_grad(), autocast():
        disable = model.disable_adapter() if ref is None and hasattr(model, "disable_adapter") \
            else contextlib.nullcontext()
        with disable:
            ref_logits = (ref or model)(input_ids=ids).logits[:, :-1]
            ref_logps = _selective_logps(ref_logits, labels).sum(-1)
        del ref_logits
    with autocast():
        logits = model(input_ids=ids).logits[:, :-1]
    logps = _selective_logps(logits, labels).sum(-1)
    del logits
    half = ids.shape[0] // 2
    margin = (logps[:half] - ref_logps[:half]) - (logps[half:] - ref_logps[half:])
    return -torch.nn.functional.logsigmoid(0.1 * margin).mean()


def run(only: str | None = None) -> list[dict]:
    rows = []
    for name, arch, setup in CASES:
        if only and only not in name:
            continue
        spec = ARCHS[arch]
        t0 = time.perf_counter()
        measured = measure(spec, setup)
        predicted = estimate_memory(spec, setup).devices[0].tensor_peak_bytes
        err = (predicted - measured) / measured * 100
        rows.append(dict(config=name, architecture=arch, setup=dataclasses.asdict(setup), measured_bytes=measured,
                         predicted_bytes=predicted, error_pct=round(err, 2),
                         seconds=round(time.perf_counter() - t0, 1)))
        print(f"{name:34s} measured {measured / 2**20:8.2f} MiB  predicted {predicted / 2**20:8.2f} MiB  "
              f"error {err:+6.1f} %", flush=True)
    return rows


def write(rows: list[dict]) -> None:
    errs = [abs(r["error_pct"]) for r in rows]
    summary = dict(cases=len(rows), architectures=len({r["architecture"] for r in rows}),
                   median_abs_error_pct=round(statistics.median(errs), 2), worst_abs_error_pct=round(max(errs), 2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "memory_accuracy.json").write_text(json.dumps(dict(summary=summary, rows=rows), indent=2) + "\n")
    lines = ["# Memory model vs. measured tensor peak (CPU, live-tensor counter)", "",
             "Command: `.venv/bin/python bench/memory_accuracy.py` (two full steps per case; "
             "MiB = 2^20 bytes; error = (predicted - measured) / measured).", "",
             f"Summary: {summary['cases']} cases, {summary['architectures']} architectures, "
             f"median |error| {summary['median_abs_error_pct']} %, worst {summary['worst_abs_error_pct']} %.", "",
             "| config | measured MiB | predicted MiB | error % |", "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['measured_bytes'] / 2**20:.2f} | {r['predicted_bytes'] / 2**20:.2f} "
                     f"| {r['error_pct']:+.1f} |")
    lines += ["", "Shapes: hidden 256-384, 2 layers, vocab 8k-16k, seq 256, batch 1-4, random weights, "
              "the model's own dropout 0 except the model-dropout / resid-dropout cases (0.1: CPU keeps a noise "
              "tensor per dropout where CUDA keeps a 1-byte mask, and attention dropout sends SDPA down its math "
              "path). CPU kernels: SDPA runs the CPU flash kernel (saves q, k, v, out, fp32 logsumexp like "
              "CUDA flash); autocast on CPU caches bf16 weight copies like CUDA; fused AdamW has no temporaries "
              "on either device."]
    (RESULTS / "memory_accuracy.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the cases whose name contains this text")
    args = ap.parse_args(argv)
    rows = run(args.only)
    if not args.only:
        write(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
