"""Automatic recovery in `trainfit train`: OOM (every backend's real message), memory pressure,
non-finite losses, device failure, two gloo ranks. The run goes on with the same optimizer steps,
global batch and data order as a clean run; its losses stay within 1e-5 relative of the clean
run's on CPU fp32 (measured: at most ~3e-7; only the summation order of the split micro-batches
differs, bench/results/oom_recovery.md)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from trainfit.cli.main import main
from trainfit.config.run_config import load_run_config
from trainfit.errors import BadInputError
from trainfit.train.predictions import hardware_profile
from trainfit.train.recovery import faults
from trainfit.train.recovery.oom import classify
from trainfit.train.recovery.precision import PrecisionPolicy, next_precision
from trainfit.train.recovery.session import request_shrink
from trainfit.train.recovery.split import Split, shrink, split_for_world
from trainfit.train.run_dir import legacy_config_hash
from trainfit.train.runner import run_training

from .conftest import loss_trajectory, make_config, run_torchrun

REL_TOL = 1e-5

# One real message per backend, as published in tracebacks (numbers as reported there).
REAL_OOM = {
    "cuda": (torch.OutOfMemoryError,
             "CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 "
             "MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated "
             "memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If "
             "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
             "to avoid fragmentation.  See documentation for Memory Management  "
             "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"),
    "cuda-legacy": (RuntimeError, "CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; 14.76 GiB total capacity; "
                                  "8.77 GiB already allocated; 19.75 MiB free; 13.71 GiB reserved in total by PyTorch)"),
    "cuda-driver": (RuntimeError, "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
                                  "some other API call, so the stacktrace below might be incorrect."),
    "cublas": (RuntimeError, "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    "hip": (torch.OutOfMemoryError,
            "HIP out of memory. Tried to allocate 80.00 MiB. GPU 0 has a total capacity of 15.98 GiB of which 84.00 "
            "MiB is free. Of the allocated memory 15.44 GiB is allocated by PyTorch, and 267.59 MiB is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"),
    "mps": (RuntimeError,
            "MPS backend out of memory (MPS allocated: 12.74 GB, other allocations: 4.39 GB, max allowed: 18.13 GB). "
            "Tried to allocate 1.02 GB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper "
            "limit for memory allocations (may cause system failure)."),
    "xpu": (torch.OutOfMemoryError,
            "XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a total capacity of 5.65 GiB of which 5.65 GiB "
            "is free. Of the allocated memory 195.50 KiB is allocated by PyTorch, and 1.81 MiB is reserved by "
            "PyTorch but unallocated. Please use `empty_cache` to release all unoccupied cached memory."),
    "xpu-ipex": (RuntimeError, "XPU out of memory. Tried to allocate 1.71 GiB (GPU 0; 15.56 GiB total capacity; "
                               "176.00 MiB already allocated; 176.00 MiB reserved in total by PyTorch)"),
    "xpu-ur": (RuntimeError, "level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)"),
    "cpu": (RuntimeError, "[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: "
                          "you tried to allocate 1073741824000 bytes. Error code 12 (Cannot allocate memory)"),
    "cpu-windows": (RuntimeError, "[enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. DefaultCPUAllocator: "
                                  "not enough memory: you tried to allocate 4294967296 bytes."),
    "cpu-python": (MemoryError, ""),
}
REAL_DEVICE_FAILURE = {
    "ecc": ("CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously reported at "
            "some other API call, so the stacktrace below might be incorrect.", "ecc"),
    "illegal-access": ("CUDA error: an illegal memory access was encountered\nCompile with `TORCH_USE_CUDA_DSA` to "
                       "enable device-side assertions.", "poisoned"),
    "launch-failure": ("CUDA error: unspecified launch failure", "poisoned"),
    "device-assert": ("CUDA error: device-side assert triggered", "poisoned"),
    "nvml-lost": ("NVMLError_GpuIsLost: GPU is lost", "lost"),
    "xpu-lost": ("Native API failed. Native API returns: 20 (UR_RESULT_ERROR_DEVICE_LOST)", "lost"),
}


@pytest.mark.parametrize("name", sorted(REAL_OOM))
def test_every_backends_oom_is_recognised(name):
    cls, message = REAL_OOM[name]
    failure = classify(cls(message) if message else cls())
    assert failure is not None and failure.kind == "oom", name
    expected = {"cuda-legacy": "cuda", "cuda-driver": "cuda", "cublas": "cuda", "xpu-ipex": "xpu", "xpu-ur": "xpu",
                "cpu-windows": "cpu", "cpu-python": "cpu"}.get(name, name)
    assert failure.backend == expected


def test_a_real_cpu_allocation_failure_is_recognised():
    with pytest.raises(RuntimeError) as err:
        torch.empty(10**15, dtype=torch.uint8)  # 1 PB: this machine's allocator refuses
    assert classify(err.value).kind == "oom" and classify(err.value).backend == "cpu"


@pytest.mark.parametrize("name", sorted(REAL_DEVICE_FAILURE))
def test_device_failures_are_not_out_of_memory(name):
    message, variant = REAL_DEVICE_FAILURE[name]
    failure = classify(getattr(torch, "AcceleratorError", RuntimeError)(message))
    assert failure.kind == "device_lost" and failure.backend == variant


def test_what_is_not_recovered_from():
    assert classify(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x64 and 32x64)")) is None
    assert classify(ValueError("loss scale")) is None
    assert classify(KeyboardInterrupt()) is None
    assert classify(BadInputError("training.micro_batch: out of memory is not a number")) is None
    assert classify(RuntimeError("Function 'MmBackward0' returned nan values in its 0th output.")).kind == "nonfinite"
    try:  # a wrapper around a real OOM still counts
        try:
            raise torch.OutOfMemoryError(REAL_OOM["cuda"][1])
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        assert classify(outer).kind == "oom"


def test_fault_specs():
    plan = faults.parse("oom@5:hip,nan@7-9,device_lost@11:ecc,oom@2/2*3,rank=1")
    assert [(f.kind, f.step, f.variant, f.micro, f.times) for f in plan.faults] == [
        ("oom", 5, "hip", 1, 1), ("nan", 7, "", 1, 1), ("nan", 8, "", 1, 1), ("nan", 9, "", 1, 1),
        ("device_lost", 11, "ecc", 1, 1), ("oom", 2, "cuda", 2, 3)]
    assert plan.rank == 1 and plan.applies(1) and not plan.applies(0)
    plan.faults[0].fired = 1
    plan.faults[-1].fired = 1
    assert plan.remaining_spec() == "nan@7,nan@8,nan@9,device_lost@11:ecc,oom@2/2:cuda*2,rank=1"
    stall = faults.parse("stall@6,rank=1")
    assert [(f.kind, f.step) for f in stall.faults] == [("stall", 6)] and stall.applies(1) and not stall.applies(0)
    for bad in ("oom@x", "oom@5:tpu", "melt@3", "nan@7:cuda", "oom@0", "rank=one", "nan@9-7", "stall@6:long"):
        with pytest.raises(BadInputError, match="TRAINFIT_FAULTS"):
            faults.parse(bad)
    for backend in faults.OOM_MESSAGES:  # what is injected is recognised as what it imitates
        f = classify(faults.oom_exception(backend))
        assert f.kind == "oom" and f.backend == backend.split("-")[0], backend
    assert faults.from_env({faults.ENV: "oom@3", "TORCHELASTIC_RESTART_COUNT": "1"}) is None


def test_the_pure_rules():
    assert shrink(Split(4, 1)) == Split(2, 2)
    assert shrink(Split(6, 1)) == Split(3, 2)
    assert shrink(Split(3, 2)) == Split(1, 6)
    assert shrink(Split(1, 8)) == Split(1, 8, "full")
    assert shrink(Split(1, 8, "full")) is None
    assert split_for_world(8, 2, 4) == Split(4, 1) and split_for_world(8, 1, 4) == Split(4, 2)
    assert split_for_world(12, 2, 4) == Split(3, 2) and split_for_world(8, 3, 4) is None
    assert next_precision("fp16-mixed", ("fp32", "bf16-mixed", "fp16-mixed")) == "bf16-mixed"
    assert next_precision("fp16-mixed", ("fp32", "fp16-mixed", "fp16")) == "fp32"  # no bf16 (e.g. a V100)
    assert next_precision("fp16", None) == "bf16" and next_precision("bf16-mixed") == "fp32"
    assert next_precision("fp32") is None
    policy = PrecisionPolicy(streak=3)
    assert [policy.observe(s, bad) for s, bad in ((1, False), (2, True), (3, True), (4, False), (5, True),
                                                  (6, True), (7, True))] == [
        "ok", "skip", "skip", "ok", "skip", "skip", "fallback"]
    assert policy.first_bad_step == 5
    assert policy.scale_collapsed(0.5) and not policy.scale_collapsed(1024.0) and not policy.scale_collapsed(None)


def test_config_hash_counts_the_global_batch_not_its_split(tmp_path):
    def cfg(name, **training):
        return load_run_config(make_config(tmp_path, name=name, training=training))

    base = cfg("a.yaml", micro_batch=4, grad_accum=1)
    same = [cfg("b.yaml", micro_batch=2, grad_accum=2), cfg("c.yaml", micro_batch=1, grad_accum=4),
            cfg("d.yaml", micro_batch=1, grad_accum=4, grad_checkpointing="full")]
    assert all(c.config_hash() == base.config_hash() for c in same)
    assert cfg("e.yaml", micro_batch=2, grad_accum=1).config_hash() != base.config_hash()
    assert cfg("f.yaml", micro_batch=2, grad_accum=1).config_hash(processes=2) == base.config_hash(processes=1)
    assert base.config_hash(processes=2) != base.config_hash(processes=1)


# -- end to end -------------------------------------------------------------------------------
class _Shrink(TrainerCallback):
    """A memory-pressure signal from another thread (as the monitor sends it) after step `at`."""

    def __init__(self, at: int):
        self.at, self.sent = at, False

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.at and not self.sent:
            self.sent = True
            t = threading.Thread(target=request_shrink, args=("memory headroom under the margin (test)",))
            t.start()
            t.join()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A clean 12-step run: micro-batch 4 x accumulation 1, checkpoints every 4 steps."""
    tmp = tmp_path_factory.mktemp("clean")
    config = make_config(tmp, "pretrain")
    log = faults.SampleLog()
    result = run_training(load_run_config(config), tmp / "run", quiet=True, extra_callbacks=[log])
    return config, result, log.steps


def _events(run_dir: Path, kind: str) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r.get("event") == kind]


def _same_run(clean, run_dir: Path, sample_steps: dict, result) -> None:
    _, ref, ref_samples = clean
    assert result.global_step == ref.global_step == 12
    assert result.summary["global_batch"] == ref.summary["global_batch"] == 4
    assert sample_steps == ref_samples  # every step trained on the same samples
    got, want = loss_trajectory(run_dir), dict(ref.losses)
    assert sorted(got) == sorted(want)
    for step, loss in want.items():
        assert abs(got[step] - loss) <= REL_TOL * abs(loss), (step, got[step], loss)


def test_oom_mid_run_continues_the_same_run_and_resumes(clean, tmp_path, monkeypatch):
    config = clean[0]
    monkeypatch.setenv(faults.ENV, "oom@6:cuda")
    log = faults.SampleLog()
    messages: list[str] = []
    run_dir = tmp_path / "run"
    part = run_training(load_run_config(config), run_dir, quiet=True, stop_after=9, extra_callbacks=[log],
                        log=messages.append)
    assert part.global_step == 9
    assert any("out of memory in step 6 (cuda)" in m for m in messages)
    adj = json.loads((run_dir / "adjustments.json").read_text())
    assert adj["training"] == {"micro_batch": 2, "grad_accum": 2, "grad_checkpointing": "none"}
    assert adj["global_batch"] == 4 and adj["history"][0]["continued_from"] == "checkpoint-5"
    (event,) = _events(run_dir, "oom_recovered")
    assert event["step"] == 5 and event["backend"] == "cuda" and event["to"]["micro_batch"] == 2
    assert any("continuing from checkpoint-5" in m for m in messages)  # written when the OOM hit step 6
    # --resume (the CLI) reads adjustments.json: the split stays micro-batch 2 x accumulation 2
    monkeypatch.delenv(faults.ENV)
    resumed = run_training(load_run_config(config), run_dir, resume=True, quiet=True, extra_callbacks=[log])
    assert resumed.summary["training"]["micro_batch"] == 2 and resumed.summary["training"]["grad_accum"] == 2
    assert resumed.summary["recoveries"][0]["kind"] == "oom_recovered"
    _same_run(clean, run_dir, log.steps, resumed)


@pytest.mark.slow
def test_oom_in_step_one_and_in_a_second_micro_batch(clean, tmp_path, monkeypatch):
    """Step 1 has no checkpoint to return to (the run starts again); at step 10 the OOM hits the
    second micro-batch, after the first one's gradients were accumulated (they are dropped)."""
    config = clean[0]
    monkeypatch.setenv(faults.ENV, "oom@1:mps,oom@10/2:xpu-ur")
    log = faults.SampleLog()
    result = run_training(load_run_config(config), tmp_path / "run", quiet=True, extra_callbacks=[log])
    assert [e["backend"] for e in _events(tmp_path / "run", "oom_recovered")] == ["mps", "xpu"]
    assert result.summary["training"]["micro_batch"] == 1 and result.summary["training"]["grad_accum"] == 4
    _same_run(clean, tmp_path / "run", log.steps, result)


class _OomAfterUpdate(TrainerCallback):
    """An OOM right after the optimizer update of step `at` (the state may be half updated)."""

    def __init__(self, at: int):
        self.at, self.done = at, False

    def on_optimizer_step(self, args, state, control, **kw):
        if state.global_step + 1 == self.at and not self.done:
            self.done = True
            raise torch.OutOfMemoryError(REAL_OOM["cuda"][1])


@pytest.mark.slow
def test_oom_inside_the_update_replays_from_the_last_checkpoint(clean, tmp_path):
    log = faults.SampleLog()
    result = run_training(load_run_config(clean[0]), tmp_path / "run", quiet=True,
                          extra_callbacks=[log, _OomAfterUpdate(7)])
    (event,) = _events(tmp_path / "run", "oom_recovered")
    assert event["replayed"] is True and event["continued_from"] == "checkpoint-4"
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line and '"event"' not in line]
    assert steps == list(range(1, 13))  # steps 5 and 6 were trained again and logged once
    _same_run(clean, tmp_path / "run", log.steps, result)


def test_memory_pressure_shrinks_at_the_next_boundary(clean, tmp_path):
    log = faults.SampleLog()
    result = run_training(load_run_config(clean[0]), tmp_path / "run", quiet=True, extra_callbacks=[log, _Shrink(3)])
    (event,) = _events(tmp_path / "run", "memory_pressure")
    assert "headroom" in event["reason"] and event["to"]["micro_batch"] == 2
    assert request_shrink("after the run") is False  # no training in this process any more
    _same_run(clean, tmp_path / "run", log.steps, result)


def test_out_of_memory_at_micro_batch_one_checkpoints_then_exit_3(tmp_path, monkeypatch, capfd):
    """micro-batch 1: gradient checkpointing goes on; OOM again with it: 16-bit autocast; OOM
    again: exit 3, progress kept."""
    config = make_config(tmp_path, "pretrain", training={"micro_batch": 1, "grad_accum": 2},
                         schedule={"max_steps": 6})
    monkeypatch.setenv(faults.ENV, "oom@4:cuda*3")
    code = main(["train", str(config), "--out", str(tmp_path / "run"), "--quiet"])
    err = capfd.readouterr().err
    assert code == 3 and "micro-batch 1 with gradient checkpointing is the smallest step" in err
    assert "Traceback" not in err
    adj = json.loads((tmp_path / "run" / "adjustments.json").read_text())
    assert adj["training"]["grad_checkpointing"] == "full" and adj["training"]["micro_batch"] == 1
    assert adj["training"]["precision"] == "bf16-mixed"
    assert (tmp_path / "run" / "checkpoints" / "checkpoint-3").is_dir()  # kept for a --resume elsewhere


def test_nonfinite_streak_falls_back_to_fp32(tmp_path, monkeypatch):
    """bf16-mixed on CPU: three NaN losses in a row (steps 6-8) -> fp32 from step 5, the last good
    one; the streak's updates are skipped, its steps trained again in fp32."""
    config = make_config(tmp_path, "pretrain", training={"precision": "bf16-mixed"})
    monkeypatch.setenv(faults.ENV, "nan@6-8")
    run_dir = tmp_path / "run"
    result = run_training(load_run_config(config), run_dir, quiet=True)
    assert result.global_step == 12 and result.summary["training"]["precision"] == "fp32"
    assert [e["step"] for e in _events(run_dir, "nonfinite_loss")] == [6, 7, 8]
    (fallback,) = _events(run_dir, "precision_fallback")
    assert fallback["step"] == 5 and fallback["from"]["precision"] == "bf16-mixed" and fallback["to"]["precision"] == "fp32"
    assert json.loads((run_dir / "adjustments.json").read_text())["training"]["precision"] == "fp32"
    losses = loss_trajectory(run_dir)
    assert sorted(losses) == list(range(1, 13)) and all(v == v and abs(v) < 20 for v in losses.values())
    assert result.losses[-1][1] < result.losses[0][1]  # it went on learning


def test_single_nonfinite_step_is_skipped_not_a_fallback(tmp_path, monkeypatch):
    config = make_config(tmp_path, "pretrain", schedule={"max_steps": 6})
    monkeypatch.setenv(faults.ENV, "nan@3")
    result = run_training(load_run_config(config), tmp_path / "run", quiet=True)
    assert result.summary["training"]["precision"] == "fp32" and not _events(tmp_path / "run", "precision_fallback")
    assert len(_events(tmp_path / "run", "nonfinite_loss")) == 1
    assert all(v == v for _, v in result.losses[3:])  # the weights were not poisoned by the NaN step


@pytest.mark.slow
def test_device_failure_continues_in_a_fresh_process_on_cpu(clean, tmp_path, monkeypatch, capfd):
    """An ECC error in step 7: no state is saved from memory; a fresh process continues from
    checkpoint-4 on the CPU (CUDA_VISIBLE_DEVICES empty) and finishes the same run."""
    monkeypatch.setenv(faults.ENV, "device_lost@7:ecc")
    run_dir = tmp_path / "run"
    code = main(["train", str(clean[0]), "--out", str(run_dir), "--quiet", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["global_step"] == 12 and summary["device"] == "cpu" and summary["resumed_from"] == "checkpoint-4"
    assert "continuing in a fresh process (CUDA_VISIBLE_DEVICES=''" in err
    (lost,) = _events(run_dir, "device_lost")
    assert lost["step"] == 6 and lost["backend"] == "ecc" and lost["continued_from"] == "checkpoint-4"
    assert _events(run_dir, "device_replan")
    # resume is exact: the run is the clean run, loss for loss
    assert loss_trajectory(run_dir) == dict(clean[1].losses)


def test_legacy_hash_still_resumes(clean, tmp_path):
    cfg = load_run_config(clean[0])
    run_dir = tmp_path / "run"
    run_training(cfg, run_dir, quiet=True, stop_after=4)
    (run_dir / "config.sha256").write_text(legacy_config_hash(cfg.for_device("cpu", hardware_profile())) + "\n")
    result = run_training(cfg, run_dir, resume=True, quiet=True, stop_after=5)
    assert result.global_step == 5
    assert (run_dir / "config.sha256").read_text().strip() == cfg.config_hash(1)  # rewritten


@pytest.mark.slow
def test_two_gloo_ranks_shrink_together_after_an_oom_on_rank_1(tmp_path):
    """OOM on rank 1 in step 3: rank 1 records the request and exits; torchrun (--max-restarts 1)
    restarts both ranks, which continue from checkpoint-2 with micro-batch 1 x accumulation 2 and
    end where one process with the same global batch ends."""
    two = make_config(tmp_path, "pretrain", name="two.yaml", training={"micro_batch": 2, "grad_accum": 1},
                      schedule={"max_steps": 5}, checkpointing={"every_steps": 2})
    one = make_config(tmp_path, "pretrain", name="one.yaml", training={"micro_batch": 2, "grad_accum": 2},
                      schedule={"max_steps": 5}, checkpointing={"every_steps": 2})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           faults.ENV: "oom@3:cuda,rank=1"}
    run_dir = tmp_path / "ddp"
    returncode, stdout, stderr = run_torchrun(
        ["--max-restarts", "1", "-m", "trainfit", "train", str(two), "--out", str(run_dir), "--quiet", "--json"], env)
    assert returncode == 0, stderr[-4000:]
    summary = json.loads(stdout)
    assert summary["processes"] == 2 and summary["global_batch"] == 4 and summary["global_step"] == 5
    assert summary["training"]["micro_batch"] == 1 and summary["training"]["grad_accum"] == 2
    for rank in (0, 1):  # both ranks shrank
        assert f"recovery: rank {rank} trains with micro-batch 1 x accumulation 2" in stderr
    (event,) = _events(run_dir, "oom_recovered")
    assert event["rank"] == 1 and event["step"] == 2
    # the restarted ranks' config in force changed with the request, recorded with its reason
    (change,) = [c for c in _events(run_dir, "config_change") if c["source"] == "restart_requests"]
    assert event["reason"] in change["reason"]
    assert change["changes"] == {"training.micro_batch": {"from": 2, "to": 1}, "training.grad_accum": {"from": 1, "to": 2}}
    assert not (run_dir / ".recovery").exists()  # the request was folded into adjustments.json
    single = run_training(load_run_config(one), tmp_path / "single", quiet=True)
    got = loss_trajectory(run_dir)
    assert sorted(got) == [1, 2, 3, 4, 5]
    for step, loss in single.losses:
        assert abs(got[step] - loss) <= REL_TOL * abs(loss), (step, got, single.losses)
