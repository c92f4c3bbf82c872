"""The default precision of `trainfit estimate` follows the method and the hardware."""

import pytest

from trainfit.cli.cmd_estimate import estimate


@pytest.mark.parametrize("hardware,method,expected", [
    ("a10g", "full", "bf16-mixed"),  # every weight trains: AMP with fp32 master weights
    ("a10g", "lora", "bf16"),  # frozen base in 16-bit, adapters in fp32
    ("t4", "lora", "fp16"),  # Turing has no bf16
    ("t4", "full", "fp16-mixed"),
    ("a10g", "inference", "bf16"),
])
def test_default_precision(hardware, method, expected):
    _, setup, _ = estimate("qwen2.5-0.5b", hardware=hardware, method=method)
    assert setup.precision == expected


def test_explicit_precision_wins():
    _, setup, _ = estimate("qwen2.5-0.5b", hardware="a10g", method="lora", precision="bf16-mixed")
    assert setup.precision == "bf16-mixed"
