"""bench/litgpt_meta_trace.py: the cases, the prediction, the report and the missing-litgpt message
(fast, no litgpt needed); one traced case needs litgpt and is skipped without it."""

from __future__ import annotations

import sys

import pytest

import litgpt_meta_trace as bench
from published_memory import load, model_for


def test_cases_name_models_trainfit_knows_and_litgpt_flags_that_match_their_targets():
    models = load()["models"]
    names = [c[0] for c in bench.CASES + bench.HELD_OUT]
    assert len(names) == len(set(names)) >= 18
    for _case, _config, model_id, _rank, targets, flags in bench.CASES + bench.HELD_OUT:
        spec = model_for({"model": model_id}, models)
        assert spec.num_layers > 0 and targets
        assert set(flags) <= {"lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp"}
    assert set(bench.DROPOUT_CASES) <= set(names)


def test_prediction_uses_the_litgpt_knob_and_the_cpu_setting_for_dropout():
    spec = model_for({"model": "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}, load()["models"])
    targets = ["q_proj", "v_proj"]
    litgpt = bench.predicted_per_layer(spec, 8, targets, "litgpt")
    peft = bench.predicted_per_layer(spec, 8, targets, "transformers")
    cpu = bench.predicted_per_layer(spec, 8, targets, "litgpt", dropout=0.05)
    assert litgpt != peft and cpu > 1.5 * litgpt  # fp32 on the CPU, with dropout's noise and copies


def test_report_has_summary_and_rows():
    rows = [dict(case="a", held_out=False, litgpt_config="x", model="m", run="meta, bf16, dropout 0",
                 measured_bytes_per_token=100.0, predicted_litgpt=101.0, predicted_transformers=150.0,
                 error_litgpt=0.01, error_transformers=0.5),
            dict(case="b", held_out=True, litgpt_config="y", model="m", run="CPU, fp32, dropout 0.05",
                 measured_bytes_per_token=200.0, predicted_litgpt=196.0, predicted_transformers=200.0,
                 error_litgpt=-0.02, error_transformers=0.0)]
    summ = bench.summary(rows)
    assert summ["median_abs_error_litgpt"] == pytest.approx(0.015) and summ["max_abs_error_litgpt"] == 0.02
    md = bench.to_markdown(rows, summ, {"litgpt": "0.5.13", "torch": "2.13.0"})
    assert "| b | yes | CPU, fp32, dropout 0.05 | y | 200 | 196 | -2.0 % |" in md


def test_without_litgpt_the_bench_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "litgpt", None)  # import litgpt raises ImportError
    assert bench.main([]) == 2
    assert "pip install" in capsys.readouterr().err


@pytest.mark.slow
def test_one_case_traced_with_litgpt():
    pytest.importorskip("litgpt")
    rows = bench.run("phi-1.5")
    meta = next(r for r in rows if r["run"].startswith("meta"))
    assert abs(meta["error_litgpt"]) < 0.01 < abs(meta["error_transformers"])
