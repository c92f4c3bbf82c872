"""Method variant names ("dpo+qlora") read in one place: core.setup.parse_variant."""

import pytest

from trainfit.core.plan import variants
from trainfit.core.setup import MethodVariant, parse_variant

EXPECTED = {
    "full": ("full", False, "none"), "lora": ("lora", True, "none"), "qlora": ("qlora", True, "nf4-dq"),
    "dpo": ("dpo", False, "none"), "dpo+lora": ("dpo", True, "none"), "dpo+qlora": ("dpo", True, "nf4-dq"),
    "pretrain": ("pretrain", False, "none"), "inference": ("inference", False, "none"),
    "inference+int8": ("inference", False, "int8"), "inference+nf4": ("inference", False, "nf4-dq"),
}


def test_every_variant_of_the_fallback_chains_is_read():
    named = {v for chain in variants.FALLBACK.values() for v in chain}
    assert named <= set(EXPECTED) and set(variants.LABELS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_variant(name):
    method, adapters, quant = EXPECTED[name]
    assert parse_variant(name) == MethodVariant(method, adapters=adapters, quant=quant)
    assert variants.uses_adapters(name) is adapters
    assert variants.needs_bitsandbytes(name) is (quant != "none")
