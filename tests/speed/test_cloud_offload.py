"""A full fine-tune that only fits with DeepSpeed's CPU offload: `cloud` keeps the asked method
(offload before falling back to adapters), names the offload, and `estimate` gives the same memory
for the same setting (one model, one answer)."""

from __future__ import annotations

import json

from trainfit.cli.main import main


def _json(capsys, argv):
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_7b_full_fine_tune_on_one_h100_fits_with_offload_in_cloud_and_estimate(capsys):
    code, doc = _json(capsys, ["cloud", "qwen2.5-7b", "--method", "full", "--examples", "1000", "--seq-len", "512",
                               "--flavor", "lambda-1x-h100-sxm", "--json"])
    assert code == 0
    (row,) = doc["results"]
    assert row["fits"] and row["method"] == "full" and row["zero_stage"] and row["offload"] != "none"
    assert f"offload {row['offload']}" in row["why"]
    code, est = _json(capsys, ["estimate", "qwen2.5-7b", "--method", "full", "--hardware", "h100-sxm",
                               "--zero", str(row["zero_stage"]), "--offload", row["offload"], "--grad-checkpointing",
                               row["grad_checkpointing"], "--micro-batch", str(row["micro_batch"]),
                               "--seq-len", "512", "--json"])
    assert code == 0 and est["fits"]
    gpu, cpu = est["devices"]
    assert abs(gpu["required_bytes"] / 2**30 - row["memory_gib_per_device"]) < 0.01  # the need, as the verdict
    assert cpu["total_bytes"] < 225 * 2**30 * 0.95  # the offloaded states fit the flavor's 225 GiB of RAM


def test_offload_is_not_ranked_on_a_flavor_whose_ram_cannot_hold_it(capsys):
    """The same GPU with 125 GiB of RAM (runpod-h100-sxm) cannot hold the 170 GiB the offloaded optimizer
    needs, and 4x A100 with 568 GiB cannot hold a 32B model's 732 GiB: both fall back to adapters."""
    code, doc = _json(capsys, ["cloud", "qwen2.5-7b", "--method", "full", "--examples", "1000", "--seq-len", "512",
                               "--flavor", "runpod-h100-sxm", "--flavor", "lambda-1x-h100-sxm", "--json"])
    rows = {r["flavor"]: r for r in doc["results"]}
    assert rows["lambda-1x-h100-sxm"]["offload"] != "none"
    assert rows["runpod-h100-sxm"]["method"] == "lora" and rows["runpod-h100-sxm"]["offload"] == "none"
    code, doc = _json(capsys, ["cloud", "qwen2.5-32b", "--method", "full", "--examples", "1000", "--seq-len", "512",
                               "--flavor", "a100x4", "--no-fallback", "--json"])
    (row,) = doc["results"]
    assert code == 3 and not row["fits"]
