"""A full fine-tune that only fits with DeepSpeed's CPU offload: `cloud` keeps the asked method
(offload before falling back to adapters), names the offload, and `estimate` gives the same memory
for the same setting (one model, one answer)."""

from __future__ import annotations

import json

from trainfit.cli.main import main


def _json(capsys, argv):
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_32b_full_fine_tune_on_4x_a100_fits_with_offload_in_cloud_and_estimate(capsys):
    code, doc = _json(capsys, ["cloud", "qwen2.5-32b", "--method", "full", "--examples", "1000", "--seq-len", "512",
                               "--flavor", "a100x4", "--json"])
    assert code == 0
    (row,) = [r for r in doc["results"] if r["flavor"] == "a100x4"]
    assert row["fits"] and row["method"] == "full" and row["zero_stage"] == 3 and row["offload"] != "none"
    assert f"offload {row['offload']}" in row["why"]
    code, est = _json(capsys, ["estimate", "qwen2.5-32b", "--method", "full", "--hardware", "4x a100-80gb",
                               "--zero", "3", "--offload", row["offload"], "--grad-checkpointing",
                               row["grad_checkpointing"], "--micro-batch", str(row["micro_batch"]),
                               "--seq-len", "512", "--json"])
    assert code == 0 and est["fits"]
    gpu = est["devices"][0]
    assert abs(gpu["required_bytes"] / 2**30 - row["memory_gib_per_device"]) < 0.01  # the need, as the verdict
