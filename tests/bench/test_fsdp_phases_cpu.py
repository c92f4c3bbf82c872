"""bench/fsdp_phases_cpu.py: its cases and report (the runs themselves: one case, in
tests/bench/test_cuda_harness.py's emulated FSDP row)."""

from __future__ import annotations

import fsdp_phases_cpu as bench


def test_cases_are_sharded_fsdp_rows_of_their_own_shapes():
    cases = bench.cases()
    assert len({c.name for c in cases}) == len(cases)
    assert all(c.engine == "fsdp" and c.setup.num_gpus >= 2 and c.setup.fsdp_strategy == "full-shard"
               for c in cases)
    assert {c.setup.method for c in cases} == {"full", "lora"}
    assert {c.setup.grad_checkpointing for c in cases} == {"none", "full"}
    assert all(c.cpu_shape and c.setup.device == "cpu" for c in cases)


def test_report_summarises_the_measured_rows():
    rows = [{"config": "a", "status": "ok", "measured_bytes": 100 * 2**20, "predicted_bytes": 101 * 2**20,
             "error_pct": 1.0, "predicted_phase": "loss backward", "gathered_at_peak_bytes": 2**20},
            {"config": "b", "status": "crashed", "measured_bytes": None, "predicted_bytes": 2**20,
             "error_pct": None, "predicted_phase": "layer backward", "gathered_at_peak_bytes": None}]
    summary, md = bench.report(rows)
    assert summary == {"cases": 2, "measured": 1, "median_abs_error_pct": 1.0, "max_abs_error_pct": 1.0}
    assert "| a | 100.00 | 101.00 | +1.0 | loss backward | 1.00 |" in md and "| b | - | 1.00 | crashed |" in md
