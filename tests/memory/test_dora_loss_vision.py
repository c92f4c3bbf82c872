"""Issue 9 item 5 (part 2): chunked / fused cross-entropy, pre-quantised GPTQ / AWQ bases, DoRA and
image tokens - each against a hand calculation, through the CLI, refused where they do not apply,
and DoRA and the chunked loss against the live-tensor counter on CPU."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.core.memory import estimate_memory
from trainfit.core.memory.loss_kernels import chunked_chunk_tokens, liger_chunk_tokens
from trainfit.core.memory.stats import model_stats
from trainfit.core.memory.vision import tokens_per_image
from trainfit.core.models.catalog import resolve_model
from trainfit.core.models.params import linear_layers
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.errors import BadInputError

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "memory_accuracy.py"
LORA_QV = LoraSettings(rank=8, alpha=16, dropout=0.0, target_modules=["q_proj", "v_proj"])


def _comp(est, name: str) -> int:
    return next(c.bytes for c in est.devices[0].components if c.name == name)


def _setup(**kw) -> TrainingSetup:
    base = dict(method="lora", precision="bf16", lora=LORA_QV, micro_batch=2, seq_len=1024, device="cuda")
    base.update(kw)
    return TrainingSetup(**base)


# ---- loss kernels -----------------------------------------------------------------------------
def test_liger_chunk_rule_matches_its_worked_example():
    # Liger's own comment: BT = 4096*4, V = 32000, H = 4096 -> inc_factor 8, chunk 2048.
    assert liger_chunk_tokens(4096 * 4, 32000, 4096) == 2048
    assert liger_chunk_tokens(100, 32000, 4096) == 16  # next power of two of ceil(100/8) = 13
    assert liger_chunk_tokens(8, 1000, 4096) == 8  # never more than the tokens
    assert chunked_chunk_tokens(1000) == 125


def test_logits_term_by_kernel_against_hand_calculation():
    spec = resolve_model("qwen2.5-0.5b")
    v, h, tokens = spec.vocab_size, spec.hidden_size, 2 * 1024
    std = estimate_memory(spec, _setup())
    # standard, bf16 base: fp32 log_softmax saved (4V) + its backward's two fp32 grads (8V) per token
    assert _comp(std, "logits") == 12 * v * tokens
    fused = estimate_memory(spec, _setup(loss="fused"))
    chunk = 2 ** math.ceil(math.log2(math.ceil(tokens / math.ceil(v / h))))
    # one chunk's 16-bit logits (their grad in place) + the hidden-state grads (bf16) + fp32 loss per token
    assert _comp(fused, "logits") == chunk * v * 2 + tokens * (2 * h + 4)
    chunked = estimate_memory(spec, _setup(loss="chunked"))
    piece = tokens // 8
    # torchtune: every piece's 16-bit logits and saved fp32 log_softmax, beside one piece's fp32
    # upcast, at the end of the loss forward (its backward holds one piece's fp32 grads: less)
    assert _comp(chunked, "logits") == tokens * (2 * v + 4 * v) + piece * 4 * v
    assert fused.devices[0].tensor_peak_bytes < chunked.devices[0].tensor_peak_bytes < std.devices[0].tensor_peak_bytes


def test_fused_loss_keeps_the_lm_head_gradient_when_it_trains():
    from trainfit.core.memory.loss_kernels import loss_terms

    spec = resolve_model("qwen2.5-0.5b")
    v, h, tokens = spec.vocab_size, spec.hidden_size, 256
    setup = _setup(method="full", precision="bf16-mixed", lora=None, loss="fused")
    frozen = loss_terms(spec, setup, tokens, head_trains=False)
    trained = loss_terms(spec, setup, tokens, head_trains=True)
    # fp32 residual stream under autocast: fp32 hidden-state grads + fp32 loss per token
    assert frozen.saved == tokens * (4 * h + 4)
    # Liger allocates the lm_head weight's grad (fp32 master under autocast) in the forward
    assert trained.saved - frozen.saved == v * h * 4
    assert trained.backward == 0  # backward only scales the stored gradients


@pytest.mark.parametrize("method,precision", [("full", "fp32"), ("full", "bf16"), ("lora", "bf16")])
def test_chunked_cross_entropy_against_the_live_counter(method, precision):
    """torchtune's CEWithChunkedOutputLoss on a tiny Llama, measured live on CPU: the lm_head applied
    to 8 pieces (TransformerDecoder.chunked_output), each piece upcast and cross-entropied in turn,
    the logits deleted before backward as torchtune's recipes do."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch.nn.functional as F

    from trainfit.train.tensor_counter import TensorBytesCounter

    b = _bench()
    spec = dataclasses.replace(b.ARCHS["llama"], num_layers=1, vocab_size=8192)
    setup = dataclasses.replace(b._s(method, seq_len=256, micro_batch=2), loss="chunked", precision=precision)
    model = b.build(spec, setup)
    if setup.lora is not None:
        model = b._peft(model, setup.lora)
    model.train()
    inner = model.get_base_model() if setup.lora is not None else model  # PEFT wraps the LoRA model
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    ids = torch.randint(0, spec.vocab_size, (2, 256), generator=torch.Generator().manual_seed(1))
    # torchtune shifts the labels, not the logits: the last position is ignored
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    counter = TensorBytesCounter()
    counter.track_existing(list(model.parameters()) + list(model.buffers()) + [ids, labels])

    with counter:
        for _ in range(2):
            hidden = inner.model(input_ids=ids).last_hidden_state
            logits = [inner.lm_head(piece) for piece in hidden.chunk(8, dim=1)]
            total = sum(F.cross_entropy(lg.reshape(-1, lg.size(-1)).float(), lb.reshape(-1), ignore_index=-100,
                                        reduction="sum") for lg, lb in zip(logits, labels.chunk(8, dim=1)))
            loss = total / (labels != -100).sum()
            del logits, hidden, total
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
    predicted = estimate_memory(spec, setup).devices[0].tensor_peak_bytes
    standard = estimate_memory(spec, dataclasses.replace(setup, loss="standard")).devices[0].tensor_peak_bytes
    assert predicted < standard
    assert predicted == pytest.approx(counter.peak_bytes, rel=0.03)


# ---- pre-quantised bases ----------------------------------------------------------------------
@pytest.mark.parametrize("quant", ["gptq", "awq"])
def test_gptq_awq_weight_bytes(quant):
    spec = resolve_model("qwen2.5-7b")
    st = model_stats(spec)
    est = estimate_memory(spec, _setup(method="qlora", quant=quant))
    assert _comp(est, "weights") == int(st.linear * 0.5 + (st.total - st.linear) * 2)
    in_features = sum(x.count * x.in_features for x in linear_layers(spec) if x.kind != "lm_head" and not x.vision)
    g_idx = 4 * in_features if quant == "gptq" else 0
    # per group of 128: fp16 scale (2 B) + a 4-bit zero (0.5 B) per output column
    assert _comp(est, "quant_overhead") == int(st.linear * 2.5 / 128 + g_idx)
    nf4 = estimate_memory(spec, _setup(method="qlora", quant="nf4"))
    assert _comp(est, "quant_overhead") < _comp(nf4, "quant_overhead")  # 2.5 B per 128 < 4 B per 64
    inference = estimate_memory(spec, _setup(method="inference", quant=quant, lora=None))
    assert inference.devices[0].tensor_peak_bytes > 0


def test_llm_int8_keeps_the_inputs_of_its_linears():
    spec = resolve_model("qwen2.5-7b")
    nf4 = estimate_memory(spec, _setup(method="qlora", quant="nf4", grad_accum=2))
    int8 = estimate_memory(spec, _setup(method="qlora", quant="int8", grad_accum=2))
    h, q, f = spec.hidden_size, spec.num_heads * spec.head_dim, spec.intermediate_size
    # bf16 attention input, o_proj input, MLP input and down_proj input per token and layer
    per_token = 2 * (2 * h + q + f)
    assert _comp(int8, "activations") - _comp(nf4, "activations") == spec.num_layers * per_token * 2 * 1024


# ---- DoRA -------------------------------------------------------------------------------------
def test_dora_magnitudes_and_saved_outputs_by_hand():
    spec = resolve_model("qwen2.5-0.5b")
    lora = estimate_memory(spec, _setup(grad_accum=2))
    dora = estimate_memory(spec, _setup(dora=True, grad_accum=2))
    outs_per_layer = spec.num_heads * spec.head_dim + spec.num_kv_heads * spec.head_dim  # q_proj + v_proj
    magnitudes = spec.num_layers * outs_per_layer
    assert dora.params_trainable - lora.params_trainable == magnitudes
    assert _comp(dora, "lora") - _comp(lora, "lora") == magnitudes * 4  # fp32 like the adapters
    # bf16 base, fp32 adapters, no dropout: the bf16 base output + the fp32 LoRA output per token
    extra = _comp(dora, "activations") - _comp(lora, "activations")
    assert extra == spec.num_layers * outs_per_layer * (2 + 4) * 2 * 1024


def _bench():
    spec = importlib.util.spec_from_file_location("memory_accuracy", _BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("precision, total_rel", [("fp32", 0.05), ("bf16", 0.05), ("bf16-mixed", 0.15)])
def test_dora_against_the_live_counter(precision, total_rel, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    b = _bench()

    def with_dora(model, lora):
        return peft.get_peft_model(model, peft.LoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules,
            task_type="CAUSAL_LM", use_dora=True))

    spec = dataclasses.replace(b.ARCHS["llama"], num_layers=2, vocab_size=4096)
    lora_setup = b._s("lora", precision=precision, seq_len=128, micro_batch=2, lora=LORA_QV)
    dora_setup = dataclasses.replace(lora_setup, dora=True)
    lora_measured = b.measure(spec, lora_setup)
    monkeypatch.setattr(b, "_peft", with_dora)
    dora_measured = b.measure(spec, dora_setup)
    lora_pred = estimate_memory(spec, lora_setup).devices[0].tensor_peak_bytes
    dora_pred = estimate_memory(spec, dora_setup).devices[0].tensor_peak_bytes
    # the whole peak as tight as the CPU benchmark holds LoRA itself (autocast LoRA is ~10 % low there)
    assert dora_pred == pytest.approx(dora_measured, rel=total_rel)
    # what DoRA adds, within 5 % of what it really adds
    assert dora_pred - lora_pred == pytest.approx(dora_measured - lora_measured, rel=0.05)


# ---- image tokens -----------------------------------------------------------------------------
def test_qwen2_vl_tokens_per_image():
    spec = resolve_model("qwen2-vl-2b")
    assert tokens_per_image(spec, 448) == (448 // 14) * (448 // 14) // 4 == 256
    assert tokens_per_image(spec, 896) == 1024
    assert tokens_per_image(spec, 0) == spec.vision.tokens_per_image
    assert tokens_per_image(spec, 10) == 4  # at least 56 x 56 pixels (min_pixels 3136)


def test_image_tokens_lengthen_the_language_model_sequence():
    spec = resolve_model("qwen2-vl-2b")
    with_images = estimate_memory(spec, _setup(seq_len=512, image_size=448, images_per_example=2))
    as_text = estimate_memory(spec, _setup(seq_len=512 + 2 * 256))
    # LoRA leaves the vision tower frozen: it saves nothing, the images are 512 more LM tokens
    assert with_images.devices[0].tensor_peak_bytes == as_text.devices[0].tensor_peak_bytes


def test_a_trained_vision_tower_saves_its_activations():
    spec = resolve_model("qwen2-vl-2b")
    v = spec.vision
    kw = dict(method="full", precision="bf16", lora=None, seq_len=512, micro_batch=1, grad_accum=2)
    with_images = estimate_memory(spec, _setup(image_size=448, images_per_example=1, **kw))
    as_text = estimate_memory(spec, _setup(**{**kw, "seq_len": 512 + 256}))
    d, f, patches = v.hidden_size, v.intermediate_size, 1024
    # per patch and block (bf16): 2 LayerNorm inputs, 7 d-wide tensors, logsumexp, 3 MLP-wide ones
    per_block = 2 * (2 * d + 8) + 7 * 2 * d + 4 * v.num_heads + 3 * 2 * f
    merger = 256 * (4 * 2 * d + 3 * 2 * 4 * d)
    tower = patches * v.num_layers * per_block + merger
    assert _comp(with_images, "activations") - _comp(as_text, "activations") == tower


# ---- refusals and the CLI ---------------------------------------------------------------------
@pytest.mark.parametrize("kw, needle", [
    (dict(method="full", lora=None, dora=True), "--dora"),
    (dict(method="dpo", loss="fused"), "--loss fused"),
    (dict(image_size=448, images_per_example=1), "no vision tower"),
    (dict(method="qlora", quant="gptq", dora=True), "do not support DoRA"),
])
def test_refusals_name_the_flag(kw, needle):
    with pytest.raises(BadInputError, match=needle):
        estimate_memory(resolve_model("qwen2.5-0.5b"), _setup(**kw))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", "estimate", *args, "--hardware", "a100-80gb", "--json"],
                          capture_output=True, text=True, timeout=120)


def test_cli_flags():
    std = _cli("qwen2.5-0.5b", "--method", "lora", "--seq-len", "2048")
    fused = _cli("qwen2.5-0.5b", "--method", "lora", "--seq-len", "2048", "--loss", "fused", "--dora")
    vlm = _cli("qwen2-vl-2b", "--method", "qlora", "--quant", "awq", "--image-size", "448")
    assert std.returncode == fused.returncode == vlm.returncode == 0, (std.stderr, fused.stderr, vlm.stderr)
    s, f, v = (json.loads(x.stdout) for x in (std, fused, vlm))
    assert f["setup"]["loss"] == "fused" and f["setup"]["dora"] is True
    assert f["params_trainable"] > s["params_trainable"]
    assert v["setup"]["images_per_example"] == 1 and v["setup"]["quant"] == "awq"
    refused = _cli("qwen2.5-0.5b", "--image-size", "448")
    assert refused.returncode == 2 and "--image-size" in refused.stderr and "Traceback" not in refused.stderr
    bad = _cli("qwen2.5-0.5b", "--loss", "fast")
    assert bad.returncode == 2 and "--loss" in bad.stderr
