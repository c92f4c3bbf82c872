"""bench/fsdp_reentrant_cpu.py: the prediction side, the comparison and the report (fast, no
processes); one end-to-end launch is marked slow."""

from __future__ import annotations

import pytest

import fsdp_reentrant_cpu as bench


def test_spec_counts_the_parameters_transformers_builds():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    for layers in bench.LAYERS:
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig.from_dict(bench.config_dict(layers)))
        from trainfit.core.memory.stats import model_stats

        assert model_stats(bench.tiny_spec(layers)).total == sum(p.numel() for p in model.parameters())


def test_setup_is_the_measured_run():
    s = bench.make_setup("around")
    assert (s.method, s.precision, s.micro_batch, s.seq_len, s.grad_checkpointing) == (
        "lora", "fp32", bench.MICRO_BATCH, bench.SEQ_LEN, "full")
    assert (s.num_gpus, s.fsdp_strategy, s.lora.rank, list(s.lora.target_modules)) == (
        2, "full-shard", bench.LORA_RANK, bench.TARGETS)
    assert s.reentrant_checkpoint_around_fsdp_units
    assert not bench.make_setup("inside").reentrant_checkpoint_around_fsdp_units
    assert not bench.make_setup("around-non-reentrant").reentrant_checkpoint_around_fsdp_units


def test_prediction_holds_one_input_gradient_per_layer_but_the_first():
    h = bench.hidden_state_bytes()
    for layers in bench.LAYERS:
        inside, around = bench.predict(layers, "inside"), bench.predict(layers, "around")
        assert around["peak_phase"] == "layer backward"
        assert around["tensor_peak_bytes"] - inside["tensor_peak_bytes"] == pytest.approx((layers - 1) * h)
        assert bench.predict(layers, "around-non-reentrant") == inside


def test_compare_reports_differences_in_hidden_states():
    h = bench.hidden_state_bytes()
    measured, predicted = {}, {}
    for layers in bench.LAYERS:
        for i, placement in enumerate(bench.PLACEMENTS):
            extra = layers * h if placement == "around" else 0
            measured[(layers, placement)] = {"peak_bytes": 10 * h + layers * h + extra}
            predicted[(layers, placement)] = {"tensor_peak_bytes": 20 * h + layers * h + (extra and extra - h)}
    rows = {r["quantity"]: r for r in bench.compare(measured, predicted)}
    assert rows["8 layers: around - inside"]["measured_hidden_states"] == 8
    assert rows["8 layers: around - inside"]["predicted_hidden_states"] == 7
    assert rows["16 layers: around-non-reentrant - inside"]["measured_bytes"] == 0
    assert rows["around: growth per layer"]["measured_hidden_states"] == 2
    assert rows["inside: growth per layer"]["predicted_hidden_states"] == 1


def test_markdown_lists_every_run():
    runs = [dict(layers=n, placement=p, start_bytes=2**20, peak_bytes=3 * 2**20, step_peak_bytes=2**21,
                 predicted_tensor_peak_bytes=2**22, predicted_peak_phase="layer backward")
            for n in bench.LAYERS for p in bench.PLACEMENTS]
    doc = dict(torch="x", transformers="y", hidden_state_bytes=bench.hidden_state_bytes(), runs=runs,
               comparison=[dict(quantity="q", measured_bytes=1, predicted_bytes=2, measured_hidden_states=0.5,
                                predicted_hidden_states=1.0)])
    md = bench.to_markdown(doc)
    assert md.count("| layer backward |") == len(runs) and "| q |" in md
    assert md.count("| 3.00 | 4.00 | +33.3 | layer backward |") == len(runs)


@pytest.mark.slow
def test_reentrant_checkpoint_around_frozen_units_holds_a_hidden_state_per_layer():
    """Two gloo ranks: the reentrant checkpoint around the FSDP units holds about one hidden state per
    layer but the first more than the checkpoint inside them (two launches at the smaller depth; the
    benchmark measures both depths and the growth per layer)."""
    h = bench.hidden_state_bytes()
    layers = min(bench.LAYERS)
    held = bench.measure(layers, "around")["peak_bytes"] - bench.measure(layers, "inside")["peak_bytes"]
    assert 0.5 * (layers - 1) * h < held < 1.5 * (layers - 1) * h
