"""bench/step_time_accuracy.py: the families beyond Llama build what the model predicts for, and the
verdict only counts rows timed while no other process shared the cores."""

from __future__ import annotations

import pytest

import step_time_accuracy as bench


@pytest.mark.parametrize("cfg", bench.MORE, ids=bench.describe)
def test_built_families_are_the_models_that_are_predicted(cfg):
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoModelForCausalLM

    from trainfit.core.models.params import count_params

    spec = bench.spec_for(cfg)
    assert spec.architecture == cfg["family"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(bench.hf_config(cfg))
    assert sum(p.numel() for p in model.parameters()) == count_params(spec).total


def _row(family: str, error: float, loaded: bool | None = False) -> dict:
    row = {"config": bench.row_config((256, 4, 8, 688, 8192, 2, 256, "full", "fp32", "none"), family), "error": error}
    if loaded is not None:
        row["loaded"] = loaded
    return row


def test_verdict_leaves_out_loaded_rows_and_rates_measured_under_load():
    rows = [_row("llama", 0.5), _row("mistral", 0.04), _row("phi3", -0.06), _row("gemma", 0.02),
            _row("qwen3", 1.4, loaded=True)]
    b = bench.beyond_llama(rows, {})
    assert b["rows"] == 3 and b["left_out_loaded"] == 1 and b["verdict"].startswith("PASS")
    assert b["median_abs_error"] == pytest.approx(0.04) and b["median_error"] == pytest.approx(0.02)
    biased = bench.beyond_llama([_row("mistral", 0.08), _row("phi3", 0.07), _row("gemma", 0.09)], {})
    assert biased["verdict"].startswith("FAIL")  # within 10 % but all one way: bias above 5 %
    under_load = bench.beyond_llama(rows, {"rates_load_check": {"reliable": False, "reason": "busy"}})
    assert under_load["verdict"].startswith("no verdict") and "median_abs_error" not in under_load
    assert bench.beyond_llama([_row("qwen3", 1.4, loaded=True)], {})["verdict"].startswith("no verdict")
    assert bench.select("beyond-llama", bench.CONFIGS) == [c for c in bench.CONFIGS if c["family"] != "llama"]
