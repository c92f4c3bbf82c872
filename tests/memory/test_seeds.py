"""The seeds' memory figures, reproduced (or their discrepancy explained). GB in the seeds read as 10^9."""

import pytest

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.memory import estimate_memory
from trainfit.core.models.catalog import get_model
from trainfit.core.setup import LoraSettings, TrainingSetup

GB = 1e9
GIB = 2**30  # GPU memory sizes ("8GB card", "40GB A100") are binary


def _total(model, **kw):
    return estimate_memory(get_model(model), TrainingSetup(**kw)).devices[0].total_bytes


def _needed(model, **kw):
    """What the run needs on the card (the fit verdict's figure: the allocator's cache cut to what
    survives its free-and-retry); a guide's "from 8 GB" is that, not the free-running total."""
    return estimate_memory(get_model(model), TrainingSetup(**kw)).devices[0].needed_bytes


def test_seed004_qwen25_05b_full_fits_t4():
    """Seed 004: 'Qwen2.5-0.5B full: ~10GB, fits t4-small (16 GB)'. Assumed: bf16 autocast,
    AdamW, micro-batch 4 (the seed's batch 4-8), seq 512, SDPA. The seed's 20 B/param rule gives 10 GB;
    it ignores the 151,936-word vocabulary: the fp32 loss over 2048 tokens alone is 12 B x 2048 x 152k
    = 3.7 GB. The run needs ~15 GB (above the seed's figure) and fits the T4 (the verdict agrees). With
    room to spare the caching allocator would hold more (the optimizer step's temporaries beside the
    loss's cached blocks: ~17 GB), so on the T4 it runs at its limit, freeing its cache."""
    model = get_model("Qwen/Qwen2.5-0.5B")
    est = estimate_memory(model, TrainingSetup(micro_batch=4, seq_len=512), resolve_hardware("t4"))
    gpu = est.devices[0]
    assert est.fits and gpu.fits_under_pressure
    assert 10 * GB <= gpu.needed_bytes <= 16 * GIB < gpu.total_bytes


def test_seed004_qwen25_15b_lora_about_6gb():
    """Seed 004: 'Qwen2.5-1.5B LoRA ~6GB fits t4'. Assumed: r=16 on q,k,v,o, bf16 base (pure bf16,
    fp32 adapters), micro-batch 2, seq 512, checkpointing on. Tolerance 35 %."""
    total = _total("Qwen/Qwen2.5-1.5B", method="lora", precision="bf16", micro_batch=2, seq_len=512,
                   grad_checkpointing="full", lora=LoraSettings())
    assert total == pytest.approx(6 * GB, rel=0.35)


def test_seed004_qwen25_7b_lora_on_a10g():
    """Seed 004: 'Qwen2.5-7B LoRA ~28GB fits a10g-large (24 GB)' is self-contradictory: 28 > 24.
    The 4 B/param rule counts fp32 weights. With a bf16 base (15.2 GB of weights), r=16, micro-batch 1,
    seq 512 and gradient checkpointing it does fit 24 GB; with fp32 base (mixed precision) it does not."""
    hw = resolve_hardware("a10g")
    spec = get_model("Qwen/Qwen2.5-7B")
    bf16 = TrainingSetup(method="lora", precision="bf16", micro_batch=1, seq_len=512, grad_checkpointing="full",
                         lora=LoraSettings())
    assert estimate_memory(spec, bf16, hw).fits
    fp32_base = TrainingSetup(method="lora", precision="bf16-mixed", micro_batch=1, seq_len=512, lora=LoraSettings())
    assert not estimate_memory(spec, fp32_base, hw).fits


def test_seed002_llama3_8b_minimums():
    """Seed 002: Llama 3 8B QLoRA from 8 GB, DPO from 12 GB, inference from 4 GB.
    Assumed: QLoRA nf4-dq r=16 q,k,v,o, micro-batch 1, seq 512, checkpointing: fits 8 GB
    (~6-7 GB predicted). DPO: QLoRA policy with the adapters-off base as reference, batch 1, seq 512,
    checkpointing: under 12 GB. Inference 'from 4 GB' only holds with 4-bit weights (5.5 GB of
    NF4 + 16-bit embeddings/lm_head for the 128k vocabulary): we predict ~6 GB, and say so."""
    q = _needed("meta-llama/Meta-Llama-3-8B", method="qlora", quant="nf4-dq", precision="bf16", seq_len=512,
                grad_checkpointing="full", lora=LoraSettings())
    assert q <= 8 * GIB
    d = _needed("meta-llama/Meta-Llama-3-8B", method="dpo", quant="nf4-dq", precision="bf16", seq_len=512,
               grad_checkpointing="full", lora=LoraSettings(), dpo_reference="lora-base")
    assert q < d <= 12 * GB
    inf = _total("meta-llama/Meta-Llama-3-8B", method="inference", quant="nf4-dq", precision="bf16", seq_len=512,
                 generate_tokens=256)
    assert 4 * GB < inf < 7 * GB


def test_seed002_llama3_70b_qlora_from_40gb():
    """Seed 002: Llama 3 70B QLoRA from 40 GB. Assumed nf4-dq, r=16, batch 1, seq 512, checkpointing.
    NF4 linears are 68.5e9 x 0.516 B = 35.4 GB and the 16-bit embeddings + lm_head (128k vocab) 4.2 GB,
    so the weights alone are ~39.6 GB: a 40 GiB A100 is right at the edge. With the context and the
    allocator slack that survives its free-and-retry (5 %) the run needs ~45 GB (tensor peak ~42 GB;
    ~53 GB with the free-running 25 %): the seed's minimum is optimistic by ~12 %."""
    est = estimate_memory(get_model("meta-llama/Meta-Llama-3-70B"),
                          TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16", seq_len=512,
                                        grad_checkpointing="full", lora=LoraSettings())).devices[0]
    assert 39 * GB <= est.tensor_peak_bytes <= 45 * GB
    assert est.needed_bytes == pytest.approx(40 * GB, rel=0.2)
    assert est.tensor_peak_bytes < est.needed_bytes < est.total_bytes


def test_seed003_qwen2_vl_2b_breakdown():
    """Seed 003 table for Qwen2-VL-2B: weights ~8 GB, optimizer ~16 GB, gradients ~8 GB, total ~18 GB per GPU
    under ZeRO-2 on 2 GPUs. The rows use fp32 (4 B/param x 2.2B = 8.8 GB) and do not add up (8+16+8+4 = 36
    != 18): the 18 matches ZeRO-2 sharding of optimizer + gradients over 2 GPUs. We predict, per GPU, 2 B weights
    + (12+4) B/2 sharded states + activations for batch 1, seq 1024: ~ 2*2.2 + 8*2.2 = 22 GB + activations.
    With 4-bit + LoRA the seed says ~5 GB; at seq 1024 the fp32 loss over a 151,936-word vocabulary adds
    1.9 GB and the 16-bit embeddings 0.9 GB that a 4-bit rule of thumb ignores: we predict ~9 GB."""
    spec = get_model("Qwen/Qwen2-VL-2B-Instruct")
    full = estimate_memory(spec, TrainingSetup(zero_stage=2, num_gpus=2, seq_len=1024)).devices[0]
    assert 18 * GB <= full.needed_bytes <= 32 * GB  # what the run needs (free-running it holds more)
    q = estimate_memory(spec, TrainingSetup(method="qlora", quant="nf4-dq", precision="bf16", seq_len=1024,
                                            lora=LoraSettings())).devices[0]
    assert 5 * GB < q.needed_bytes < 10 * GB
