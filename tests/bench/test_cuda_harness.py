"""The GPU measurement harness (bench/cuda_memory.py, bench/cuda_speed.py) in its CPU mode: tiny
models, the live-tensor counter in place of torch.cuda statistics, each row in its own process."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

import _cuda_harness as harness

OOM_ROW = "gpt2 full fp32 ckpt b2 s64"


def _run(kind: str, out_dir: Path, *args: str) -> int:
    """The entry point's main in this process (each row still runs in its own worker process)."""
    return harness.main(kind, ["--device", "cpu", "--out-dir", str(out_dir), "--workdir", str(out_dir / "work"), *args])


@pytest.fixture(scope="module")
def memory_doc(tmp_path_factory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("cuda-memory")
    assert _run("memory", out, "--quick", "--warmup", "1", "--steps", "1", "--inject-oom", OOM_ROW) == 0
    return json.loads((out / "cuda_memory.json").read_text()), (out / "cuda_memory.md").read_text(), out


def test_memory_rows_have_prediction_measurement_and_signed_error(memory_doc):
    doc, md, _ = memory_doc
    assert doc["command"].startswith("python3 bench/cuda_memory.py --device cpu")
    assert doc["schema_version"] == harness.SCHEMA_VERSION and doc["kind"] == "memory" and doc["device"] == "cpu"
    assert {"torch", "transformers", "peft", "hardware_spec"} <= set(doc["machine"])
    assert [r["config"] for r in doc["rows"]] == list(harness.QUICK["cpu"])
    ok = [r for r in doc["rows"] if r["measured"]["status"] == "ok"]
    assert len(ok) == 2
    for r in ok:
        measured = r["measured"]["max_memory_allocated_bytes"]
        predicted = r["predicted"]["tensor_peak_bytes"]
        # Weights, gradients and AdamW states at least: the counter saw the whole step.
        assert measured > r["measured"]["allocated_after_build_bytes"] > 0
        assert predicted > 0 and r["predicted"]["total_bytes"] >= predicted
        assert r["errors"]["tensor_peak_vs_allocated_pct"] == round((predicted - measured) / measured * 100, 2)
        assert r["measured"]["max_memory_reserved_bytes"] is None  # no caching allocator on CPU
        assert r["oom_verdict"] == "agree"
        assert f"| {r['config']} | ok |" in md
    summary = doc["summary"]["tensor_peak_vs_allocated_pct"]
    errs = [abs(r["errors"]["tensor_peak_vs_allocated_pct"]) for r in ok]
    assert summary["rows"] == 2 and summary["max_abs_pct"] == round(max(errs), 2)


def test_injected_oom_is_recorded_as_oom_and_as_a_missed_verdict(memory_doc):
    doc, md, _ = memory_doc
    row = next(r for r in doc["rows"] if r["config"] == OOM_ROW)
    assert row["measured"]["status"] == "oom" and "injected" in row["measured"]["error"]
    assert row["predicted"]["fits"] is True
    assert row["oom_verdict"] == "missed_oom"  # predicted to fit, ran out of memory
    assert all(v is None for v in row["errors"].values())
    assert doc["summary"]["statuses"] == {"ok": 2, "oom": 1}
    assert doc["summary"]["oom_verdicts"] == {"agree": 2, "missed_oom": 1, "false_oom": 0}
    assert f"| {OOM_ROW} | oom |" in md


def test_repredict_recomputes_errors_from_stored_measurements(memory_doc, monkeypatch):
    doc, _, out = memory_doc
    assert harness.main("memory", ["--repredict", "--out-dir", str(out)]) == 0
    again = json.loads((out / "cuda_memory.json").read_text())
    assert [r["measured"] for r in again["rows"]] == [r["measured"] for r in doc["rows"]]
    assert [r["errors"] for r in again["rows"]] == [r["errors"] for r in doc["rows"]]
    # A changed memory model shows up in the errors without a device run.
    from trainfit.core.memory import estimate as estimate_module

    real = estimate_module.estimate_memory

    def doubled(*a, **kw):
        est = real(*a, **kw)
        dev = est.devices[0]
        return dataclasses.replace(est, devices=[dataclasses.replace(dev, tensor_peak_bytes=2 * dev.tensor_peak_bytes)])

    monkeypatch.setattr("trainfit.core.memory.estimate_memory", doubled)
    assert harness.main("memory", ["--repredict", "--out-dir", str(out)]) == 0
    changed = json.loads((out / "cuda_memory.json").read_text())["rows"][0]
    measured = changed["measured"]["max_memory_allocated_bytes"]
    assert changed["predicted"]["tensor_peak_bytes"] == 2 * doc["rows"][0]["predicted"]["tensor_peak_bytes"]
    assert changed["errors"]["tensor_peak_vs_allocated_pct"] == round(
        (changed["predicted"]["tensor_peak_bytes"] - measured) / measured * 100, 2)


def test_speed_twin_times_steps_against_predict_step(tmp_path):
    assert _run("speed", tmp_path, "--only", "llama full", "--warmup", "1", "--steps", "2") == 0
    doc = json.loads((tmp_path / "cuda_speed.json").read_text())
    (row,) = doc["rows"]
    measured, predicted = row["measured"]["step_seconds"], row["predicted"]["step_seconds"]
    assert len(row["measured"]["step_seconds_all"]) == 2 and measured > 0 and predicted > 0
    assert row["errors"]["step_seconds_pct"] == round((predicted - measured) / measured * 100, 2)
    assert doc["summary"]["step_seconds_pct"]["rows"] == 1
    assert "| llama full fp32 b2 s64 | ok |" in (tmp_path / "cuda_speed.md").read_text()


def test_verdicts_and_errors_from_figures():
    pred = {"tensor_peak_bytes": 90, "total_bytes": 120, "fits": False, "step_seconds": 1.5}
    meas = {"status": "ok", "max_memory_allocated_bytes": 100, "max_memory_reserved_bytes": 110,
            "nvml_process_used_bytes": None, "nvml_device_used_delta_bytes": 150, "step_seconds": 1.0}
    out = harness.compare(pred, meas)
    assert out["errors"] == {"tensor_peak_vs_allocated_pct": -10.0, "reserved_vs_reserved_pct": 9.09,
                             "device_total_vs_nvml_pct": -20.0, "step_seconds_pct": 50.0,
                             "least_pool_vs_least_capacity_pct": None}
    assert out["oom_verdict"] == "false_oom"  # predicted not to fit, ran
    # A newer memory model's reserved / device figures are preferred over total_bytes.
    out = harness.compare({**pred, "reserved_peak_bytes": 110, "device_total_bytes": 150}, meas)
    assert out["errors"]["reserved_vs_reserved_pct"] == 0.0 and out["errors"]["device_total_vs_nvml_pct"] == 0.0
    assert harness.compare(pred, {"status": "skipped", "reason": "x"})["oom_verdict"] is None
    assert harness.compare({**pred, "fits": True}, {"status": "oom"})["oom_verdict"] == "missed_oom"
    least = {"least_capacity_bytes": 100}
    assert harness.compare({**pred, "least_pool_bytes": 95}, meas, least)["errors"][
        "least_pool_vs_least_capacity_pct"] == -5.0


def test_least_capacity_bisects_between_a_failing_and_a_passing_cap():
    mib = 2**20
    needs = 1000 * mib + 12345  # the steps complete at this cap or above, run out of memory below
    caps = []

    def runs_at(cap):
        caps.append(cap)
        return {"status": "ok" if cap >= needs else "oom", "num_alloc_retries": 3 if cap >= needs else None}

    out = harness.bisect_capacity(runs_at, 900 * mib, 1200 * mib, probes=6, align_bytes=2 * mib)
    assert out["failing_cap_bytes"] < needs <= out["least_capacity_bytes"]
    assert out["resolution_bytes"] == out["least_capacity_bytes"] - out["failing_cap_bytes"] <= 300 * mib / 2**5
    assert [p["cap_bytes"] for p in out["probes"]] == caps and all(c % (2 * mib) == 0 for c in caps)
    assert len(caps) <= 6
    # A probe that crashes ends the search with the bracket it had.
    out = harness.bisect_capacity(lambda cap: {"status": "crashed"}, 900 * mib, 1200 * mib, probes=6,
                                  align_bytes=2 * mib)
    assert (out["failing_cap_bytes"], out["least_capacity_bytes"]) == (900 * mib, 1200 * mib)
    assert [p["status"] for p in out["probes"]] == ["crashed"]
    # Nothing to bisect once the bracket is one alignment step wide.
    assert harness.bisect_capacity(runs_at, 1000 * mib, 1002 * mib, probes=6, align_bytes=2 * mib)["probes"] == []


def test_least_capacity_of_a_cpu_row_brackets_its_live_tensor_peak(memory_doc, tmp_path):
    row_name = "llama full fp32 b2 s64"
    # --resume on the quick rows measured already: the selected row keeps its measurement and gains its
    # least capacity (one capped probe), the rows not selected stay in the file.
    before, _, out = memory_doc
    (tmp_path / "cuda_memory.json").write_text((out / "cuda_memory.json").read_text())
    assert _run("memory", tmp_path, "--resume", "--only", row_name, "--warmup", "2", "--steps", "1",
                "--least-capacity", "--probes", "1") == 0
    doc = json.loads((tmp_path / "cuda_memory.json").read_text())
    assert sorted(r["config"] for r in doc["rows"]) == sorted(r["config"] for r in before["rows"])
    row = next(r for r in doc["rows"] if r["config"] == row_name)
    assert row["measured"] == next(r for r in before["rows"] if r["config"] == row_name)["measured"]
    peak, least = row["measured"]["max_memory_allocated_bytes"], row["least_capacity"]
    assert least["failing_cap_bytes"] < peak <= least["least_capacity_bytes"] <= peak * 5 // 4
    assert [p["status"] for p in least["probes"]] == ["ok"]  # the one probe, above the peak
    assert row["predicted"]["least_pool_bytes"] == row["predicted"]["tensor_peak_bytes"]
    assert row["errors"]["least_pool_vs_least_capacity_pct"] is not None
    assert doc["summary"]["least_pool_vs_least_capacity_pct"]["rows"] == 1
    assert f"| {row_name} | " in (tmp_path / "cuda_memory.md").read_text().split("Least capacity")[1]
    # Under the peak the capped counter raises torch.OutOfMemoryError, recorded as an OOM in the steps.
    case = next(c for c in harness.cpu_grid() if c.name == row_name)
    capped = harness.run_case_subprocess(case, "cpu", 2, 1, tmp_path, cap_bytes=peak * 9 // 10)
    assert capped["status"] == "oom" and capped["phase"] == "warm-up" and "cap" in capped["error"]


def test_cuda_grid_covers_the_issue_axes():
    cases = harness.grid("cuda")
    setups = [c.setup for c in cases]
    assert {"full", "lora", "qlora"} <= {s.method for s in setups}
    assert {"fp32", "bf16-mixed", "bf16", "fp16-mixed"} <= {s.precision for s in setups}
    assert {"none", "full"} <= {s.grad_checkpointing for s in setups}
    assert {"adamw", "sgd", "adamw-8bit"} <= {s.optimizer for s in setups}
    assert len({s.micro_batch for s in setups}) >= 3 and len({s.seq_len for s in setups}) >= 3
    assert {"deepspeed", "fsdp"} <= {c.engine for c in cases}
    archs = {harness.case_spec(c, "cuda").architecture for c in cases}
    assert {"llama", "qwen2", "gemma2", "phi", "gpt2", "mixtral"} <= archs
    assert len({c.name for c in cases}) == len(cases)
    assert [c.name for c in harness.grid("cuda", quick=True)] == list(harness.QUICK["cuda"])
    for case in cases:  # every row is one trainfit can predict (sized for an 80 GB GPU, or a deliberate OOM)
        pred = harness.predict(case, "cuda", "h100-sxm")
        assert "memory_error" not in pred and "speed_error" not in pred, (case.name, pred)


def test_cuda_mode_without_a_gpu_exits_4(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert harness.main("memory", ["--device", "cuda", "--out-dir", str(tmp_path), "--quick"]) == 4
    assert "--device cpu" in capsys.readouterr().err
    assert not (tmp_path / "cuda_memory.json").exists()


def test_entry_points_share_the_harness():
    for kind in ("memory", "speed"):
        proc = subprocess.run([sys.executable, str(BENCH / f"cuda_{kind}.py"), "--help"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and f"trainfit {kind} prediction" in proc.stdout and "--device" in proc.stdout


def test_a_failing_or_hung_worker_becomes_a_row(tmp_path):
    setup = harness.cpu_grid()[0].setup
    crashed = harness.run_case_subprocess(harness.Case("bad", "no-such-model-xyz", setup), "cpu", 1, 1, tmp_path)
    assert crashed["status"] == "crashed" and crashed["returncode"] not in (0, None)
    assert any("no-such-model-xyz" in line for line in crashed["stderr_tail"])
    hung = harness.run_case_subprocess(harness.cpu_grid()[0], "cpu", 1, 1, tmp_path, timeout_seconds=0.5)
    assert hung["status"] == "timeout"
    assert list(tmp_path.glob("cuda-harness-*.json")) == []  # no result files left behind


def test_fsdp_row_measures_rank_0_of_two_emulated_in_one_process(tmp_path):
    """FSDP2 full shard at world size 2 in one process (torch's fake process group): rank 0 holds half
    the parameters, and its live peak (DTensor shards and FSDP's storage resizes counted) is the
    model's per-GPU tensor peak."""
    assert _run("memory", tmp_path, "--only", "fsdp x2", "--warmup", "1", "--steps", "1") == 0
    row = json.loads((tmp_path / "cuda_memory.json").read_text())["rows"][0]
    assert row["config"] == "llama fsdp x2 full fp32 b2 s64" and row["measured"]["status"] == "ok"
    shards = row["predicted"]["components"]["weights"]  # fp32 parameters / 2
    assert shards <= row["measured"]["allocated_after_build_bytes"] < 1.05 * shards
    assert abs(row["errors"]["tensor_peak_vs_allocated_pct"]) < 3
    assert any("NCCL" in n for n in row["predicted"]["notes"])  # emulated ranks run no NCCL
