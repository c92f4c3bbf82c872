"""The published-throughput benchmark (bench/published_speed.py on bench/data/published_speed.yaml):
the data file's schema and coverage, and the speed model against it (the target:
median |error| <= 15 %, no systematic optimism on multi-GPU runs)."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import yaml

import published_speed as bench


@pytest.fixture(scope="module")
def rows() -> list:
    return bench.load_rows()


@pytest.fixture(scope="module")
def result(rows) -> dict:
    return bench.evaluate(rows)


def test_every_run_is_cited_with_a_known_figure_kind():
    doc = yaml.safe_load(bench.DATA.read_text())
    assert doc["accessed"]
    groups = doc["groups"]
    for entry in doc["runs"]:
        row = {**groups.get(entry.get("group"), {}), **entry}
        assert row["source"].startswith("https://"), row["id"]
        assert row["figure"]["kind"] in bench.FIGURE_KINDS, row["id"]
        assert row["figure"]["value"] > 0, row["id"]
        if row["figure"]["kind"] == "seconds_for_tokens":
            assert row["figure"]["tokens"] > 0, row["id"]
    for name, shape in doc["models"].items():
        assert shape["source"].startswith("https://"), name


def test_runs_cover_what_the_issue_asks_for(rows):
    assert len(rows) >= 40
    setups = [r.setup for r in rows]
    assert any(s.num_gpus == 1 for s in setups) and any(s.num_gpus > 1 for s in setups)
    multi = [r for r in rows if r.setup.num_gpus > 1]
    assert {r.link for r in multi} == {"nvlink", "pcie"}
    assert any(s.seq_len <= 512 for s in setups) and any(s.seq_len >= 16384 for s in setups)
    assert {"full", "lora", "qlora"} <= {s.method for s in setups}


def test_published_figure_is_converted_to_tokens_per_second_per_gpu(rows):
    by_id = {r.id: r for r in rows}
    # Answer.AI: 1,024 samples x 2,048 tokens in 437 s on 2 GPUs.
    assert by_id["answerai-2x4090-7b-lora-ddp-bs4"].published_per_gpu == pytest.approx(1024 * 2048 / 437 / 2)
    # Qwen: 1 x 8 sequences of 2,048 tokens per iteration at 5.2 s/iter on one GPU.
    assert by_id["qwen-7b-lora-s2048"].published_per_gpu == pytest.approx(8 * 2048 / 5.2)
    # torchtune: whole-node tokens/s on 8 GPUs.
    assert by_id["torchtune-70b-lora-8xa100"].published_per_gpu == pytest.approx(3497 / 8)


def test_a_row_without_a_source_is_refused(tmp_path):
    doc = yaml.safe_load(bench.DATA.read_text())
    doc["runs"] = [dict(doc["runs"][0])]
    doc["runs"][0]["source"] = "somewhere"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="source"):
        bench.load_rows(path)


@pytest.mark.parametrize("run_id,tolerance", [
    ("pytorch-blog-llama2-7b-fsdp-128gpu", 0.15),  # multi-node NVLink, full training
    ("qwen-7b-lora-s256", 0.15),  # one GPU, short sequences: per-step fixed costs
    ("qwen-7b-qlora-s2048", 0.15),  # QLoRA dequantisation cost
    ("answerai-2x4090-7b-lora-fsdp-bs6", 0.25),  # PCIe consumer cards, FSDP
    ("foundry-a100-mpt13b-s16384", 0.15),  # long sequence: fused attention kernels
])  # fmt: skip
def test_selected_runs_are_predicted_within_tolerance(rows, run_id, tolerance):
    row = next(r for r in rows if r.id == run_id)
    predicted = bench.predict_row(row).tokens_per_second / row.setup.num_gpus
    assert abs(predicted / row.published_per_gpu - 1) <= tolerance, (run_id, predicted, row.published_per_gpu)


def test_median_error_and_no_systematic_optimism_on_multi_gpu(result):
    summary = result["summary"]
    assert summary["median_abs_error"] <= 0.15
    counted = [r for r in result["rows"] if r["counted"]]
    multi = [r["signed_error"] for r in counted if r["num_gpus"] > 1]
    assert statistics.median(multi) <= 0.05
    # Implausible published figures are reported but left out of the summary.
    assert summary["runs"] == len(counted) < len(result["rows"])


def test_rows_that_repeat_a_memory_run_take_its_config_and_release(rows):
    by_id = {r.id: r for r in rows}
    santacoder = by_id["fms-santacoder-full-1gpu-bs4"]
    assert santacoder.spec.architecture == "gpt_bigcode"  # the config.json of published_memory.yaml
    mixtral = by_id["fms-mixtral-abnb-1gpu-bs4"]
    assert mixtral.setup.experts_fused is False  # transformers 4.48.1: one nn.Linear per expert
    fused = dataclasses.replace(mixtral, setup=dataclasses.replace(mixtral.setup, experts_fused=True))
    assert bench.predict_row(fused).step_seconds < bench.predict_row(mixtral).step_seconds


@pytest.mark.parametrize("run_id", ["fms-mistral7b-full-2gpu-bs2", "fms-llama2-70b-abnb-2gpu-bs2",
                                    "fms-mistral7b-abnb-1gpu-bs8"])
def test_held_out_runs_are_predicted_within_15_percent(rows, run_id):
    row = next(r for r in rows if r.id == run_id)
    predicted = bench.predict_row(row).tokens_per_second / row.setup.num_gpus
    assert abs(predicted / row.published_per_gpu - 1) <= 0.15, (run_id, predicted, row.published_per_gpu)


def test_peft_kbit_preparation_pair_keeps_its_published_ratio(rows):
    """Two runs on the same A100 that differ only in PEFT's fp32 cast of the non-quantised weights."""
    by_id = {r.id: r for r in rows}
    upcast, plain = by_id["fms-mistral7b-bnb-1gpu-bs4"], by_id["fms-mistral7b-abnb-1gpu-bs4"]
    assert upcast.setup.kbit_upcast and not plain.setup.kbit_upcast
    published = plain.published_per_gpu / upcast.published_per_gpu
    predicted = bench.predict_row(upcast).step_seconds / bench.predict_row(plain).step_seconds
    assert abs(predicted / published - 1) <= 0.05, (predicted, published)


def test_torch_compile_pair_gains_about_what_was_published(rows):
    """Lightning Thunder's benchmark: the same FSDP2 Llama 2 7B run on 8 H100, eager and compiled."""
    by_id = {r.id: r for r in rows}
    eager, compiled = by_id["thunder-llama2-7b-8xh100-eager"], by_id["thunder-llama2-7b-8xh100-compile"]
    assert compiled.setup.torch_compile and not eager.setup.torch_compile
    published = compiled.published_per_gpu / eager.published_per_gpu  # 1.27
    predicted = bench.predict_row(eager).step_seconds / bench.predict_row(compiled).step_seconds
    assert 1.1 < predicted and abs(predicted / published - 1) <= 0.10, (predicted, published)


def test_rows_name_their_tool_through_the_framework_resolver(rows):
    """No row sets a framework-emulation knob: how a tool runs comes from `framework` (as --framework),
    and each row is also predicted as trainfit's own run."""
    from trainfit.core.frameworks import apply_framework, resolve_framework

    assert not set(bench.SETUP_KEYS) & {"loss", "kbit_upcast", "autocast_16bit_weights", "transformers"}
    by_id = {r.id: r for r in rows}
    upcast = by_id["fms-mistral7b-bnb-1gpu-bs4"]
    assert upcast.raw["framework"] == "fms-hf-tuning@2.6" and not upcast.own_setup.kbit_upcast
    assert apply_framework(upcast.own_setup, resolve_framework("fms-hf-tuning@2.6"))[0] == upcast.setup
    tune = by_id["torchtune-8b-full-1x4090"]
    assert tune.setup.loss == "chunked" and tune.own_setup.loss == "standard"
    result = bench.evaluate([upcast, tune])
    assert result["summary"]["no_framework"]["rows_with_framework"] == 2
    assert all("signed_error_no_framework" in r for r in result["rows"])
