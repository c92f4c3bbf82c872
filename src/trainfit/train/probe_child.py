"""The plan's measuring child (trainfit.train.probe): run as `python -m trainfit.train.probe_child
--child`, it reads one setting per line on stdin (JSON), builds it with random weights and times
its warm-up and timed micro-batches and optimizer steps, one JSON event per line on stdout."""

from __future__ import annotations

import json
import statistics
import sys
import time

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup

TIMED_MICRO_BATCHES = 4
TIMED_OPTIMIZER_STEPS = 3
# Warm-up, per setting: micro-batches (each with an optimizer step) until one is no longer much faster
# than the one before and its page faults stopped growing the memory. The first setting of a fresh
# process (6 x 256 Llama, micro-batch 16 x 256 tokens, bf16 autocast) faulted in 160-176k then
# 93-119k minor page faults (~0.4-0.7 GB) in its first two micro-batches, 6-17k in the third and
# ~0 after, its first two taking 1.85 and 1.68 CPU-seconds against 1.06 settled (load 2.3): with one
# warm-up micro-batch the second was timed, and the first setting measured read slow against
# those measured after it (0.69 s/step where the benchmark's sweep measured 0.54).
WARMUP_MAX = 4
WARMUP_SHARE = 0.5  # at most this share of a setting's time goes to its warm-up
SETTLED_SPEEDUP = 0.9  # a warm-up micro-batch faster than this x the one before: still warming up
SETTLED_FAULT_PAGES = 4096  # 16 MiB of 4 KiB pages: memory no longer growing


def _emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def child_main(warm_spec: str | None = None) -> int:
    import torch  # noqa: F401  (the imports are most of the start-up time: before "ready")
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    _warm_up_torch()
    if warm_spec is not None:  # import the model's code now, while the parent still plans
        try:
            from trainfit.core.serde import from_jsonable
            from trainfit.train.hf_config import build_hf_config

            AutoModelForCausalLM._model_mapping[type(build_hf_config(from_jsonable(ModelSpec, json.loads(warm_spec))))]
        except Exception:  # only a head start: the setting's own build reports any real problem
            pass
    _emit(event="ready")
    for line in sys.stdin:
        job = json.loads(line)
        try:
            _run_setting(job)
        except Exception as exc:  # one setting that cannot run here must not end the probe
            _emit(event="error", index=job.get("index"), message=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                  if str(exc) else type(exc).__name__)
    return 0


def _warm_up_torch() -> None:
    """A few small ops in each precision, forward and backward: the first setting measured must not
    pay the process's one-time set-up (thread pools, oneDNN / cuBLAS handles) that the others skip."""
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        x = torch.randn(256, 256, device=device, requires_grad=True)
        for dtype in (torch.bfloat16, None):
            with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                y = torch.nn.functional.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None])
                (x @ x + y[0, 0]).float().sum().backward()


def _run_setting(job: dict) -> None:
    """Build one setting, warm it up and time it; its events go to stdout."""
    import contextlib

    import torch

    from trainfit.core.serde import from_jsonable

    spec = from_jsonable(ModelSpec, job["spec"])
    s = from_jsonable(TrainingSetup, job["setup"])
    index = job["index"]
    device = torch.device(job["device"] if job["device"] != "cuda" or torch.cuda.is_available() else "cpu")
    if s.quant != "none" or s.offload != "none" or s.zero_stage or s.num_gpus > 1:
        raise ValueError("the probe runs one process on one device without quantisation or offload")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    model, ref, hf_cfg = _build_setting_model(spec, s, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(s, params, device)
    half = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(s.precision)
    autocast = (lambda: torch.autocast(device.type, dtype=half)) if half is not None else contextlib.nullcontext
    rows = s.micro_batch * (2 if s.method == "dpo" else 1)  # DPO: chosen + rejected
    vocab = getattr(hf_cfg.get_text_config(), "vocab_size", spec.vocab_size)
    batch = torch.randint(0, vocab, (rows, s.seq_len), device=device)
    sync()
    _emit(event="built", index=index)
    share = float(job["share_seconds"])
    built_at = time.monotonic()
    deadline = built_at + share

    def micro() -> float:
        t = time.perf_counter()
        with autocast():
            loss = model(input_ids=batch, labels=batch).loss
            if s.method == "dpo":
                with torch.no_grad():
                    if ref is not None:
                        ref_loss = ref(input_ids=batch, labels=batch).loss
                    elif s.lora is not None and s.dpo_reference == "lora-base":
                        with model.disable_adapter():
                            ref_loss = model(input_ids=batch, labels=batch).loss
                    else:
                        ref_loss = torch.zeros((), device=device)
                loss = -torch.nn.functional.logsigmoid(0.1 * (ref_loss - loss))
        loss.backward()
        sync()
        return time.perf_counter() - t

    def step() -> float:
        t = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - t

    _warm_up_setting(index, micro, step, built_at, share)
    _timed_steps(index, micro, step, deadline)
    del params, batch
    _release(model, ref, optimizer, device)


def _build_setting_model(spec: ModelSpec, s: TrainingSetup, device):
    """The setting's model with random weights (seed 0) on `device`: its precision, attention
    kernel, LoRA adapters and gradient checkpointing; a DPO reference copy when it has one.
    (model, reference or None, the Transformers config.)"""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from trainfit.train.hf_config import build_hf_config

    attn = {"flash": "flash_attention_2"}.get(s.attention, s.attention)
    hf_cfg = build_hf_config(spec)
    hf_cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=attn)
    if s.precision in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if s.precision == "bf16" else torch.float16)
    model = model.to(device)
    ref = None
    if s.method == "dpo" and s.dpo_reference == "separate":
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    if s.lora is not None:
        from peft import LoraConfig, get_peft_model

        from trainfit.export.peft_config import lora_kwargs

        model = get_peft_model(model, LoraConfig(**lora_kwargs(s.lora, dora=s.dora)))
    if s.grad_checkpointing != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if s.lora is not None:
            model.enable_input_require_grads()
    model.train()
    return model, ref, hf_cfg


def _timed_steps(index: int, micro, step, deadline: float) -> None:
    """The timed micro-batches and optimizer steps, until there are enough or the setting's
    share of the time is spent; one `done` event with them."""
    micro_s, optim_s = [], []
    while len(micro_s) < TIMED_MICRO_BATCHES or len(optim_s) < TIMED_OPTIMIZER_STEPS:
        spent_micro = statistics.median(micro_s) if micro_s else 0.0
        now = time.monotonic()
        if now >= deadline or (micro_s and optim_s and now + spent_micro > deadline):
            break  # its share is spent: stop here rather than be stopped (a restart costs the next setting)
        micro_s.append(micro())
        _emit(event="micro", index=index, seconds=micro_s[-1], warmup=False)
        if len(optim_s) < TIMED_OPTIMIZER_STEPS:
            optim_s.append(step())
            _emit(event="optimizer", index=index, seconds=optim_s[-1], warmup=False)
    _emit(event="done", index=index, micro_seconds=micro_s, optimizer_seconds=optim_s)


def _warm_up_setting(index: int, micro, step, built_at: float, share_seconds: float) -> None:
    """Untimed micro-batches and optimizer steps until the setting runs settled (settled_after), at
    most WARMUP_MAX and WARMUP_SHARE of its time share (the rest is for the timed ones)."""
    previous: tuple[float, int | None] | None = None
    for _ in range(WARMUP_MAX):
        faults0 = _page_faults()
        seconds = micro()
        faults = None if faults0 is None else _page_faults() - faults0  # type: ignore[operator]
        _emit(event="micro", index=index, seconds=seconds, warmup=True, faults=faults)
        _emit(event="optimizer", index=index, seconds=step(), warmup=True)
        if settled_after(previous, (seconds, faults)):
            return
        if time.monotonic() - built_at > WARMUP_SHARE * share_seconds:
            return
        previous = (seconds, faults)


def settled_after(previous: tuple[float, int | None] | None, latest: tuple[float, int | None]) -> bool:
    """A warm-up micro-batch (seconds, minor page faults) shows the setting settled: it was not much
    faster than the one before (SETTLED_SPEEDUP) and its page faults no longer grew the memory (at
    most half the previous one's, or under SETTLED_FAULT_PAGES). The first one never does."""
    if previous is None:
        return False
    (before, faults_before), (now, faults_now) = previous, latest
    if now < SETTLED_SPEEDUP * before:
        return False
    if faults_now is None or faults_before is None:
        return True
    return faults_now <= max(SETTLED_FAULT_PAGES, faults_before / 2)


def _page_faults() -> int | None:
    """Minor page faults of this process so far (None where the platform has no getrusage)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _release(*objects) -> None:
    import gc

    import torch

    device = objects[-1]
    del objects
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _optimizer(s: TrainingSetup, params: list, device):
    import torch

    if s.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, fused=True if device.type == "cuda" else None)
    if s.optimizer in ("sgd", "sgd-momentum"):
        return torch.optim.SGD(params, lr=1e-5, momentum=0.9 if s.optimizer == "sgd-momentum" else 0.0)
    if s.optimizer in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw-32bit"):
        import bitsandbytes as bnb

        cls = {"adamw-8bit": bnb.optim.AdamW8bit, "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
               "paged-adamw-32bit": bnb.optim.PagedAdamW32bit}[s.optimizer]
        return cls(params, lr=1e-5)
    raise ValueError(f"optimizer {s.optimizer} is not one the probe runs")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"] and len(sys.argv) <= 3:
        raise SystemExit(child_main(*sys.argv[2:]))
    raise SystemExit("usage: python -m trainfit.train.probe_child --child (the plan's measuring process)")
