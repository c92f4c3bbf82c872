"""The GPU measurement harness: real training steps over a grid, measured against
trainfit's memory and speed predictions. Entry points: bench/cuda_memory.py and bench/cuda_speed.py.

Every configuration runs in a fresh subprocess (`--worker`), so one CUDA OOM, leak or crash cannot
taint the next. A worker builds the model from its transformers config with random weights on the
device (catalog shapes: Llama, Qwen2, Gemma-2, Phi, GPT-2, Mixtral), wraps it (PEFT LoRA, QLoRA
through bitsandbytes exactly as `trainfit train` loads it, DeepSpeed ZeRO-3 offload or FSDP2 CPU
offload at world size 1, FSDP2 full shard as rank 0 of 2-8 ranks emulated in the one process by
torch's fake process group: every buffer FSDP allocates, no data moved), resets the peak
statistics, runs warm-up steps (the first optimizer step allocates the states, so warm-up counts
for memory) and timed steps (cuda.synchronize around each),
and reports:
  * CUDA: torch.cuda.max_memory_allocated / max_memory_reserved, NVML used memory (this process's
    entry, sampled every 20 ms; the device-wide rise over the pre-start reading as a fallback where
    a container hides the pid), median step seconds;
  * CPU (`--device cpu`, tiny shrunk models; what the test suite runs): the live-tensor peak from
    trainfit.train.tensor_counter (FSDP2's DTensors and in-place storage resizes counted too) in
    place of max_memory_allocated over the warm-up steps (at least two), then the timed steps
    without the counter; no reserved / NVML figures.
A real out-of-memory error is recorded as status "oom" and compared with the prediction's verdict.
With --least-capacity (memory), each selected row that fits is run again under allocator caps
(torch.cuda.set_per_process_memory_fraction; a live-tensor cap in CPU mode), bisecting for the least
cap its steps complete in: the figure the fit verdict predicts (DeviceMemory.least_pool_bytes).

The parent predicts the same TrainingSetup with trainfit's core (estimate_memory: tensor_peak_bytes,
total_bytes, reserved/device figures where the model has them; predict_step: step_seconds) on the
detected GPU's catalog entry (or --hardware), writes the signed errors (predicted - measured) /
measured and their median / max to bench/results/cuda_{memory,speed}.{json,md}. The JSON is
rewritten after every row, and --resume skips rows already measured, so a grid longer than one
device command finishes over several commands.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("trainfit") is None:  # a bare GPU image: run from the checkout, not installed
    sys.path.insert(0, str(ROOT / "src"))

from typing import get_args  # noqa: E402

from trainfit.core.setup import LoraSettings, Optimizer, TrainingSetup  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SCHEMA_VERSION = 1
# A worker still running after this long is stuck (a hung NCCL init, a compile gone wrong): its row says so.
WORKER_TIMEOUT_SECONDS = 900


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: str  # catalog alias (trainfit models); trimmed / shrunk by `layers` and the device mode
    setup: TrainingSetup
    engine: str = "plain"  # plain | deepspeed (ZeRO-3 offload) | fsdp (FSDP2 CPU offload)
    layers: int | None = None  # keep only this many decoder layers (Mixtral-shaped mid-size model)
    vocab: int | None = None  # another vocabulary size on the catalog model's layers
    inject_oom: bool = False  # raise torch.OutOfMemoryError at the first step (tests the OOM path)
    memory_only: bool = False  # a row meant to find the OOM edge: the speed twin skips it
    cpu_shape: tuple[int, int, int] | None = None  # CPU mode: (layers, hidden, vocab) of the shrunk copy


_OPTIMIZERS_MODELLED = set(get_args(Optimizer))  # rows with an optimizer this TrainingSetup lacks are dropped
LORA_QV = LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules=["q_proj", "v_proj"])
LORA_QKVO = LoraSettings(rank=16, alpha=32, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
LORA_ALL = LoraSettings(rank=16, alpha=32, dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
# Per-architecture LoRA targets where q_proj / v_proj do not exist (GPT-2 fuses q, k, v in c_attn).
TARGETS = {"gpt2": ["c_attn"]}


def _s(method: str = "full", **kw) -> TrainingSetup:
    kw.setdefault("micro_batch", 4)
    kw.setdefault("seq_len", 1024)
    kw.setdefault("precision", "bf16-mixed" if method in ("full", "pretrain") else "bf16")
    if method in ("lora", "qlora"):
        kw.setdefault("lora", LORA_QV)
    if method == "qlora":
        kw.setdefault("quant", "nf4-dq")
    return TrainingSetup(method=method, **kw)


def _sharded(num_gpus: int, method: str = "full", **kw) -> TrainingSetup:
    """FSDP full shard over `num_gpus` ranks (trainfit's FSDP2: one gradient per parameter)."""
    return _s(method, num_gpus=num_gpus, zero_stage=3, fsdp_strategy="full-shard", **kw)


_SETUP_FIELDS = {f.name for f in dataclasses.fields(TrainingSetup)}


def _lora_for(model_arch: str, setup: TrainingSetup) -> TrainingSetup:
    if setup.lora is not None and model_arch in TARGETS and setup.lora.target_modules == LORA_QV.target_modules:
        return dataclasses.replace(setup, lora=dataclasses.replace(setup.lora, target_modules=TARGETS[model_arch]))
    return setup


# Architectures for an 80 GB GPU: name -> (catalog alias, decoder layers kept or None for all).
ARCHITECTURES = {
    "llama-1b": ("llama3.2-1b", None),
    "llama-8b": ("llama3.1-8b", None),
    "qwen2-0.5b": ("qwen2.5-0.5b", None),
    "qwen2-7b": ("qwen2.5-7b", None),
    "gemma2-2b": ("gemma-2-2b", None),
    "phi-2.7b": ("phi-2", None),
    "gpt2-1.5b": ("gpt2-xl", None),
    "mixtral-2l": ("mixtral-8x7b", 2),  # Mixtral's layer shapes, 2 of 32 layers: about 3 B parameters
}


def cuda_grid() -> list[Case]:
    """The CUDA grid: every architecture × {full, LoRA, QLoRA} at one shape, then one knob at a time
    on Llama-1B (precision, micro-batch, sequence, checkpointing, optimizer), 8B rows near and past
    80 GB (to compare OOM verdicts), and the 1-GPU ZeRO-3 / FSDP offload cases."""
    cases: list[Case] = []
    from trainfit.core.models.catalog import get_model

    for short, (alias, layers) in ARCHITECTURES.items():
        arch_key = get_model(alias).architecture
        big = short in ("llama-8b", "qwen2-7b")
        for method in ("full", "lora", "qlora"):
            if big and method == "full":
                continue  # an 8B full fine-tune with AdamW needs ~130 GB: its own rows below
            setup = _lora_for(arch_key, _s(method, micro_batch=2, seq_len=1024,
                                          grad_checkpointing="full" if big else "none"))
            cases.append(Case(f"{short} {method} b2 s1024", alias, setup, layers=layers))
    base = "llama3.2-1b"
    knobs = [
        ("fp32", _s(precision="fp32")),
        ("pure-bf16", _s(precision="bf16")),
        ("fp16-mixed", _s(precision="fp16-mixed")),
        ("b1 s512", _s(micro_batch=1, seq_len=512)),
        ("b8 s1024", _s(micro_batch=8)),
        ("b1 s4096", _s(micro_batch=1, seq_len=4096)),
        ("b4 s2048 ckpt", _s(seq_len=2048, grad_checkpointing="full")),
        ("b16 s1024 ckpt", _s(micro_batch=16, grad_checkpointing="full")),
        ("eager", _s(attention="eager")),
        ("sgd", _s(optimizer="sgd")),
        ("sgd-momentum", _s(optimizer="sgd-momentum")),
        ("adafactor", _s(optimizer="adafactor")),
        ("adamw-8bit", _s(optimizer="adamw-8bit")),
        ("paged-adamw-8bit", _s(optimizer="paged-adamw-8bit")),
        ("accum4", _s(grad_accum=4)),
        ("paged-adamw-32bit", _s(optimizer="paged-adamw-32bit")),
        ("lion", _s(optimizer="lion")),
        ("activation-offload b8", _s(micro_batch=8, activation_offload=True)),
        ("optimizer-in-backward", _s(optimizer_in_backward=True)),
    ]
    knobs = [(label, setup) for label, setup in knobs if setup.optimizer in _OPTIMIZERS_MODELLED]
    cases += [Case(f"llama-1b full {label}", base, setup) for label, setup in knobs]
    cases += [
        Case("llama-1b lora all-linear b8", base, _s("lora", micro_batch=8, lora=LORA_ALL)),
        Case("llama-1b lora all-linear ckpt b8 s2048", base,
             _s("lora", micro_batch=8, seq_len=2048, lora=LORA_ALL, grad_checkpointing="full")),
        Case("llama-1b qlora nf4 b8", base, _s("qlora", micro_batch=8, quant="nf4")),
        Case("llama-8b lora b8 s2048", "llama3.1-8b", _s("lora", micro_batch=8, seq_len=2048), memory_only=True),
        Case("llama-8b qlora all-linear b4 s4096 ckpt", "llama3.1-8b",
             _s("qlora", micro_batch=4, seq_len=4096, lora=LORA_ALL, grad_checkpointing="full")),
        # 8B full, AdamW with fp32 master weights: ~16 B/parameter = ~128 GB of states: OOM on 80 GB.
        Case("llama-8b full b1 s1024 ckpt", "llama3.1-8b", _s(micro_batch=1, grad_checkpointing="full"),
             memory_only=True),
        # pure bf16 + 8-bit AdamW: 2 + 2 + 2 B/parameter = ~48 GB of states: near the edge, fits.
        Case("llama-8b full adamw-8bit pure-bf16 b1 s1024 ckpt", "llama3.1-8b",
             _s(micro_batch=1, precision="bf16", optimizer="adamw-8bit", grad_checkpointing="full")),
        Case("qwen2-7b lora b16 s4096", "qwen2.5-7b", _s("lora", micro_batch=16, seq_len=4096), memory_only=True),
        # Llama 2 70B's shapes (Llama 3.1 70B's layers, the same, with Llama 2's 32,000-token vocabulary;
        # 8 of 80 layers) at the published 2-GPU QLoRA OOM's micro-batch and sequence
        # (bench/published_memory.py, finding 23): the transients that decide how much of the
        # allocator's slack survives at the card's limit are per layer, so --least-capacity here
        # measures what that run's verdict rests on.
        Case("llama2-70b-8l qlora qkvo b4 s4096 ckpt", "meta-llama/Llama-3.1-70B",
             _s("qlora", micro_batch=4, seq_len=4096, lora=LORA_QKVO, grad_checkpointing="full"), layers=8,
             vocab=32000),
        # 1-GPU sharding with offload: ZeRO-3 through DeepSpeed, FSDP2 with CPU offload.
        Case("llama-8b zero3 offload full b1 s1024 ckpt", "llama3.1-8b",
             _s(micro_batch=1, zero_stage=3, offload="optimizer+params", grad_checkpointing="full"),
             engine="deepspeed"),
        Case("llama-1b zero3 offload-optimizer full b4 s1024", base,
             _s(zero_stage=3, offload="optimizer"), engine="deepspeed"),
        Case("llama-1b fsdp cpu-offload full b4 s1024", base,
             _s(zero_stage=3, offload="optimizer+params", fsdp_strategy="full-shard"), engine="fsdp"),
        Case("llama-8b fsdp cpu-offload full b1 s1024 ckpt", "llama3.1-8b",
             _s(micro_batch=1, zero_stage=3, offload="optimizer+params", grad_checkpointing="full",
                fsdp_strategy="full-shard"), engine="fsdp"),
        # FSDP2 full shard at 2, 4 and 8 ranks: rank 0's memory, the other ranks emulated in the one
        # process (_init_emulated_process_group). No step time: the collectives move nothing.
        Case("llama-1b fsdp x4 full b4 s1024", base, _sharded(4), engine="fsdp", memory_only=True),
        Case("llama-8b fsdp x8 full b1 s2048 ckpt", "llama3.1-8b",
             _sharded(8, micro_batch=1, seq_len=2048, grad_checkpointing="full"), engine="fsdp", memory_only=True),
        Case("llama-8b fsdp x2 full b1 s2048 ckpt", "llama3.1-8b",
             _sharded(2, micro_batch=1, seq_len=2048, grad_checkpointing="full"), engine="fsdp", memory_only=True),
        Case("llama-8b fsdp x4 lora all-linear b4 s2048 ckpt", "llama3.1-8b",
             _sharded(4, "lora", micro_batch=4, seq_len=2048, lora=LORA_ALL, grad_checkpointing="full"),
             engine="fsdp", memory_only=True),
        # Llama 2 70B's layers (8 of 80): units whose gathered parameters and gradients outweigh the activations
        Case("llama2-70b-8l fsdp x8 full b1 s4096 ckpt", "meta-llama/Llama-3.1-70B",
             _sharded(8, micro_batch=1, seq_len=4096, grad_checkpointing="full"), engine="fsdp", layers=8,
             vocab=32000, memory_only=True),
    ]
    return cases


def cpu_grid() -> list[Case]:
    """Tiny CPU grid (same code path; what the test suite runs): fp32, no bitsandbytes kernels."""
    return [
        Case("llama full fp32 b2 s64", "llama3.2-1b", _s(precision="fp32", micro_batch=2, seq_len=64, device="cpu")),
        Case("qwen2 lora fp32 b2 s64", "qwen2.5-0.5b",
             _s("lora", precision="fp32", micro_batch=2, seq_len=64, device="cpu")),
        Case("gpt2 full fp32 ckpt b2 s64", "gpt2", _s(precision="fp32", micro_batch=2, seq_len=64, device="cpu",
                                                    grad_checkpointing="full")),
        # FSDP2 full shard: rank 0 of 2, emulated in the one process (_init_emulated_process_group)
        Case("llama fsdp x2 full fp32 b2 s64", "llama3.2-1b", _sharded(2, precision="fp32", micro_batch=2,
                                                                     seq_len=64, device="cpu"), engine="fsdp"),
        Case("mixtral lora fp32 sgd b2 s64", "mixtral-8x7b",
             _lora_for("mixtral", _s("lora", precision="fp32", micro_batch=2, seq_len=64, device="cpu",
                                     optimizer="sgd"))),
    ]


QUICK = {"cuda": ("llama-1b full b2 s1024", "llama-1b lora b2 s1024", "llama-1b qlora b2 s1024",
                  "llama-1b full sgd", "llama-1b fsdp cpu-offload full b4 s1024", "llama-1b fsdp x4 full b4 s1024"),
         "cpu": ("llama full fp32 b2 s64", "qwen2 lora fp32 b2 s64", "gpt2 full fp32 ckpt b2 s64")}


def grid(device: str, quick: bool = False, only: str | None = None) -> list[Case]:
    cases = cuda_grid() if device == "cuda" else cpu_grid()
    if quick:
        cases = [c for c in cases if c.name in QUICK[device]]
    if only:
        cases = [c for c in cases if only in c.name]
    return cases


# ---------------------------------------------------------------------------------------------
# Model specs: the catalog's shapes (CUDA) or a tiny shrunk copy with the same features (CPU).

def case_spec(case: Case, device: str):
    from trainfit.core.models.catalog import get_model

    spec = get_model(case.model)
    if case.layers is not None:
        spec = dataclasses.replace(spec, num_layers=case.layers, exact_params=None, id=f"{spec.id}[{case.layers}L]")
    if case.vocab is not None:
        spec = dataclasses.replace(spec, vocab_size=case.vocab, exact_params=None, id=f"{spec.id}[vocab {case.vocab}]")
    if device == "cpu":
        from trainfit.train.hf_config import shrink

        layers, hidden, vocab = case.cpu_shape or (2, 64, 512)
        spec = shrink(spec, layers=layers, hidden=hidden, heads=4, vocab=vocab,
                      max_positions=max(256, case.setup.seq_len))
    return spec


# ---------------------------------------------------------------------------------------------
# Prediction (parent process: no CUDA context of its own, so NVML readings stay the worker's).

FALLBACK_GPU = "h100-sxm"  # the GPU the grid is sized for (80 GB)


def detect_hardware(device: str) -> tuple[str, dict]:
    """The --hardware spec trainfit should predict for, and the machine's description."""
    from importlib import metadata

    info = {"python": platform.python_version(), "host": platform.node(), "platform": platform.platform()}
    for name in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "deepspeed"):
        try:  # package metadata: no import, so the parent never creates a CUDA context
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = "not installed"
    if device == "cpu":
        info["gpu"] = None
        return "cpu", info
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda_version = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 13000 -> "13.0"
        info.update(gpu=name, driver=driver.decode() if isinstance(driver, bytes) else driver,
                    driver_cuda=f"{cuda_version // 1000}.{cuda_version % 1000 // 10}",
                    gpu_memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total))
        pynvml.nvmlShutdown()
    except Exception as exc:
        info.update(gpu=None, nvml=f"unavailable: {exc}")
        print(f"NVML unavailable ({exc}): predicting for {FALLBACK_GPU}; pass --hardware to choose", file=sys.stderr)
        return FALLBACK_GPU, info
    from trainfit.core.machines.gpu_catalog import find_gpu

    found = find_gpu(info["gpu"], info.get("gpu_memory_total_bytes"))
    if found is None:
        print(f"{info['gpu']} is not in trainfit's GPU catalog: predicting for {FALLBACK_GPU}; pass --hardware "
              "to choose", file=sys.stderr)
    return (found.id if found else FALLBACK_GPU), info


def predict(case: Case, device: str, hardware_spec: str) -> dict:
    """trainfit's prediction for the case's TrainingSetup on `hardware_spec`."""
    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.memory import estimate_memory
    from trainfit.core.speed import predict_step

    spec = case_spec(case, device)
    setup = case.setup
    if device == "cpu" and setup.num_gpus > 1:
        # estimate_memory refuses sharding on a CPU (no NCCL); the tensors are a GPU's, and CPU mode
        # compares the tensor peak alone
        setup, hardware_spec = dataclasses.replace(setup, device="cuda"), FALLBACK_GPU
    hw = resolve_hardware(hardware_spec)
    out: dict = {"hardware": hardware_spec, "params_total": None}
    try:
        mem = estimate_memory(spec, setup, hw)
        dev = mem.devices[0]
        out.update(params_total=mem.params_total, tensor_peak_bytes=dev.tensor_peak_bytes, total_bytes=dev.total_bytes,
                   capacity_bytes=dev.capacity_bytes, fits=dev.fits, reserved_peak_bytes=dev.reserved_peak_bytes,
                   device_total_bytes=dev.device_total_bytes,  # what nvidia-smi shows
                   # the least pool the run completes in (the fit verdict's figure); in CPU mode the
                   # capped quantity is the live tensor bytes, so the tensor peak
                   least_pool_bytes=dev.least_pool_bytes if device == "cuda" else dev.tensor_peak_bytes,
                   # every term, so the CUDA constants can be refitted from the JSON alone
                   components={c.name: c.bytes for c in dev.components}, notes=list(mem.notes))
        if setup.num_gpus > 1 and out["device_total_bytes"] is not None:
            # emulated ranks run no NCCL: what nvidia-smi would show less NCCL's own buffers
            nccl = out["components"].get("nccl_buffers", 0)
            out["device_total_bytes"] -= nccl
            out["notes"].append(f"device_total_bytes leaves out NCCL's buffers ({nccl} B): the ranks are emulated")
    except Exception as exc:  # a setup the model refuses is a finding, not a harness crash
        out["memory_error"] = f"{type(exc).__name__}: {exc}"
    try:
        out["step_seconds"] = predict_step(spec, setup, hw).step_seconds
    except Exception as exc:
        out["speed_error"] = f"{type(exc).__name__}: {exc}"
    return out


def signed_error_pct(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured in percent: negative = under-predicted (the OOM direction)."""
    if predicted is None or not measured:
        return None
    return round((predicted - measured) / measured * 100, 2)


def compare(pred: dict, meas: dict, least: dict | None = None) -> dict:
    ok = meas.get("status") == "ok"
    reserved_pred = pred.get("reserved_peak_bytes") or pred.get("total_bytes")
    device_pred = pred.get("device_total_bytes") or pred.get("total_bytes")
    nvml = meas.get("nvml_process_used_bytes") or meas.get("nvml_device_used_delta_bytes")
    errors = {
        "tensor_peak_vs_allocated_pct": signed_error_pct(pred.get("tensor_peak_bytes"),
                                                         meas.get("max_memory_allocated_bytes") if ok else None),
        "reserved_vs_reserved_pct": signed_error_pct(reserved_pred,
                                                     meas.get("max_memory_reserved_bytes") if ok else None),
        "device_total_vs_nvml_pct": signed_error_pct(device_pred, nvml if ok else None),
        "step_seconds_pct": signed_error_pct(pred.get("step_seconds"), meas.get("step_seconds") if ok else None),
        "least_pool_vs_least_capacity_pct": signed_error_pct(pred.get("least_pool_bytes"),
                                                             (least or {}).get("least_capacity_bytes")),
    }
    fits = pred.get("fits")
    verdict = None
    if meas.get("status") in ("ok", "oom") and fits is not None:
        measured_fits = meas["status"] == "ok"
        verdict = "agree" if fits == measured_fits else ("missed_oom" if fits else "false_oom")
    return {"errors": errors, "oom_verdict": verdict}


# ---------------------------------------------------------------------------------------------
# Worker: one configuration in this process.

def _sampler(device: str):
    """A thread sampling NVML used memory (this pid, and the whole device) every 20 ms."""
    import threading

    state = {"process_max": None, "device_max": None, "device_before": None, "stop": False, "error": None}
    if device != "cuda":
        return state, lambda: None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        state["device_before"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception as exc:
        state["error"] = f"NVML unavailable: {exc}"
        return state, lambda: None
    pid = os.getpid()

    def poll() -> None:
        while not state["stop"]:
            try:
                used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
                state["device_max"] = max(state["device_max"] or 0, used)
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid == pid and proc.usedGpuMemory:
                        state["process_max"] = max(state["process_max"] or 0, int(proc.usedGpuMemory))
            except Exception as exc:  # keep the last good maxima; say why sampling stopped
                state["error"] = f"NVML sampling: {exc}"
                return
            time.sleep(0.02)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()

    def stop() -> None:
        state["stop"] = True
        thread.join(timeout=1)

    return state, stop


def _skip_reason(case: Case, device: str) -> str | None:
    import importlib.util

    s = case.setup
    needs_bnb = s.method == "qlora" or s.quant != "none" or s.optimizer in BNB_OPTIMIZERS
    if needs_bnb and device != "cuda":
        return "bitsandbytes kernels need CUDA"
    if needs_bnb and importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed (carry its wheel: bench/README.md)"
    if case.engine == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (carry its wheel: bench/README.md)"
    if case.engine == "deepspeed" and device != "cuda":
        return "DeepSpeed ZeRO-3 offload needs CUDA"
    if case.engine == "fsdp" and device != "cuda" and s.offload != "none":
        return "FSDP CPU offload needs a CUDA device to offload from"
    return None


def _hf_model(spec, setup: TrainingSetup, device: str, workdir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    from trainfit.train.hf_config import build_hf_config

    cfg = build_hf_config(spec)  # with the model's own dropout, which the prediction counts too
    cfg.use_cache = False
    attn = {"flash": "flash_attention_2"}.get(setup.attention, setup.attention)
    if spec.capabilities.eager_attention_only:
        attn = "eager"  # as the memory model assumes: transformers runs these with eager attention only
    torch.manual_seed(0)
    if setup.method == "qlora" or setup.quant != "none":
        # As `trainfit train` does: bitsandbytes quantizes while loading, so save a bf16 random init
        # once (cached per model in the work dir) and load it quantized.
        from transformers import BitsAndBytesConfig

        init = workdir / f"init-{spec.id.replace('/', '_')}"
        if not (init / "config.json").is_file():
            with torch.device(device):
                AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(str(init))
            torch.cuda.empty_cache()
        q = BitsAndBytesConfig(load_in_8bit=True) if setup.quant == "int8" else BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=setup.quant != "nf4",
            bnb_4bit_compute_dtype=torch.bfloat16)
        return AutoModelForCausalLM.from_pretrained(str(init), quantization_config=q, attn_implementation=attn,
                                                    device_map={"": 0}, dtype=torch.bfloat16)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.precision, torch.float32)
    with torch.device(device):  # random init on the GPU: seconds for 8B, where the CPU takes minutes
        return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype)


# transformers' optim names adamw_bnb_8bit / paged_adamw_8bit / paged_adamw_32bit / lion_32bit.
BNB_OPTIMIZERS = {"adamw-8bit": "AdamW8bit", "paged-adamw-8bit": "PagedAdamW8bit",
                  "paged-adamw-32bit": "PagedAdamW32bit", "lion": "Lion"}


def _optimizer_in_backward(params, setup: TrainingSetup, device: str) -> None:
    """torchtune's optimizer_in_bwd: one optimizer per parameter, stepped by a hook as soon as its
    gradient is accumulated, and the gradient freed at once."""
    optimizers = {p: _optimizer([p], setup, device) for p in params}

    def hook(p) -> None:
        optimizers[p].step()
        optimizers[p].zero_grad(set_to_none=True)

    for p in params:
        p.register_post_accumulate_grad_hook(hook)


def _optimizer(params, setup: TrainingSetup, device: str, fused: bool = True):
    import torch

    name = setup.optimizer
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, scale_parameter=False, relative_step=False)  # HF Trainer's settings
    if name in BNB_OPTIMIZERS:
        import bitsandbytes as bnb

        return getattr(bnb.optim, BNB_OPTIMIZERS[name])(params, lr=1e-4)
    # transformers' default adamw_torch_fused; FSDP2's offloaded DTensor parameters take the foreach path.
    return torch.optim.AdamW(params, lr=1e-4, fused=fused or None)


def _wrap(model, case: Case, setup: TrainingSetup, device: str):
    """Checkpointing and PEFT, in the order `trainfit train` applies them. Returns the model."""
    if setup.grad_checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if setup.lora is not None and setup.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        if setup.method == "qlora":
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=setup.grad_checkpointing != "none")
        elif setup.grad_checkpointing == "full":
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=setup.lora.rank, lora_alpha=setup.lora.alpha,
                                                 lora_dropout=setup.lora.dropout, task_type="CAUSAL_LM",
                                                 target_modules=setup.lora.target_modules))
    return model


def _init_single_process_group(backend: str) -> None:
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:  # a free local port for the world-size-1 rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    dist.init_process_group(backend, rank=0, world_size=1)


def _deepspeed_engine(model, setup: TrainingSetup):
    import deepspeed

    _init_single_process_group("nccl")
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True, "contiguous_gradients": True, "stage3_gather_16bit_weights_on_model_save": False}
    if setup.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {"train_micro_batch_size_per_gpu": setup.micro_batch, "gradient_accumulation_steps": setup.grad_accum,
              "zero_optimization": zero, "bf16": {"enabled": setup.precision.startswith("bf16")},
              "fp16": {"enabled": setup.precision.startswith("fp16")},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "wall_clock_breakdown": False}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=config)
    return engine


def _decoder_layers(model) -> list:
    """The decoder layers FSDP wraps one unit each: the model's _no_split_modules, as Accelerate's
    TRANSFORMER_BASED_WRAP finds them (through a PEFT wrapper too)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def _init_emulated_process_group(world_size: int) -> None:
    """Rank 0 of `world_size` ranks, emulated in this one process: torch's fake process group
    (torch.testing._internal.distributed.fake_pg, what torch's own FSDP memory tests use) accepts
    every collective and moves no data. FSDP still allocates every buffer it would hand a real
    collective (all-gather outputs, reduce-scatter inputs), so what rank 0 allocates is what it
    would on a real world of that size, less NCCL's own buffers. The values are garbage; a dense
    model's memory does not depend on them."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())


def _fsdp_model(model, setup: TrainingSetup):
    """FSDP2 (fully_shard) over each decoder layer and the root, bf16 compute and gradient
    reduction. With offload "optimizer+params" the parameters live on the CPU (the optimizer then
    steps there), at world size 1; with setup.num_gpus > 1 the shards are rank 0's of that many
    ranks, emulated on this one device (_init_emulated_process_group)."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if setup.num_gpus > 1:
        _init_emulated_process_group(setup.num_gpus)
    else:
        _init_single_process_group("nccl")
    # Accelerate's policy for mixed_precision bf16: gradients reduced in bf16 too (core/memory/fsdp.py)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
        if setup.precision.startswith("bf16") else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if setup.offload == "optimizer+params" else OffloadPolicy()
    for layer in _decoder_layers(model):
        fully_shard(layer, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    return model


def _capped_counter(cap_bytes: int):
    """The live-tensor counter with a limit: the CPU mode's stand-in for a card's capacity."""
    import torch

    from fsdp_no_sync_cpu import FsdpTensorCounter

    class CappedCounter(FsdpTensorCounter):
        def _add_storage(self, storage) -> None:
            super()._add_storage(storage)
            if self.current_bytes > cap_bytes:
                raise torch.OutOfMemoryError(f"live tensors reached {self.current_bytes} B, over the "
                                             f"{cap_bytes} B cap (CPU mode)")

    return CappedCounter()


def run_worker(case: Case, device: str, warmup: int, steps: int, workdir: Path, cap_bytes: int | None = None) -> dict:
    """Build, warm up and time one case; memory and step-time readings (status ok / oom / skipped).
    `cap_bytes` limits the run the way a smaller card would: on CUDA the caching allocator's pool
    (torch.cuda.set_per_process_memory_fraction, so the allocator frees its cache and retries at the
    cap, then raises OutOfMemoryError, as at a card's limit); on the CPU the live tensor bytes."""
    reason = _skip_reason(case, device)
    if reason:
        return {"status": "skipped", "reason": reason}
    state, stop_sampler = _sampler(device)  # before the CUDA context exists: its baseline is the device's
    import contextlib

    import torch

    result: dict = {"status": "ok"}
    counter = None
    phase = "build"
    try:
        if device == "cuda":
            # TF32 matmuls stay off (PyTorch's default, which HF Trainer leaves alone unless --tf32):
            # the speed model charges fp32 rows at the fp32 rate.
            torch.cuda.set_device(0)
            if cap_bytes is not None:
                total = torch.cuda.get_device_properties(0).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), 0)
        else:
            torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        spec = case_spec(case, device)
        setup = case.setup
        offloaded = case.engine == "fsdp" and setup.offload != "none"
        build_device = "cpu" if offloaded else device  # FSDP's CPU offload moves it itself
        model = _wrap(_hf_model(spec, setup, build_device, workdir), case, setup, device)
        engine = None
        if case.engine == "deepspeed":
            engine = _deepspeed_engine(model, setup)
            model = engine.module
        elif case.engine == "fsdp":
            model = _fsdp_model(model, setup)
        model.train()
        opt = None
        if engine is None:
            params = [p for p in model.parameters() if p.requires_grad]
            if getattr(setup, "optimizer_in_backward", False):
                _optimizer_in_backward(params, setup, device)
            else:
                opt = _optimizer(params, setup, device, fused=not offloaded)
        # Activation offloading: saved tensors go to pinned host memory (TRL / torchtune's approach).
        saved = (lambda: torch.autograd.graph.save_on_cpu(pin_memory=device == "cuda")) \
            if getattr(setup, "activation_offload", False) else contextlib.nullcontext
        gen = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, spec.vocab_size, (setup.micro_batch, setup.seq_len), generator=gen).to(device)
                   for _ in range(setup.grad_accum)]
        half = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(setup.precision)
        autocast = (lambda: torch.autocast(device, dtype=half)) if half is not None and case.engine == "plain" \
            else contextlib.nullcontext
        scaler = torch.amp.GradScaler(device) if setup.precision == "fp16-mixed" and case.engine == "plain" else None

        forward = engine if engine is not None else model

        def step() -> None:
            if case.inject_oom:
                raise torch.OutOfMemoryError("injected out-of-memory error (harness test)")
            for ids in batches:
                with autocast(), saved():
                    loss = forward(input_ids=ids, labels=ids).loss / setup.grad_accum
                if engine is not None:
                    engine.backward(loss)
                    engine.step()  # DeepSpeed steps every micro-batch and applies at the accumulation boundary
                elif scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                del loss
            if engine is not None or opt is None:
                pass  # DeepSpeed stepped above; optimizer-in-backward stepped in the hooks
            elif scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if opt is not None:
                opt.zero_grad(set_to_none=True)

        if device == "cuda":
            torch.cuda.synchronize()
            # Build temporaries (random init, the QLoRA init file) are not part of a training run that
            # loads its weights: release them, then peaks = weights + everything the steps add.
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            state["process_max"] = state["device_max"] = None
            result["allocated_after_build_bytes"] = torch.cuda.memory_allocated()
        else:
            # trainfit's live-tensor counter, also counting DTensors by their local shard and FSDP2's
            # in-place storage resizes (unshard / reshard), which no op reports
            from fsdp_no_sync_cpu import FsdpTensorCounter, patched_fsdp_storage

            counter = FsdpTensorCounter() if cap_bytes is None else _capped_counter(cap_bytes)
            # an FSDP2 parameter is a DTensor: its storage is the local shard's
            existing = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()] \
                + list(model.buffers()) + batches
            counter.track_existing(existing)
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in existing}
            result["allocated_after_build_bytes"] = sum(storages.values())  # tied weights once
        times = []
        if counter is not None:
            # The live-tensor counter is a Python dispatch hook on every op (10-100x slower steps), so
            # on the CPU it watches the warm-up steps only - at least two: from the second step on the
            # optimizer states are alive during backward - and the timed steps run without it.
            with counter, patched_fsdp_storage(counter):
                for _ in range(max(2, warmup)):
                    phase = "warm-up"
                    step()
            warmup = 0
        for i in range(warmup + steps):
            phase = "warm-up" if i < warmup else "timed"
            t0 = time.perf_counter()
            step()
            if device == "cuda":
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        result.update(step_seconds=statistics.median(times), step_seconds_all=[round(t, 5) for t in times])
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        # cuBLAS, NCCL and bitsandbytes report an exhausted GPU as a RuntimeError naming it.
        if not isinstance(exc, torch.OutOfMemoryError) and "out of memory" not in str(exc).lower():
            raise
        result.update(status="oom", phase=phase, error=str(exc).splitlines()[0][:300])
    finally:
        stop_sampler()
    if device == "cuda":
        stats = torch.cuda.memory_stats()
        result.update(max_memory_allocated_bytes=torch.cuda.max_memory_allocated(),
                      max_memory_reserved_bytes=torch.cuda.max_memory_reserved(),
                      # cudaMalloc failures the allocator survived by freeing its cache: a run near its limit
                      num_alloc_retries=stats.get("num_alloc_retries"),
                      nvml_process_used_bytes=state["process_max"],
                      nvml_device_used_delta_bytes=(state["device_max"] - state["device_before"])
                      if state["device_max"] is not None and state["device_before"] is not None else None)
        if state["error"]:
            result["nvml_note"] = state["error"]
    elif counter is not None:
        result.update(max_memory_allocated_bytes=counter.peak_bytes, max_memory_reserved_bytes=None,
                      nvml_process_used_bytes=None, nvml_device_used_delta_bytes=None,
                      memory_source="live-tensor counter (trainfit.train.tensor_counter)")
    return result


# ---------------------------------------------------------------------------------------------
# Least capacity: the smallest allocator cap the steps complete in, which is what the fit verdict
# predicts (DeviceMemory.least_pool_bytes) and what no uncapped reading shows: with room to spare the
# pool keeps its cached blocks (max_memory_reserved), at a card's limit the allocator frees every
# wholly free segment and retries, so only the gaps inside segments that hold live tensors remain.

# The allocator rounds large segments to 2 MiB, so a finer cap means nothing on CUDA; the CPU mode's
# tiny models count bytes.
CAPACITY_ALIGN_BYTES = {"cuda": 2 * 2**20, "cpu": 4096}


def bisect_capacity(runs_at, failing_bytes: int, passing_bytes: int, probes: int, align_bytes: int) -> dict:
    """Bisect between a cap known to fail (below the allocated peak) and one known to pass (the
    uncapped run's reserved peak): `runs_at(cap)` runs the steps under the cap in a fresh process and
    returns its result; each probe halves the bracket. A probe that neither completes nor runs out
    of memory (a crash, a timeout) ends the search with the bracket it had."""
    lo, hi = failing_bytes, passing_bytes
    tried = []
    for _ in range(probes):
        mid = (lo + hi) // 2 // align_bytes * align_bytes
        if mid <= lo or mid >= hi:
            break
        result = runs_at(mid)
        # the phase tells an OOM while building (weights loading under the cap) from one in the steps
        tried.append({"cap_bytes": mid, "status": result["status"], "phase": result.get("phase"),
                      "num_alloc_retries": result.get("num_alloc_retries")})
        if result["status"] == "ok":
            hi = mid
        elif result["status"] == "oom":
            lo = mid
        else:
            break
    return {"least_capacity_bytes": hi, "failing_cap_bytes": lo, "resolution_bytes": hi - lo, "probes": tried}


def measure_least_capacity(case: Case, device: str, warmup: int, workdir: Path, measured: dict,
                           probes: int) -> dict:
    """The least capacity of a case that ran uncapped (`measured`): bisected on warm-up steps plus one,
    so the optimizer states exist and a full step runs on them."""
    allocated = measured["max_memory_allocated_bytes"]
    # Known to pass: the uncapped run's reserved peak (the same sizes never need more); on the CPU
    # (no pool) a quarter above the live-tensor peak, which the same steps cannot reach.
    passing = measured.get("max_memory_reserved_bytes") or allocated * 5 // 4
    return bisect_capacity(lambda cap: run_case_subprocess(case, device, warmup, 1, workdir, cap_bytes=cap),
                           allocated - 1, passing, probes, CAPACITY_ALIGN_BYTES[device])


def _case_to_json(case: Case) -> str:
    return json.dumps(dataclasses.asdict(case))


def _case_from_json(text: str) -> Case:
    raw = json.loads(text)
    s = raw.pop("setup")
    lora = s.pop("lora")
    # A result written by an older trainfit may name a knob this one dropped: keep the ones it has.
    known = {k: v for k, v in s.items() if k in _SETUP_FIELDS}
    setup = TrainingSetup(**known, lora=LoraSettings(**lora) if lora else None)
    return Case(**raw, setup=setup)


# ---------------------------------------------------------------------------------------------
# Driver.

def run_case_subprocess(case: Case, device: str, warmup: int, steps: int, workdir: Path,
                        timeout_seconds: float = WORKER_TIMEOUT_SECONDS, cap_bytes: int | None = None) -> dict:
    """One case in a fresh interpreter; a crash or hang becomes a row, never a harness failure."""
    out = Path(tempfile.mkstemp(prefix="cuda-harness-", suffix=".json", dir=workdir)[1])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", _case_to_json(case), "--device", device,
           "--warmup", str(warmup), "--steps", str(steps), "--result-file", str(out), "--workdir", str(workdir)]
    if cap_bytes is not None:
        cmd += ["--cap-bytes", str(cap_bytes)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        out.unlink(missing_ok=True)
        return {"status": "timeout", "reason": f"worker ran past {timeout_seconds:.0f} s"}
    wall = round(time.perf_counter() - t0, 1)
    text = out.read_text() if out.exists() else ""
    out.unlink(missing_ok=True)
    if proc.returncode != 0 or not text:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-8:]
        # The kernel's OOM killer (host RAM, e.g. a CPU-offload case) ends the worker with SIGKILL.
        status = "host_oom_killed" if proc.returncode == -9 else "crashed"
        return {"status": status, "returncode": proc.returncode, "stderr_tail": tail, "wall_seconds": wall}
    result = json.loads(text)
    result["wall_seconds"] = wall
    return result


def summarise(rows: list[dict], key: str) -> dict:
    vals = [r["errors"][key] for r in rows if r.get("errors", {}).get(key) is not None]
    if not vals:
        return {"rows": 0}
    return {"rows": len(vals), "median_abs_pct": round(statistics.median(abs(v) for v in vals), 2),
            "max_abs_pct": round(max(abs(v) for v in vals), 2), "median_signed_pct": round(statistics.median(vals), 2),
            "under_predicted_over_10pct": sum(v < -10 for v in vals)}


def write_results(kind: str, rows: list[dict], machine: dict, args, out_dir: Path, argv: list[str]) -> dict:
    keys = ("tensor_peak_vs_allocated_pct", "reserved_vs_reserved_pct", "device_total_vs_nvml_pct",
            "least_pool_vs_least_capacity_pct") if kind == "memory" else ("step_seconds_pct",)
    summary = {k: summarise(rows, k) for k in keys}
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["measured"]["status"]] = statuses.get(r["measured"]["status"], 0) + 1
    summary["statuses"] = statuses
    if kind == "memory":
        verdicts = [r["oom_verdict"] for r in rows if r.get("oom_verdict")]
        summary["oom_verdicts"] = {v: verdicts.count(v) for v in ("agree", "missed_oom", "false_oom")}
    doc = {"schema_version": SCHEMA_VERSION, "kind": kind, "device": args.device, "machine": machine,
           "command": " ".join(["python3", f"bench/cuda_{kind}.py", *argv]),
           "warmup_steps": args.warmup, "timed_steps": args.steps,
           "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": summary, "rows": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"cuda_{kind}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / f"cuda_{kind}.md").write_text(markdown(kind, doc) + "\n")
    return doc


def _mib(v) -> str:
    return "" if v is None else f"{v / 2**20:.1f}"


def _pct(v) -> str:
    return "" if v is None else f"{v:+.1f}"


def markdown(kind: str, doc: dict) -> str:
    m = doc["machine"]
    lines = [f"# {'Memory' if kind == 'memory' else 'Step time'}: trainfit's prediction vs real training steps "
             f"({doc['device']})", "",
             f"Command: `{doc['command']}`  ",
             f"Machine: {m.get('gpu') or 'CPU'}; driver {m.get('driver', '-')} (CUDA {m.get('driver_cuda', '-')}); "
             f"torch {m.get('torch')}; transformers {m.get('transformers')}; peft {m.get('peft')}; "
             f"bitsandbytes {m.get('bitsandbytes')}; deepspeed {m.get('deepspeed')}. Predicted for `--hardware "
             f"{m.get('hardware_spec')}`.  ",
             f"{doc['warmup_steps']} warm-up + {doc['timed_steps']} timed steps per row, each row in a fresh process. "
             "Error = (predicted - measured) / measured; negative = under-predicted (the OOM direction). "
             "MiB = 2^20 bytes, as nvidia-smi shows.", "", "Summary: `" + json.dumps(doc["summary"]) + "`", ""]
    if kind == "memory":
        lines += ["| config | status | allocated MiB | pred. tensor peak MiB | err % | reserved MiB | pred. reserved "
                  "MiB | err % | NVML MiB | pred. device MiB | err % | verdict |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in doc["rows"]:
            ms, p, e = r["measured"], r["predicted"], r["errors"]
            nvml = ms.get("nvml_process_used_bytes") or ms.get("nvml_device_used_delta_bytes")
            lines.append(
                f"| {r['config']} | {ms['status']}{' (' + ms['reason'] + ')' if ms.get('reason') else ''} | "
                f"{_mib(ms.get('max_memory_allocated_bytes'))} | {_mib(p.get('tensor_peak_bytes'))} | "
                f"{_pct(e['tensor_peak_vs_allocated_pct'])} | {_mib(ms.get('max_memory_reserved_bytes'))} | "
                f"{_mib(p.get('reserved_peak_bytes') or p.get('total_bytes'))} | "
                f"{_pct(e['reserved_vs_reserved_pct'])} | "
                f"{_mib(nvml)} | {_mib(p.get('device_total_bytes') or p.get('total_bytes'))} | "
                f"{_pct(e['device_total_vs_nvml_pct'])} | {r.get('oom_verdict') or ''} |")
        least_rows = [r for r in doc["rows"] if r.get("least_capacity")]
        if least_rows:
            lines += ["", "Least capacity: the smallest allocator cap (torch.cuda.set_per_process_memory_fraction; "
                      "live tensor bytes in CPU mode) the steps completed in, bisected between a cap that failed "
                      "and one that passed; predicted = the pool the fit verdict needs (needed bytes less the "
                      "CUDA context and NCCL buffers).", "",
                      "| config | allocated MiB | reserved MiB | least capacity MiB | bracket MiB | retries there | "
                      "predicted MiB | err % |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
            for r in least_rows:
                ms, lc = r["measured"], r["least_capacity"]
                at = [p["num_alloc_retries"] for p in lc["probes"] if p["cap_bytes"] == lc["least_capacity_bytes"]]
                lines.append(f"| {r['config']} | {_mib(ms.get('max_memory_allocated_bytes'))} | "
                             f"{_mib(ms.get('max_memory_reserved_bytes'))} | {_mib(lc['least_capacity_bytes'])} | "
                             f"{_mib(lc['resolution_bytes'])} | {'' if not at or at[0] is None else at[0]} | "
                             f"{_mib(r['predicted'].get('least_pool_bytes'))} | "
                             f"{_pct(r['errors'].get('least_pool_vs_least_capacity_pct'))} |")
    else:
        lines += ["| config | status | measured ms | predicted ms | err % |", "|---|---|---:|---:|---:|"]
        for r in doc["rows"]:
            ms, p = r["measured"], r["predicted"]
            meas = ms.get("step_seconds")
            pred = p.get("step_seconds")
            lines.append(f"| {r['config']} | {ms['status']}{' (' + ms['reason'] + ')' if ms.get('reason') else ''} | "
                         f"{'' if meas is None else f'{meas * 1e3:.1f}'} | "
                         f"{'' if pred is None else f'{pred * 1e3:.1f}'} | "
                         f"{_pct(r['errors']['step_seconds_pct'])} |")
    return "\n".join(lines)


def build_arg_parser(kind: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=f"trainfit {kind} prediction vs real training steps (see bench/README.md)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="cuda: the grid on GPU 0 (exit 4 without one); cpu: tiny models, live-tensor counter (the "
                         "test suite's mode); auto (default): cuda when torch sees a GPU, else cpu, so `make bench` "
                         "on a machine without one checks the harness and calibrates nothing")
    ap.add_argument("--quick", action="store_true", help="a few rows only")
    ap.add_argument("--only", help="rows whose name contains this text")
    ap.add_argument("--warmup", type=int, default=2 if kind == "memory" else 3,
                    help="untimed steps first (memory peaks count them: the first optimizer step allocates)")
    ap.add_argument("--steps", type=int, default=3 if kind == "memory" else 10, help="timed steps (median)")
    ap.add_argument("--hardware", help="predict for this trainfit --hardware spec (default: the detected GPU)")
    ap.add_argument("--out-dir", help="where cuda_<kind>.{json,md} go (default: bench/results for --device cuda; a "
                                      "temporary folder for --device cpu: tiny-model figures calibrate nothing)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in the JSON, run the others")
    ap.add_argument("--inject-oom", action="append", default=[], metavar="NAME",
                    help="make this row raise torch.OutOfMemoryError (checks the OOM path)")
    ap.add_argument("--repredict", action="store_true",
                    help="no device run: predict the rows stored in the JSON again with this trainfit (after a "
                         "constant changed) and rewrite the errors")
    ap.add_argument("--workdir", help="scratch folder (QLoRA random inits); default: a temporary one")
    if kind == "memory":
        ap.add_argument("--least-capacity", action="store_true",
                        help="also find, for each row that fits, the least allocator cap its steps complete in "
                             "(bisection between its allocated and reserved peaks, one capped run per probe) "
                             "against the fit verdict's figure; pick rows with --only or --quick")
        ap.add_argument("--probes", type=int, default=5,
                        help="capped runs per row for --least-capacity (each halves the bracket; default 5)")
    return ap


def repredict(kind: str, args, argv: list[str]) -> int:
    """Stored measurements, fresh predictions: how a change to the CUDA constants is checked offline."""
    path = Path(args.out_dir) / f"cuda_{kind}.json"
    if not path.is_file():
        print(f"--repredict: no {path} to read (run the harness first)", file=sys.stderr)
        return 2
    prev = json.loads(path.read_text())
    args.device, args.warmup, args.steps = prev["device"], prev["warmup_steps"], prev["timed_steps"]
    hardware_spec = args.hardware or prev["machine"]["hardware_spec"]
    rows = []
    for row in prev["rows"]:
        case = _case_from_json(json.dumps({"name": row["config"], "model": row["model"], "layers": row["layers"],
                                           "vocab": row.get("vocab"), "engine": row["engine"],
                                           "setup": row["setup"]}))
        predicted = predict(case, args.device, hardware_spec)
        rows.append({**row, "predicted": predicted, **compare(predicted, row["measured"], row.get("least_capacity"))})
    doc = write_results(kind, rows, {**prev["machine"], "hardware_spec": hardware_spec}, args, Path(args.out_dir),
                        prev["command"].split()[2:] + ["# re-predicted:", *argv])
    print(json.dumps(doc["summary"]))
    return 0


def main(kind: str, argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_arg_parser(kind).parse_args(argv)
    if args.device in ("auto", "cuda") and not args.repredict:
        try:
            import torch

            has_cuda = torch.cuda.is_available()  # counts devices only: the parent holds no CUDA context
        except ImportError:
            print("torch is not installed: pip install 'trainfit[train]'", file=sys.stderr)
            return 4
        if args.device == "cuda" and not has_cuda:
            print("no CUDA device visible to torch: use --device cpu for the harness's CPU mode", file=sys.stderr)
            return 4
        if args.device == "auto":
            args.device = "cuda" if has_cuda else "cpu"
            if not has_cuda:
                print("no CUDA device: running the harness's CPU mode (tiny models, results in a temporary folder)")
    if args.out_dir is None:
        args.out_dir = str(RESULTS) if args.device == "cuda" or args.repredict else tempfile.mkdtemp(
            prefix="trainfit-cuda-harness-cpu-")
    if args.repredict:
        return repredict(kind, args, argv)
    cases = grid(args.device, args.quick, args.only)
    unknown = sorted(set(args.inject_oom) - {c.name for c in cases})
    if unknown:
        print(f"--inject-oom {unknown[0]!r}: no such row in this run (rows: {', '.join(c.name for c in cases)})",
              file=sys.stderr)
        return 2
    cases = [dataclasses.replace(c, inject_oom=True) if c.name in args.inject_oom else c for c in cases]
    if not cases:
        print(f"--only {args.only!r}: no row matches", file=sys.stderr)
        return 2
    if kind == "speed":  # rows meant to run out of memory time nothing
        cases = [c for c in cases if not c.memory_only]
    if args.hardware:
        from trainfit.core.machines.hardware_spec import resolve_hardware
        from trainfit.errors import BadInputError

        try:
            resolve_hardware(args.hardware)
        except BadInputError as exc:  # before any row runs, not after the first one
            print(exc, file=sys.stderr)
            return 2
    hardware_spec, machine = detect_hardware(args.device)
    hardware_spec = args.hardware or hardware_spec
    machine["hardware_spec"] = hardware_spec
    out_dir = Path(args.out_dir)
    done: dict[str, dict] = {}
    prev_path = out_dir / f"cuda_{kind}.json"
    if args.resume and prev_path.is_file():
        done = {r["config"]: r for r in json.loads(prev_path.read_text())["rows"]}
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="trainfit-cuda-harness-"))
    workdir.mkdir(parents=True, exist_ok=True)
    # --resume with --only / --quick: the rows measured before and not selected now stay in the file
    selected = {c.name for c in cases}
    kept = [r for name, r in done.items() if name not in selected]
    rows: list[dict] = []
    least_wanted = kind == "memory" and args.least_capacity
    try:
        for case in cases:
            prev = done.get(case.name)
            if prev is not None and prev["measured"]["status"] not in ("crashed", "timeout") and not (
                    least_wanted and prev["measured"]["status"] == "ok" and "least_capacity" not in prev):
                rows.append(prev)
                continue
            # a resumed row that still lacks its least capacity keeps its uncapped measurement
            measured = prev["measured"] if prev is not None and prev["measured"]["status"] == "ok" else \
                run_case_subprocess(case, args.device, args.warmup, args.steps, workdir)
            least = measure_least_capacity(case, args.device, args.warmup, workdir, measured, args.probes) \
                if least_wanted and measured["status"] == "ok" else None
            predicted = predict(case, args.device, hardware_spec)
            row = {"config": case.name, "model": case.model, "layers": case.layers, "vocab": case.vocab,
                   "engine": case.engine, "setup": dataclasses.asdict(case.setup), "measured": measured, "predicted": predicted,
                   **({"least_capacity": least} if least is not None else {}),
                   **compare(predicted, measured, least)}
            rows.append(row)
            e = row["errors"]
            print(f"{case.name:48s} {measured['status']:8s} alloc err {_pct(e['tensor_peak_vs_allocated_pct']):>7s} % "
                  f"step err {_pct(e['step_seconds_pct']):>7s} % {row['oom_verdict'] or ''}", flush=True)
            write_results(kind, rows + kept, machine, args, out_dir, argv)  # after every row: a cut-off run keeps it
    except KeyboardInterrupt:  # a time limit (bench/gpu_session.sh) or ^C: what was measured is written
        print(f"interrupted after {len(rows)} rows of this run: {out_dir / f'cuda_{kind}.json'} holds them; "
              "the same command with --resume goes on", file=sys.stderr)
        return 130
    doc = write_results(kind, rows + kept, machine, args, out_dir, argv)
    print(json.dumps(doc["summary"]))
    print(f"wrote {out_dir / f'cuda_{kind}.json'} and .md")
    return 0


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--result-file", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--cap-bytes", type=int)
    args = ap.parse_args(argv)
    result = run_worker(_case_from_json(args.worker), args.device, args.warmup, args.steps, Path(args.workdir),
                        cap_bytes=args.cap_bytes)
    Path(args.result_file).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        raise SystemExit(worker_main(sys.argv[1:]))
    raise SystemExit(main("memory"))
