"""bench/fsdp_no_sync_cpu.py: the prediction side, the comparison and report, the counter's FSDP hooks
(fast, no processes); one end-to-end launch is marked slow."""

from __future__ import annotations

import json

import pytest

import fsdp_no_sync_cpu as bench

MIB = 2 ** 20


@pytest.fixture(scope="module")
def spec():
    return bench.tiny_spec()


@pytest.fixture(scope="module")
def predicted(spec):
    return bench.predict_pair(spec)


def test_spec_counts_the_parameters_transformers_builds(spec, predicted):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**bench.CONFIG))
    assert predicted["sync"]["params"] == sum(p.numel() for p in model.parameters()) == 5_261_568
    assert spec.architecture == "llama" and not spec.tie_embeddings


def test_setup_is_the_measured_run():
    s = bench.make_setup(True)
    assert (s.method, s.precision, s.optimizer, s.micro_batch, s.seq_len, s.grad_accum) == (
        "full", "fp32", "adamw", 1, 64, 4)
    assert (s.num_gpus, s.zero_stage, s.fsdp_strategy, s.fsdp_no_sync) == (2, 3, "full-shard", True)
    # estimate_memory refuses FSDP on "cpu"; the per-parameter AdamW is what foreach=False, fused=False runs
    assert s.device == "cuda" and s.optimizer_impl == "for-loop"
    assert not bench.make_setup(False).fsdp_no_sync


def test_prediction_holds_the_whole_unsharded_gradient_under_no_sync(predicted):
    total = predicted["sync"]["params"]
    assert predicted["sync"]["sharded_gradient_bytes"] == total * 4 / 2  # fp32 shards over 2 ranks
    assert predicted["no_sync"]["no_sync_gradient_bytes"] == total * 4  # every parameter, unsharded
    assert predicted["sync"]["gradients_between_microbatches_bytes"] == total * 4 / 2
    assert predicted["no_sync"]["gradients_between_microbatches_bytes"] == total * 4
    assert predicted["extra_gradient_bytes"] == total * 4 / 2
    delta = predicted["no_sync"]["tensor_peak_bytes"] - predicted["sync"]["tensor_peak_bytes"]
    assert predicted["peak_delta_bytes"] == delta
    # sync: the peak is in a layer's backward, where the lm_head's unsharded gradient (the root unit
    # reduce-scatters last) is held next to the layer's and the accumulated shards; no_sync: the extra
    # half of the gradient, the layer's and the lm_head's gradients being inside the accumulated whole
    assert predicted["sync"]["peak_phase"] == "layer backward"
    assert predicted["no_sync"]["peak_phase"] == "forward"  # as measured: the second micro-batch's forward
    assert delta < total * 2 - predicted["layer_gradient_bytes"]
    live = {m: predicted[m]["live_between_microbatches_bytes"] for m in bench.MODES}
    assert live["no_sync"] - live["sync"] == total * 2
    assert predicted["sync"]["components"]["gradients"] == total * 2
    assert predicted["no_sync"]["components"]["gradients"] == total * 4
    assert 39 < predicted["root_share_pct"] < 41


def _record(peak: int, live: int, sharded: int, unsharded: int, phase: str) -> dict:
    breakdown = {name: 0 for name in bench.BREAKDOWN}
    return dict(peak_bytes=peak, live_after_mb3_bytes=live, after_warmup_live_bytes=live - sharded - unsharded,
                microbatch_peaks_bytes=[peak] * 4, live_after_backward_bytes=[live] * 4,
                optimizer_step_peak_bytes=live, repeat_peak_bytes=[peak], param_checksum=1.0,
                grads_after_mb3=dict(sharded_param_grad=dict(bytes=sharded), unsharded_param_grad=dict(bytes=unsharded),
                                     total_bytes=sharded + unsharded),
                grads_before_step=dict(sharded_param_grad=dict(bytes=sharded or unsharded // 2)),
                peak_at=dict(phase=phase, bytes=peak, breakdown=breakdown), breakdown_after_mb3=breakdown)


def _measured(predicted, *, whole: bool, peak_delta: float) -> dict:
    grads = int(predicted["sync"]["sharded_gradient_bytes"])
    held = 2 * grads if whole else grads
    sync = _record(70 * MIB, 40 * MIB, grads, 0, "backward 2")
    nosync = _record(int(70 * MIB + peak_delta), 40 * MIB + held - grads, 0, held, "forward 2")
    return dict(sync=sync, no_sync=nosync)


def test_compare_and_report_when_the_whole_gradient_is_held(predicted, tmp_path):
    measured = _measured(predicted, whole=True, peak_delta=predicted["peak_delta_bytes"])
    rows = {r["quantity"]: r for r in bench.compare(measured, predicted)["rows"]}
    assert rows["gradient bytes after 3rd backward: delta"]["error_pct"] == 0.0
    assert rows["peak delta (no_sync - sync)"]["error_pct"] == 0.0
    assert bench.holds_whole_gradient(measured, predicted)
    doc = bench.assemble(measured, predicted, dict(torch="t", transformers="x", python="p"))
    assert doc["conclusion"].startswith("The measurement supports")
    bench.write(doc, tmp_path)
    md = (tmp_path / "fsdp_no_sync_cpu.md").read_text()
    assert "| peak delta (no_sync - sync) |" in md and "## Conclusion" in md
    assert json.loads((tmp_path / "fsdp_no_sync_cpu.json").read_text())["command"] == bench.COMMAND


def test_report_explains_the_peak_delta_and_refutes_a_sharded_holding(predicted):
    half = _measured(predicted, whole=True, peak_delta=predicted["peak_delta_bytes"] / 2)
    text = bench.assemble(half, predicted, {})["conclusion"]
    assert text.startswith("The measurement supports") and "reduce-scatter input" in text
    sharded = _measured(predicted, whole=False, peak_delta=0)
    assert not bench.holds_whole_gradient(sharded, predicted)
    assert bench.assemble(sharded, predicted, {})["conclusion"].startswith("The measurement does not support")


def test_median_run_is_the_middle_peak():
    runs = [dict(peak_bytes=b, tag=i) for i, b in enumerate([5, 3, 4])]
    chosen = bench.median_run(runs)
    assert chosen["tag"] == 2 and chosen["repeat_peak_bytes"] == [5, 3, 4]
    assert bench.median_run(runs[:2])["tag"] == 1  # even count: the lower middle one


def test_counter_follows_in_place_storage_resizes():
    import torch

    counter = bench.FsdpTensorCounter()
    t = torch.empty(1024)  # 4 KiB
    counter.track_existing([t])
    assert counter.current_bytes == 4096
    counter.storage_freed(t)  # what FSDP2's free_storage is wrapped with, before resize_(0)
    t.untyped_storage().resize_(0)
    assert counter.current_bytes == 0
    t.untyped_storage().resize_(4096)
    counter.storage_allocated(t)  # after alloc_storage's resize_
    assert counter.current_bytes == 4096 and counter.peak_bytes == 4096


@pytest.mark.slow
def test_end_to_end_one_launch_per_mode(tmp_path):
    assert bench.main(["--repeats", "1", "--out-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "fsdp_no_sync_cpu.json").read_text())
    assert doc["command"].endswith("--repeats 1")
    grads = {m: doc["measured"][m]["grads_after_mb3"] for m in bench.MODES}
    total = doc["model"]["params"]
    assert grads["no_sync"]["unsharded_param_grad"]["bytes"] == total * 4
    assert grads["sync"]["sharded_param_grad"]["bytes"] == total * 4 // 2
