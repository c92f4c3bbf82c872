"""bench/held_grads_replay.py: the traced run's model, the prediction and the report (fast); one traced
case at a small batch is marked slow."""

from __future__ import annotations

import pytest

import held_grads_replay as bench


def test_traces_the_published_row_model():
    spec = bench.llama2_70b()
    assert (spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.vocab_size) == (80, 8192, 28672, 32000)
    assert bench.llama2_70b_row()["oom"] is False


def test_prediction_is_n_minus_one_bf16_hidden_states():
    spec = bench.llama2_70b()
    assert bench.predicted_held_bytes(spec, 2) == 79 * 2 * 8192 * 2 * 4096


def test_markdown_reports_the_error_of_the_held_bytes():
    runs = [dict(micro_batch=mb, held=h, static_bytes=1, traced_above_static_bytes=2**30, replayed_slack_bytes=2**29,
                 surviving_slack_bytes=2**28) for mb in bench.MICRO_BATCHES for h in (False, True)]
    doc = dict(model="m", runs=runs, held=[dict(micro_batch=2, traced_bytes=2**30, predicted_bytes=2**30 + 2**27)])
    md = bench.to_markdown(doc)
    assert "| 2 | 1.00 | 1.12 | +12.5 |" in md and md.count("| yes |") == 2


@pytest.mark.slow
def test_held_gradients_traced_match_the_model():
    bench.meta_trace._register_flash_attention()
    spec = bench.llama2_70b()
    (off, static), (on, _) = (bench.trace(spec, 1, held) for held in (False, True))
    extra = on.traced_peak_bytes() - off.traced_peak_bytes()
    assert extra == pytest.approx(bench.predicted_held_bytes(spec, 1), rel=0.05)
