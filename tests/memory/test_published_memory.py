"""The published-measurements benchmark (bench/published_memory.py) cannot rot: its data file keeps
a cited source and a metric on every row, and the harness still runs trainfit on a few rows."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

import published_memory as bench

from trainfit.core.memory import estimate_memory
from trainfit.core.memory.overheads import (SLACK_TRAINING, SLACK_UNDER_PRESSURE, margins, phase_pool_bytes,
                                           required_bytes, slack_fraction)
from trainfit.core.memory_types import DeviceMemory, MemoryComponent
from trainfit.core.models.catalog import get_model
from trainfit.core.setup import TrainingSetup

GIB = 2**30


@pytest.fixture(scope="module")
def doc():
    return bench.load()


def test_every_row_cites_a_source_and_names_its_metric(doc):
    assert bench.schema_problems(doc) == []
    runs = doc["runs"]
    assert len(runs) >= 60
    assert {r["method"] for r in runs} >= {"full", "lora", "qlora"}
    from trainfit.core.frameworks import resolve_framework

    tools = {resolve_framework(r["framework"]).name for r in runs}  # every row's tool resolves as --framework does
    assert tools >= {"litgpt", "torchtune", "fsdp_qlora", "fms-hf-tuning", "fms-hf-tuning-accelerated-peft"}
    assert any(r["oom"] for r in runs) and any(r["sharding"] != "none" for r in runs)
    assert {r["metric"] for r in runs} == set(bench.METRICS)
    for row in runs:
        assert doc["sources"][row["source"]]["url"].startswith("https://github.com/")


def test_schema_check_names_the_broken_row(doc):
    broken = copy.deepcopy(doc)
    del broken["runs"][0]["metric"]
    broken["runs"][1]["source"] = "nowhere"
    broken["runs"][2]["figure"] = None  # neither a figure nor an OOM
    problems = " ".join(bench.schema_problems(broken))
    assert f"{doc['runs'][0]['id']}: missing metric" in problems
    assert f"{doc['runs'][1]['id']}: source 'nowhere'" in problems
    assert doc["runs"][2]["id"] in problems


def _row(doc, row_id):
    return next(r for r in doc["runs"] if r["id"] == row_id)


def test_each_metric_is_compared_with_its_own_prediction(doc):
    models = doc["models"]
    alloc = bench.evaluate(_row(doc, "fms-mistral7b-lora-1gpu-bs4"), models)
    smi = bench.evaluate(_row(doc, "fms-mistral7b-lora-1gpu-bs4-smi"), models)
    reserved = bench.evaluate(_row(doc, "aai-llama2-7b-lora-2048"), models)
    assert alloc["predicted_bytes"] == alloc["tensor_peak_bytes"]
    assert smi["predicted_bytes"] == smi["total_bytes"]
    # reserved sits between the live tensors and what nvidia-smi shows (no context, no NCCL)
    assert reserved["tensor_peak_bytes"] < reserved["predicted_bytes"] == reserved["reserved_bytes"]
    assert reserved["predicted_bytes"] < reserved["total_bytes"]
    assert alloc["error"] == pytest.approx((alloc["predicted_bytes"] - alloc["published_bytes"])
                                           / alloc["published_bytes"])
    assert alloc["published_bytes"] == 26704571904  # the figure in the CSV, in bytes


def test_published_oom_is_scored_by_the_fit_verdict(doc):
    out = bench.evaluate(_row(doc, "hub-gemma7b-lora"), doc["models"])  # OOM on one A10G
    assert out["published_oom"] and "error" not in out
    assert out["predicted_fits"] is False
    summary = bench.summarise([out])
    assert summary["published_ooms"] == 1 and summary["ooms_predicted_fitting"] == []


def test_markdown_report_states_the_targets(doc):
    rows = [bench.evaluate(_row(doc, i), doc["models"]) for i in ("rt-llama2-7b-lora-mb1", "hub-gemma7b-lora")]
    text = bench.to_markdown(rows, bench.summarise(rows))
    assert "median |error|" in text and "(target <= 3 %)" in text
    assert "| rt-llama2-7b-lora-mb1 |" in text and "caught" in text


def test_allocator_slack_is_larger_when_parameters_are_gathered_per_layer():
    assert slack_fraction(training=True) == SLACK_TRAINING == 0.25
    assert slack_fraction(training=True, zero_stage=3) == 0.30
    assert slack_fraction(training=False, zero_stage=3) == 0.05
    one = {c.name: c.bytes for c in margins("cuda", 10 * GIB, architecture="ampere", num_gpus=1,
                                             training=True, zero_stage=3)}
    many = {c.name: c.bytes for c in margins("cuda", 10 * GIB, architecture="ampere", num_gpus=4,
                                              training=True, zero_stage=3)}
    assert one["fragmentation"] == int(2.5 * GIB)  # nothing is sharded on one GPU
    assert many["fragmentation"] == 3 * GIB


def test_the_free_running_pool_keeps_both_phases_transients():
    """Free-running, the optimizer step's gradients and temporaries sit beside the blocks the forward
    and backward left cached: the slack is the larger of that excess and the flat share."""
    phases = {"forward": 30 * GIB, "loss backward": 29 * GIB, "layer backward": 28 * GIB,
              "reference forward": 20 * GIB, "optimizer step": 35 * GIB, "backward end": 31 * GIB}
    assert phase_pool_bytes(phases, resident=20 * GIB) == 45 * GIB  # 20 resident + 10 + 15
    slack = {c.name: c for c in margins("cuda", 35 * GIB, architecture="ampere", num_gpus=1, training=True,
                                        phase_pool=45 * GIB)}["fragmentation"]
    assert slack.bytes == 10 * GIB and "beside the gradients" in slack.what
    small = {c.name: c.bytes for c in margins("cuda", 35 * GIB, architecture="ampere", num_gpus=1,
                                              training=True, phase_pool=36 * GIB)}
    assert small["fragmentation"] == int(SLACK_TRAINING * 35 * GIB)
    host = {c.name: c.bytes for c in margins("cpu", 35 * GIB, architecture=None, num_gpus=1, training=True,
                                             phase_pool=45 * GIB)}
    assert host["fragmentation"] == int(0.10 * 35 * GIB)  # malloc keeps no cache across phases


def test_a_full_fine_tune_holds_more_at_a_larger_batch_with_the_same_tensor_peak(doc):
    """fms-acceleration's Mistral 7B full fine-tune on 2 GPUs peaks at its optimizer step at batch 2
    and 4 alike (the same allocated peak), yet nvidia-smi shows 9 GiB more at batch 4: the pool grows
    with the activations even where the tensor peak does not (here by 0.7 of those 9 GiB: at batch 2 the
    flat 30 % share of a sharded run is the larger). The fit verdict is unchanged."""
    small = bench.evaluate(_row(doc, "fms-mistral7b-full-2gpu-bs2-smi"), doc["models"])
    large = bench.evaluate(_row(doc, "fms-mistral7b-full-2gpu-bs4-smi"), doc["models"])
    assert small["tensor_peak_bytes"] == large["tensor_peak_bytes"]
    assert large["total_bytes"] > small["total_bytes"]
    assert large["predicted_fits"] and small["predicted_fits"]
    assert large["published_bytes"] - small["published_bytes"] > 8 * GIB
    assert large["error"] > -0.10


def test_the_fit_verdict_counts_only_the_slack_left_after_the_allocator_frees_its_cache():
    comps = margins("cuda", 10 * GIB, architecture="ampere", num_gpus=1, training=True)
    comps.append(MemoryComponent("weights", 10 * GIB, "w", True))
    total = sum(c.bytes for c in comps)
    need = required_bytes("cuda", total, comps)
    assert total - need == int(2.5 * GIB) - int(0.05 * 10 * GIB)  # 25 % free-running, 5 % under pressure
    assert required_bytes("cpu", total, comps) == total  # malloc has no cache to give back
    dev = DeviceMemory("cuda:0", 10 * GIB, total, capacity_bytes=(need + total) // 2, components=comps,
                       required_bytes=need)
    assert dev.fits and dev.fits_under_pressure
    assert not dataclasses.replace(dev, capacity_bytes=need - 1).fits
    roomy = dataclasses.replace(dev, capacity_bytes=total)
    assert roomy.fits and not roomy.fits_under_pressure
    assert DeviceMemory("cpu", 1, 10, 9, []).fits is False  # no required_bytes: the total decides


def test_what_reserved_and_nvidia_smi_show_is_capped_at_the_card_under_pressure():
    comps = margins("cuda", 10 * GIB, architecture="ampere", num_gpus=2, training=True)
    comps.append(MemoryComponent("weights", 10 * GIB, "w", True))
    total = sum(c.bytes for c in comps)
    outside = sum(c.bytes for c in comps if c.name in ("cuda_context", "nccl_buffers"))
    roomy = DeviceMemory("cuda:0", 10 * GIB, total, capacity_bytes=total + GIB, components=comps,
                         required_bytes=required_bytes("cuda", total, comps))
    assert roomy.reserved_peak_bytes == total - outside  # tensor peak + workspaces + slack
    assert roomy.device_total_bytes == total
    pressed = dataclasses.replace(roomy, capacity_bytes=total - GIB)
    assert pressed.fits_under_pressure
    assert pressed.device_total_bytes == total - GIB  # the card, not the free-running total
    assert pressed.reserved_peak_bytes == total - GIB - outside  # context and NCCL sit outside the pool
    failing = dataclasses.replace(roomy, capacity_bytes=5 * GIB)
    assert not failing.fits and failing.device_total_bytes == total  # what it would need
    assert DeviceMemory("cpu", 1, 10, 9, []).reserved_peak_bytes is None  # no caching allocator
    # The least pool (what bench/cuda_memory.py --least-capacity measures): the verdict's figure
    # inside the allocator, i.e. the tensor peak, the workspaces and the 5 % that survives a retry.
    slack = next(c.bytes for c in comps if c.name == "fragmentation")
    assert slack > SLACK_UNDER_PRESSURE * 10 * GIB
    assert roomy.least_pool_bytes == roomy.needed_bytes - outside
    assert roomy.least_pool_bytes == roomy.reserved_peak_bytes - slack + int(SLACK_UNDER_PRESSURE * 10 * GIB)
    assert pressed.least_pool_bytes == roomy.least_pool_bytes  # a property of the run, not of the card
    assert DeviceMemory("cpu", 1, 10, 9, []).least_pool_bytes is None


def test_a_run_that_fits_only_under_pressure_says_so(capsys):
    from trainfit.cli.main import main

    # Qwen2.5 7B LoRA, pure bf16, micro-batch 4 x 1024 on a 24 GB card: with room to spare the
    # allocator would reserve about 25.8 GiB, the run needs about 23.6 GiB
    argv = ["estimate", "Qwen/Qwen2.5-7B", "--method", "lora", "--precision", "bf16", "--micro-batch", "4",
            "--seq-len", "1024", "--grad-checkpointing", "full", "--lora-targets", "q_proj,v_proj",
            "--hardware", "1x rtx-4090"]
    assert main(argv) == 0
    assert "fits under memory pressure: needs 23." in " ".join(capsys.readouterr().out.split())
    assert main([*argv, "--json"]) == 0
    gpu = json.loads(capsys.readouterr().out)["devices"][0]
    assert gpu["total_bytes"] > gpu["capacity_bytes"] == gpu["device_total_bytes"]
    assert gpu["tensor_peak_bytes"] < gpu["reserved_peak_bytes"] < gpu["device_total_bytes"]
    assert main([*argv[:7], "5", *argv[8:]]) != 0  # micro-batch 5 needs more than the card
    assert "does not fit: needs" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("run_id", ["fms-powerlm3b-full-1gpu-bs8", "fms-powerlm3b-lora-2gpu-bs4",
                                    "fms-powerlm3b-bnb-1gpu-bs4", "fms-powerlm3b-abnb-2gpu-bs2"])
def test_held_out_granite_runs_match_their_allocated_peak(doc, run_id):
    """fms-acceleration's PowerLM-3B runs were added after the model was set (a family it had not
    seen): the allocated peak within 5 % on full, LoRA and QLoRA, one and two GPUs."""
    row = _row(doc, run_id)
    assert row["metric"] == "allocated" and row["model"] == "ibm/PowerLM-3b"
    result = bench.evaluate(row, doc["models"])
    assert abs(result["error"]) < 0.05, result["error"]


EMULATION_KEYS = ("optimizer_impl", "bitsandbytes", "fsdp_mixed_units", "loss", "kbit_upcast", "fsdp_no_sync",
                  "quantize_lm_head", "bnb_fp16_quant_state", "transformers", "output_kept", "model_code",
                  "reentrant_checkpoint_around_fsdp_units", "previous_step_kept", "fsdp_flat_params",
                  "autocast_16bit_weights", "logits_shift_copy", "bnb_keeps_input")


def test_rows_name_their_tool_as_a_user_does_and_set_no_emulation_knob(doc):
    """Each row's tool reaches the model only through `framework` (the --framework resolver)."""
    assert "frameworks" not in doc
    broken = copy.deepcopy(doc)
    broken["runs"][0]["framework"] = "litgpt@banana"
    assert any("framework: 'litgpt@banana'" in p for p in bench.schema_problems(broken))
    for row in doc["runs"]:
        assert not [k for k in EMULATION_KEYS if k in row], row["id"]
    row = _row(doc, "rt-phi15-qlora-mb1")  # lit-gpt's 2023 scripts: the longest batch first
    setup = bench.setup_for(row)
    assert setup.model_code == "litgpt" and setup.bnb_keeps_input and not setup.previous_step_kept
    from trainfit.core.frameworks import apply_framework, resolve_framework

    own = bench.setup_for(row, framework=False)  # trainfit's own run: no litgpt knob
    assert own.model_code == "transformers" and not own.bnb_keeps_input
    assert apply_framework(own, resolve_framework(row["framework"]))[0] == setup


def test_naming_the_tool_is_reported_beside_the_same_rows_without_it(doc):
    ids = ("rt-llama2-7b-lora-mb1", "hub-gemma7b-lora", "fms-mistral7b-bnb-1gpu-bs4")
    rows = [bench.evaluate(_row(doc, i), doc["models"]) for i in ids]
    summary = bench.summarise(rows)
    own = summary["no_framework"]
    assert own["median_abs_error"] is not None and set(own["by_framework"]) == set(summary["by_framework"])
    text = bench.to_markdown(rows, summary)
    assert "median |error| with no framework" in text and "error, no framework" in text


def test_committed_results_meet_the_targets():
    """bench/results/published_memory.json as committed (regenerate: bench/published_memory.py)."""
    from pathlib import Path

    s = json.loads((Path(bench.__file__).parent / "results" / "published_memory.json").read_text())["summary"]
    assert s["median_abs_error"] <= 0.03 and s["under_10pct_share"] <= 0.03
    # open with their reason (bench FINDINGS 23): the two-GPU Llama 2 70B QLoRA pair at micro-batch 4
    assert set(s["ooms_predicted_fitting"]) <= {"fms-llama2-70b-bnb-2gpu-bs4", "fms-llama2-70b-abnb-2gpu-bs4"}
    assert s["no_framework"]["median_abs_error"] > s["median_abs_error"]
