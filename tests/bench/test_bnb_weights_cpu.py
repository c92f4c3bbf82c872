"""bench/bnb_weights_cpu.py: where bitsandbytes is installed, a loaded MoE base matches the memory model."""

import pytest


def test_a_loaded_mixtral_keeps_its_fused_experts_16bit_as_the_model_says():
    pytest.importorskip("bitsandbytes")
    import bnb_weights_cpu as bench

    row = bench.run_case("mixtral", "nf4")
    assert row["weights_error_pct"] == 0 and row["scales_error_pct"] == 0
    if row["experts_fused"]:
        assert row["params_left_16bit"] > row["expert_params"]
        assert row["predicted_if_experts_quantised"] < 0.5 * row["measured_param_bytes"]

