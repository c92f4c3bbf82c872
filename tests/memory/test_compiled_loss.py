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


@pytest.mark.parametrize("backend", ["eager", "aot_eager_decomp_partition"])
def test_a_compiled_model_keeps_its_16bit_logits_for_the_loss(backend):
    """The standard loss inside a whole compiled transformers model: the logits themselves are kept,
    not log_softmax's fp32 output; trainfit's torch_compile term keeps the same bytes per entry."""
    pytest.importorskip("transformers")
    row = bench.whole_model_vocab_saved(backend, tokens_per_seq=64, vocab=2048)
    kept = bench.predicted_kept_per_token("bfloat16", backend != "eager", tokens=row["tokens"], vocab=row["vocab"],
                                          loss="standard") * row["tokens"]
    per_entry = 2 if backend != "eager" else 4  # bf16 logits vs fp32 log_softmax
    assert row["vocab_sized_saved_bytes"] == row["tokens"] * row["vocab"] * per_entry
    assert row["dtypes"] == (["bfloat16"] if backend != "eager" else ["float32"])
    # the model's kept bytes: those entries, plus two fp32 per token under compile
    assert kept == row["vocab_sized_saved_bytes"] + (8 * row["tokens"] if backend != "eager" else 0)
