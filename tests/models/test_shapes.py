"""Pretraining shapes from a parameter budget or from dimensions."""

import pytest

from trainfit.core.models.shapes import parse_param_count, parse_shape, shape_for_params, shape_from_dims
from trainfit.core.models.params import count_params
from trainfit.errors import BadInputError


@pytest.mark.parametrize("text,value", [("125m", 125_000_000), ("1.3b", 1_300_000_000), ("7B", 7_000_000_000),
                                        ("500k", 500_000), ("350000000", 350_000_000)])
def test_parse_param_count(text, value):
    assert parse_param_count(text) == value


@pytest.mark.parametrize("size", ["10m", "125m", "350m", "760m", "1.3b", "2.7b", "7b", "13b", "70b"])
def test_shape_lands_within_10_percent(size):
    spec = shape_for_params(size)
    assert count_params(spec).total == pytest.approx(parse_param_count(size), rel=0.10)
    assert spec.hidden_size % 64 == 0 and spec.hidden_size % spec.num_heads == 0
    assert spec.num_heads % spec.num_kv_heads == 0
    assert 20 <= spec.hidden_size / spec.num_layers <= 200  # Kaplan et al. flat-loss band


def test_gqa_and_tying_follow_the_documented_rule():
    small, big = shape_for_params("350m"), shape_for_params("7b")
    assert small.num_kv_heads == small.num_heads and small.tie_embeddings
    assert big.num_kv_heads < big.num_heads and not big.tie_embeddings and big.head_dim == 128


def test_vocab_is_honoured():
    spec = shape_for_params("125m", vocab_size=50257)
    assert spec.vocab_size == 50257
    assert count_params(spec).total == pytest.approx(125e6, rel=0.10)


def test_shape_from_dims_and_parse():
    spec = parse_shape("layers=12,hidden=768,heads=12,vocab=50257,kv_heads=4")
    assert (spec.num_layers, spec.hidden_size, spec.num_kv_heads, spec.vocab_size) == (12, 768, 4, 50257)
    assert spec.intermediate_size == 2048  # 8/3 x 768 rounded up to 256
    assert shape_from_dims(2, 64, 4, 100, intermediate=96).intermediate_size == 96


@pytest.mark.parametrize("text,needle", [("layers=2,hidden=64", "heads"), ("layers=2,hidden=64,heads=3", "hidden"),
                                         ("layers=2,hidden=64,heads=4,colour=1", "colour"),
                                         ("layers=x,hidden=64,heads=4", "layers"), ("lots", "lots"),
                                         ("layers=2,hidden=64,heads=4,kv_heads=3", "kv_heads")])
def test_bad_shapes(text, needle):
    with pytest.raises(BadInputError, match=needle):
        parse_shape(text)


def test_too_small_budget():
    with pytest.raises(BadInputError, match="from 1m to 10t"):
        shape_for_params("10k")
