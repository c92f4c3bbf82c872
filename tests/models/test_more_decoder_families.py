"""Qwen3-MoE, OLMo 2 and SmolLM3 (and Qwen3's query/key norms, Phi-3's fused q/k/v, fused MoE experts
under autocast and LoRA): parameter counts from the shipped config.json fixtures equal transformers'
meta-device build and the published totals, LoRA counts equal PEFT's, and the activation model
matches the live-tensor counter on tiny models of each family (two real training steps on CPU,
bench/memory_accuracy.py's harness)."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.core.memory import estimate_memory  # noqa: E402
from trainfit.core.models.meta_count import meta_param_count  # noqa: E402
from trainfit.core.models.loader import spec_from_config  # noqa: E402
from trainfit.core.models.params import count_params  # noqa: E402
from trainfit.core.setup import LoraSettings  # noqa: E402

from .family_fixtures import config, shrunk  # noqa: E402

_HERE = Path(__file__).resolve().parent
FIXTURES = ("qwen3-30b-a3b", "olmo-2-1124-7b", "smollm3-3b", "gemma-3-1b-it")
# Totals the model cards state: Qwen3-30B-A3B "30.5B in total", OLMo 2 7B "7.3B", SmolLM3 "3B" (3.08B),
# Gemma 3 1B.
PUBLISHED_BILLIONS = {"qwen3-30b-a3b": 30.5, "olmo-2-1124-7b": 7.3, "smollm3-3b": 3.08, "gemma-3-1b-it": 1.0}
ALL_LINEAR = LoraSettings(rank=8, alpha=16, dropout=0.0, target_modules="all-linear")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", FIXTURES)
def test_real_config_count_equals_meta_build_and_the_published_total(name):
    cfg = config(name)
    total = count_params(spec_from_config(cfg, origin=name)).total
    assert (total, meta_param_count(cfg)[1]) == meta_param_count(cfg)
    assert round(total / 1e9, 1 if name != "smollm3-3b" else 2) == PUBLISHED_BILLIONS[name]


def test_qwen3_moe_reads_its_experts_and_query_key_norms():
    spec = spec_from_config(config("qwen3-30b-a3b"), origin="qwen3-30b-a3b")
    assert (spec.num_experts, spec.experts_per_token, spec.moe_intermediate_size, spec.shared_experts) == (128, 8, 768, 0)
    assert spec.head_dim == 128 and spec.num_heads * spec.head_dim == 4096 > spec.hidden_size
    # transformers 5 writes the expert count back as num_local_experts: read either
    renamed = {k: v for k, v in config("qwen3-30b-a3b").items() if k != "num_experts"} | {"num_local_experts": 128}
    assert spec_from_config(renamed).num_experts == 128


def _measure(cfg: dict, setup_kw: dict) -> tuple[int, int]:
    mod_spec = importlib.util.spec_from_file_location("memory_accuracy", _HERE.parents[1] / "bench" / "memory_accuracy.py")
    bench = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(bench)
    from .family_fixtures import build

    bench.build = lambda spec, setup: build({**cfg, "use_cache": False}, device="cpu", attention=setup.attention)
    spec = dataclasses.replace(spec_from_config(cfg, origin=cfg["model_type"]), stored_dtype="float32")
    setup = bench._s(micro_batch=2, seq_len=256, **setup_kw)
    return bench.measure(spec, setup), estimate_memory(spec, setup).devices[0].tensor_peak_bytes


QWEN3 = dict(model_type="qwen3", hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             num_hidden_layers=2, intermediate_size=320, vocab_size=1024, max_position_embeddings=512,
             tie_word_embeddings=True, attention_dropout=0.0)

PHI3 = dict(model_type="phi3", hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
            intermediate_size=320, vocab_size=1024, max_position_embeddings=512, pad_token_id=0, bos_token_id=0,
            eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)

LLAMA = dict(model_type="llama", hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
             intermediate_size=320, vocab_size=1024, max_position_embeddings=512, attention_dropout=0.0)
MIXTRAL = dict(model_type="mixtral", hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
               intermediate_size=320, num_local_experts=4, num_experts_per_tok=2, vocab_size=1024,
               max_position_embeddings=512, attention_dropout=0.0)
QWEN2_MOE = dict(model_type="qwen2_moe", hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=2, intermediate_size=320, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=96, shared_expert_intermediate_size=192, vocab_size=1024,
                 max_position_embeddings=512, attention_dropout=0.0)

CASES = [
    # transformers 5 runs fused experts as one grouped matmul that autocast does not cast: fp32 expert
    # tensors and no 16-bit weight copy (Mixtral -10.5 %, Qwen2-MoE -9.6 % before)
    ("mixtral", MIXTRAL, dict(precision="bf16-mixed")),
    ("qwen2_moe", QWEN2_MOE, dict(precision="bf16-mixed")),
    # PEFT's all-linear adapts the experts as parameters; each layer keeps W + BA (-12.7 % before)
    ("mixtral", MIXTRAL, dict(method="lora", lora=ALL_LINEAR)),
    ("qwen3_moe", None, dict(method="lora", lora=ALL_LINEAR)),
    # Phi-3's v is a view of its fused q/k/v output, and its o_proj reads a copy: -6.1 % before
    ("phi3", PHI3, dict()),
    ("phi3", PHI3, dict(method="lora", lora=ALL_LINEAR)),
    # Qwen3 normalises each head's queries and keys: -16.8 % before the norms were counted
    ("qwen3", QWEN3, dict()),
    ("qwen3", QWEN3, dict(precision="bf16-mixed")),
    ("qwen3_moe", None, dict()),
    ("olmo2", None, dict(precision="bf16-mixed")),
    ("olmo2", None, dict(method="lora", lora=ALL_LINEAR)),
    ("smollm3", None, dict()),
    # Gemma 3: four norms a block and per-head q/k norms, y * (1 + weight) keeping y only when it trains
    ("gemma3_text", None, dict()),
    ("gemma3_text", None, dict(method="lora", lora=ALL_LINEAR, precision="bf16-mixed")),
    # a frozen fp32 base under autocast keeps a 16-bit copy of every weight its matmuls read
    ("llama", LLAMA, dict(method="lora", lora=ALL_LINEAR, precision="bf16-mixed")),
]


@pytest.mark.parametrize("family, cfg, setup_kw", CASES,
                         ids=[f"{f}-{s.get('method', 'full')}-{s.get('precision', 'fp32')}" for f, _, s in CASES])
def test_live_peak_matches_estimate(family, cfg, setup_kw):
    fixture = {"qwen3_moe": "qwen3-30b-a3b", "olmo2": "olmo-2-1124-7b", "smollm3": "smollm3-3b",
               "gemma3_text": "gemma-3-1b-it"}.get(family)
    cfg = cfg if cfg is not None else shrunk(fixture, vocab_size=1024)
    measured, predicted = _measure(cfg, setup_kw)
    assert predicted == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("family, cfg", [("mixtral", MIXTRAL), ("qwen2_moe", QWEN2_MOE), ("qwen3_moe", None)])
def test_all_linear_lora_count_equals_peft(family, cfg):
    """PEFT maps all-linear onto Mixtral's and Qwen3-MoE's fused experts (the gate/up pair at twice the
    rank), not onto Qwen2-MoE's, whose gate/up/down_proj are its shared expert."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from trainfit.core.memory.stats import lora_stats

    from .family_fixtures import build

    cfg = cfg if cfg is not None else shrunk("qwen3-30b-a3b", vocab_size=1024)
    model = get_peft_model(build({**cfg, "use_cache": False}, device="meta"),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    peft_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    count, where = lora_stats(spec_from_config(cfg, origin=family), "all-linear", 8)
    assert count == peft_count
    assert where["experts"] == (0 if family == "qwen2_moe" else 2)
