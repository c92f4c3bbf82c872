"""A few tiny configurations measured live (random weights, CPU, live-tensor counter) against the
estimate's tensor peak; tolerance 15 %. The full comparison is bench/memory_accuracy.py."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "memory_accuracy.py"


def _bench():
    spec = importlib.util.spec_from_file_location("memory_accuracy", _BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arch, kw", [
    ("llama", dict(precision="bf16-mixed")),
    ("qwen2", dict(method="lora")),
    ("gpt2", dict()),
])
def test_live_peak_matches_estimate(arch, kw):
    from trainfit.core.memory import estimate_memory

    b = _bench()
    spec = dataclasses.replace(b.ARCHS[arch], num_layers=1, vocab_size=4096)
    setup = b._s(seq_len=128, micro_batch=1, **kw)
    measured = b.measure(spec, setup)
    predicted = estimate_memory(spec, setup).devices[0].tensor_peak_bytes
    assert predicted == pytest.approx(measured, rel=0.15)
