"""The chunked loss's kept tensors, eager and compiled, against what autograd really packs for the
backward of one piece (bench/compiled_loss_cpu.py; the compiled case through AOTAutograd's partition,
which Inductor uses, with no C++ compiler needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import compiled_loss_cpu as bench


@pytest.mark.parametrize("backend", ["eager", "aot_eager_decomp_partition"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float32"])
def test_kept_bytes_of_one_piece(backend, dtype_name):
    tokens, vocab = 64, 2048
    row = bench.saved_for_backward(backend, dtype_name, tokens=tokens, vocab=vocab)
    predicted = bench.predicted_kept_per_token(dtype_name, backend != "eager", tokens=tokens, vocab=vocab) * tokens
    # eager: log_softmax's fp32 output (and nll_loss's 4-byte total weight); compiled: the logits
    # themselves and two fp32 per token
    assert row["saved_bytes"] == pytest.approx(predicted, abs=8)
    assert (row["of_which_logits_bytes"] > 0) == (backend != "eager")
    assert row["grad_dtype"] == dtype_name
