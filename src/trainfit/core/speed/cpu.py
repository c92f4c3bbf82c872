"""Step time of eager PyTorch training on a CPU: the terms a profile of a real step shows.

On a GPU a training step is FLOPs at a tensor-core efficiency plus a few memory-bound kernels.
On a CPU the GEMMs are only part of the step; `torch.profiler` over the steps of
bench/step_time_accuracy.py shows six other costs, each costed here by its own term:

    gemm         linear layers (incl. the LM head) at a fraction of the measured matmul peak
                 that falls for thin matrices (narrow models, few tokens per micro-batch)
    attention    the SDPA kernel (flash-style, per head): small head_dim tiles and short
                 sequences reach a much lower rate than GEMMs
    elementwise  norms, rotary, activations, residual adds, autocast casts: bytes / bandwidth,
                 from cache when a layer's activations fit in it, else from DRAM
    vocabulary   logits, log-softmax and their gradients over the whole vocabulary
    dispatch     every eager op (and its autograd node) costs host time whatever its size
    first touch  glibc hands allocations above its mmap threshold to the kernel and unmaps
                 them on free, so each step's big tensors (vocab-sized logits, embedding and
                 LM-head gradients, AdamW's sqrt/div temporaries) page-fault again and are
                 zeroed page by page; `ru_minflt` per step matches these tensors
    optimizer    torch's single-tensor AdamW on CPU: 8 kernels per parameter tensor

Constants were measured on the reference machine (AMD EPYC Zen 4, 2 cores, 32 MiB L3, torch
2.13 CPU, in a Firecracker VM) by micro-benchmarks of each op family; the five that
bench/step_time_accuracy.py --calibrate names (FITTED there) were then refined on the even rows
of that benchmark, the odd rows held out (bench/results/step_time_accuracy.md). The terms for
families beyond Llama (Gemma-2 soft-capping, MoE routing) are counted from transformers' code and
the emulated 16-bit GEMM shares timed on a 2-core AVX2 EPYC without bf16 instructions; none of
them is fitted to the benchmark rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory import model_dropout
from trainfit.core.memory.activations import attention_kind
from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed import flops as F
from trainfit.core.speed.optimizer_traffic import OPTIMIZER_BYTES, OPTIMIZER_PASSES
from trainfit.core.speed.rates import DeviceRates

# GEMM rate reached by torch (oneDNN) relative to the profile's measured peak. The fp32 peak is a
# numpy/OpenBLAS 2048^3 matmul that torch's training GEMMs do not reach (165 vs 200 GFLOP/s over
# 60 shapes of 64..1024 x 64..16384); the bf16 peak is torch's own matmul (~400 GFLOP/s).
CPU_GEMM_CEILING = {"fp32": 0.84, "bf16": 1.0, "fp16": 0.84}  # fitted (micro-benchmark: 0.80 / 0.95)
# Width (hidden size) at which the GEMM rate is half its ceiling: fp32 64-wide matrices reach
# ~0.75 of the rate of 512-wide ones; bf16 kernels need wider tiles (128-wide: 0.7 of 512-wide).
# The token dimension follows rates.half_tokens (64 rows: 0.75 of the rate of 512 rows).
CPU_GEMM_HALF_HIDDEN = {"fp32": 16.0, "bf16": 64.0, "fp16": 64.0}
# Which rate the fp32 GEMMs (and SDPA) are read from: "numpy_peak", the profile's numpy matmul peak x
# the ceiling fitted on the reference CPU; or "torch_training", torch's own fp32 training matmul as
# the default CPU measurement times it (hardware.benchmark.cpu_training_gemm_gflops, the shapes below
# the same as there), where it was measured. How close torch's GEMMs (oneDNN / MKL / its own kernels)
# come to numpy's BLAS depends on the CPU and the libraries (0.8 on the reference EPYC, the fitted
# ceiling), so the second generalises by construction; but it is not the default until a quiet run of
# bench/step_time_accuracy.py shows it closer (each run reports both: `error_numpy_basis` /
# `error_torch_basis`). Timed on a heavily shared 2-core Xeon (one thread, CPU time, a confounded
# proxy), the torch basis predicted 30-45 % too fast where the numpy one was 17 % too fast.
CPU_FP32_GEMM_BASIS = "numpy_peak"
CPU_TRAINING_GEMM_TOKENS = 512
CPU_TRAINING_GEMM_WIDTH = 1024
# A second, narrow measurement (256 wide) sets how fast the rate falls for thin matrices on this CPU:
# the width at half rate solves narrow / wide = s(256) / s(1024) with s(h) = h / (h + half), kept
# within [0, CPU_MAX_HALF_HIDDEN] (noise must not turn a few percent into a cliff).
CPU_TRAINING_GEMM_NARROW_WIDTH = 256
CPU_MAX_HALF_HIDDEN = 1024.0
# The training step's GEMMs against the isolated measured one (fitted by --calibrate where measured).
CPU_TRAINING_GEMM_SHARE = 1.0
# torch's training GEMMs as a share of numpy's peak on the reference machine: the peak SDPA's ceiling
# (fitted there against numpy's peak) is read from when torch's own rate is measured.
CPU_REFERENCE_TORCH_SHARE = 0.84
# SDPA (flash attention for CPU) forward + backward reaches ceiling x s / (s + half) of the fp32
# peak: fitted on timings of head_dim 32..128, seq 128..1024 (39 GFLOP/s at s=256, 79 at 1024).
CPU_ATTENTION_CEILING = 0.49  # fitted (micro-benchmark: 0.5)
CPU_ATTENTION_HALF_SEQ = 300.0
# 16-bit SDPA converts its tiles to fp32 and back; below this head_dim the conversions dominate
# (bf16 / fp32 rate: 0.56 at head_dim 32, seq 128; ~1.0 at head_dim 64..128).
CPU_ATTENTION_16BIT_FULL_HEAD_DIM = 64
# Elementwise bandwidth as a multiple of the profile's figure (a one-thread numpy copy of
# 256 MiB: 25 GB/s here). Streaming from DRAM on every core: in-place mul_ over 64 MiB runs at
# 55 GB/s (2.2x). From cache (tensors of 0.25-16 MiB): 125-250 GB/s (5-10x).
CPU_DRAM_BANDWIDTH_FACTOR = 2.2
CPU_ELEMENTWISE_BANDWIDTH_FACTOR = 6.0  # fitted (micro-benchmark: 5-10)
# A layer's activations stay in cache while an op's operands (~3 tensors) fit in half of it
# (out-of-place mul: 96 GB/s at 3 x 4 MiB, 30-38 GB/s at 3 x 8-16 MiB with a 32 MiB L3).
CPU_CACHE_SHARE = 0.5
# Host time per eager op incl. its autograd node and the views around it, seconds (fitted; a
# 1024-element mul alone takes 1.3-3 us, and a Llama layer runs ~10 trivial ops per counted op).
CPU_OP_SECONDS = 12.6e-6
# Eager ops per decoder layer in the forward (HF Llama block: 2 RMSNorms x 7, rotary 12,
# attention reshapes 8, 7 linears, SiLU-gate 2, residuals 2); backward runs ~1.5x as many.
CPU_OPS_PER_LAYER_FORWARD = 45
CPU_OPS_BACKWARD_FACTOR = 1.5
# First touch of a fresh page: fault + zeroing, per byte (1.4-2.1 us per 4 KiB page measured by
# writing fresh 32-64 MiB tensors; slow because the VM's pages fault in the hypervisor too).
CPU_FIRST_TOUCH_SECONDS_PER_BYTE = 1.8e-6 / 4096
# glibc's malloc serves blocks above its mmap threshold with mmap and unmaps them on free; the
# threshold adapts upwards to the largest block freed, capped at 32 MiB on 64-bit
# (DEFAULT_MMAP_THRESHOLD_MAX, mallopt(3)): tensors this large are fresh pages at every step.
# Below the cap it depends on the heap's history (and heap-top trimming at 2x the threshold):
# 8-32 MiB vocab-sized tensors faulted 0 to 4 of 4 per step (ru_minflt), fitted on average.
CPU_FRESH_ALLOCATION_BYTES = 32 * 2**20
CPU_PARTLY_FRESH_BYTES = 8 * 2**20
CPU_PARTLY_FRESH_FRACTION = 0.25  # fitted
# torch.optim.AdamW on CPU (foreach and fused are CUDA defaults): per parameter tensor mul_
# (decay), lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_: 8 kernels, 80 bytes per parameter,
# two of them (sqrt, div) allocating fresh fp32 temporaries.
CPU_ADAMW_OPS_PER_TENSOR = 8
CPU_ADAMW_BYTES_PER_PARAM = 80.0
CPU_ADAMW_TEMPORARIES = 2
CPU_OPTIMIZER_OPS_PER_TENSOR = 6  # other optimizers (bytes from optimizer_traffic.OPTIMIZER_BYTES)
# Vocabulary-sized tensors of the causal-LM loss (HF ForCausalLMLoss): logits, log_softmax,
# nll_loss grad, log_softmax grad in fp32; under autocast the 16-bit logits and their gradient
# add two. Each is written once and read about twice (max/sum passes, the LM-head backward).
CPU_VOCAB_FP32_TENSORS = 4
CPU_VOCAB_16BIT_TENSORS = 2
CPU_VOCAB_PASSES = 3.0
# Gemma-2 soft-caps its final logits, cap * tanh(logits / cap) (final_logit_softcapping 30 in
# its config): div, tanh, mul in the forward and their three gradients in the backward, six more
# vocabulary-sized fp32 tensors, each fresh pages at 256k x tokens x 4 B. Its attention scores are
# capped the same way (attn_logit_softcapping 50, eager attention): six score-sized passes.
# Counted from transformers' Gemma2ForCausalLM / eager_attention_forward; on the benchmark the two
# Gemma-2 rows (256k vocabulary, 128 wide) missed by -40 % / -46 % without these terms.
CPU_SOFTCAP_VOCAB_TENSORS = 6
CPU_SOFTCAP_SCORE_PASSES = 6
# Mixture-of-experts in eager transformers (MixtralExperts / MixtralTopKRouter): the router runs
# ~12 small ops per layer (linear, softmax, topk, normalise, one_hot, permute, sum, nonzero...),
# then every expert hit ~14 (where, gather the tokens, select the expert's slice of the 3-D weight,
# two linears, chunk, activation, mul, routing weight gather and mul, index_add_).
CPU_MOE_ROUTER_OPS = 12
CPU_MOE_OPS_PER_EXPERT = 14
# 16-bit matmuls on a CPU without bf16 instructions (the profile's bf16 rate below its fp32 one):
# the measured rate (hardware.benchmark.cpu_autocast_bf16_gflops) is forward + input-gradient +
# weight-gradient of one linear, and almost all of it is the input gradient. Timed on the
# 2-core AVX2 EPYC (torch 2.13, autocast bf16, tokens x in x out = 256 x 512 x 512): forward
# 18.5, input gradient 1.3, weight gradient 19.2 GFLOP/s, i.e. shares 0.06 / 0.88 / 0.06 of the
# benchmark's time (over 6 shapes 128..1024 tokens, 128..16384 wide: forward 9-18, input
# gradient 0.8-2.5, weight gradient 7-24 GFLOP/s). A frozen (LoRA) weight still needs the input
# gradient, and a recomputed forward is cheap, so the FLOP count alone misstates both. The
# emulated kernels show no tile-shape ramp (128-wide as fast as 512-wide): no width/token factor.
CPU_EMULATED_16BIT_SHARES = {"forward": 0.06, "input_grad": 0.88, "weight_grad": 0.06}
# The model's own dropout (core/memory/model_dropout.py): torch's CPU dropout draws its Bernoulli
# noise from a random-number generator (then scales it and multiplies), so a forward costs the
# profile's measured ns per element (hardware.benchmark.cpu_dropout_ns_per_element) and the
# backward multiplies the gradient by the noise (3 tensors streamed). Timed on the reference machine
# (2-core AMD EPYC, torch 2.13, fp32): 9-19 ns per element as the VM's speed varies, the Bernoulli
# draw nearly all of it; inside SDPA's math path a 0.1 attention dropout adds 10.1-10.7 ns per score
# against 9.3-9.8 for F.dropout's forward + backward alone (bench/dropout_speed_cpu.py times whole
# steps). Without a measurement, the middle of that range.
CPU_DROPOUT_SECONDS_UNMEASURED = 12e-9


@dataclass(frozen=True)
class CpuStep:
    """Seconds of one micro-batch (forward + backward) and of the once-per-step work."""

    gemm_seconds: float
    attention_seconds: float
    elementwise_seconds: float
    vocabulary_seconds: float
    dispatch_seconds: float
    first_touch_seconds: float  # per micro-batch: activations, logits
    step_first_touch_seconds: float  # per optimizer step: gradients, optimizer temporaries
    optimizer_seconds: float
    dropout_seconds: float = 0.0  # per micro-batch: the model's dropout drawing its masks

    @property
    def micro_seconds(self) -> float:
        return (self.gemm_seconds + self.attention_seconds + self.elementwise_seconds
                + self.vocabulary_seconds + self.dispatch_seconds + self.first_touch_seconds + self.dropout_seconds)


def trainable_tensors(spec: ModelSpec, setup: TrainingSetup) -> list[tuple[float, int]]:
    """(elements, count) of every trainable parameter tensor: what the optimizer walks over."""
    from trainfit.core.models.params import canonical_targets, linear_layers, lora_targets

    lora = setup.lora if setup.trains_adapters else None
    if lora is not None:
        adapted = lora_targets(spec, canonical_targets(lora.target_modules))
        return [(float(lora.rank * x.in_features), x.count) for x in adapted] + [
            (float(lora.rank * x.out_features), x.count) for x in adapted
        ]
    if setup.method == "inference":
        return []
    tensors = [(float(spec.vocab_size * spec.hidden_size), 1), (float(spec.hidden_size), 2 * spec.num_layers + 1)]
    for x in linear_layers(spec):
        if x.kind == "lm_head" and spec.tie_embeddings:
            continue
        tensors.append((float(x.in_features * x.out_features), x.count))
        if x.bias:
            tensors.append((float(x.out_features), x.count))
    return tensors


def fresh_bytes(tensor_bytes: float, count: float) -> float:
    """Bytes that page-fault when `count` tensors of `tensor_bytes` are allocated (see above)."""
    if tensor_bytes >= CPU_FRESH_ALLOCATION_BYTES:
        return tensor_bytes * count
    if tensor_bytes >= CPU_PARTLY_FRESH_BYTES:
        return tensor_bytes * count * CPU_PARTLY_FRESH_FRACTION
    return 0.0


def stream_seconds(nbytes: float, working_set_bytes: float, rates: DeviceRates) -> float:
    """Time to stream `nbytes` through ops whose operands together take `working_set_bytes`: the
    share of the working set that fits in the cache runs at cache speed, the rest at DRAM's."""
    dram = rates.memory_bandwidth_bytes_per_s * CPU_DRAM_BANDWIDTH_FACTOR
    cache = rates.memory_bandwidth_bytes_per_s * CPU_ELEMENTWISE_BANDWIDTH_FACTOR
    cached = min(1.0, rates.cache_bytes * CPU_CACHE_SHARE / max(working_set_bytes, 1.0))
    return nbytes * (cached / cache + (1.0 - cached) / dram)


def emulated_gemm_seconds(sf: F.StepFlops, attn_fwd: float, gemm_flops: float, peak_flops: float) -> float:
    """GEMM seconds on the emulated 16-bit path: forward, input-gradient and weight-gradient
    matmuls at their own shares of the measured training-matmul rate (CPU_EMULATED_16BIT_SHARES)."""
    shares = CPU_EMULATED_16BIT_SHARES
    forward = max(sf.forward_flops - attn_fwd, 0.0)
    backward = min(max(sf.backward_flops - 2.0 * attn_fwd, 0.0), gemm_flops)
    input_grad = min(forward, backward)  # every linear's input gradient, frozen weights included
    weight_grad = backward - input_grad
    other_forward = max(gemm_flops - backward, 0.0)  # forward, recompute and reference passes
    # peak_flops is 3 matmuls' FLOPs over their summed time: each share of that time per FLOP.
    return 3.0 * (other_forward * shares["forward"] + input_grad * shares["input_grad"]
                  + weight_grad * shares["weight_grad"]) / peak_flops


def gemm_shape_factor(precision: str, hidden: float, tokens: float, half_tokens: float,
                      half_hidden: float | None = None) -> float:
    """Share of a large GEMM's rate reached by a model `hidden` wide on `tokens` rows (thin tiles)."""
    if half_hidden is None:
        half_hidden = CPU_GEMM_HALF_HIDDEN.get(precision, CPU_GEMM_HALF_HIDDEN["fp32"])
    return hidden / (hidden + half_hidden) * tokens / (tokens + half_tokens)


def measured_half_hidden(rates: DeviceRates) -> float:
    """The width at half rate from torch's wide and narrow training-matmul rates (see above); the
    reference CPU's where the narrow one was not measured."""
    wide, narrow = rates.training_gemm_flops, rates.training_gemm_narrow_flops
    if not wide or not narrow:
        return CPU_GEMM_HALF_HIDDEN["fp32"]
    q, n, w = narrow / wide, CPU_TRAINING_GEMM_NARROW_WIDTH, CPU_TRAINING_GEMM_WIDTH
    if q >= 1.0:
        return 0.0
    if q * w <= n:
        return CPU_MAX_HALF_HIDDEN
    return min(CPU_MAX_HALF_HIDDEN, n * w * (1.0 - q) / (q * w - n))


def torch_fp32_peak(rates: DeviceRates) -> float:
    """The fp32 peak the model's ceilings apply to: numpy's measured peak, or on the torch basis (where
    torch's own training matmul was measured), the peak that makes the GEMM curve pass through that
    measurement. SDPA's tiles run on torch's GEMMs too, so attention follows the same basis."""
    if not _torch_basis(rates):
        return rates.peak_flops["fp32"]
    # the reference machine's relation of the two (its shape curve), so its attention stays as fitted
    at_measured = gemm_shape_factor("fp32", CPU_TRAINING_GEMM_WIDTH, CPU_TRAINING_GEMM_TOKENS, rates.half_tokens)
    return rates.training_gemm_flops / (CPU_REFERENCE_TORCH_SHARE * at_measured)


def _torch_basis(rates: DeviceRates) -> bool:
    return CPU_FP32_GEMM_BASIS == "torch_training" and bool(rates.training_gemm_flops)


def _at_measured_shape(rates: DeviceRates) -> float:
    return gemm_shape_factor("fp32", CPU_TRAINING_GEMM_WIDTH, CPU_TRAINING_GEMM_TOKENS, rates.half_tokens,
                             measured_half_hidden(rates))


def gemm_flops_per_second(rates: DeviceRates, precision: str, peak_flops: float, hidden: int, tokens: int) -> float:
    """The training GEMMs' rate: fp32 where torch's training matmul was measured, that rate carried
    from its shape to this one; else the ceiling and shape terms applied to `peak_flops`."""
    if precision == "fp32" and _torch_basis(rates):
        shape = gemm_shape_factor("fp32", hidden, tokens, rates.half_tokens, measured_half_hidden(rates))
        return rates.training_gemm_flops * CPU_TRAINING_GEMM_SHARE * shape / _at_measured_shape(rates)
    shape = gemm_shape_factor(precision, hidden, tokens, rates.half_tokens)
    return peak_flops * CPU_GEMM_CEILING.get(precision, CPU_GEMM_CEILING["fp32"]) * shape


def cpu_step(spec: ModelSpec, setup: TrainingSetup, rates: DeviceRates, sf: F.StepFlops, precision: str,
             peak_flops: float) -> CpuStep:
    """Cost every term of one training step of `setup` on the CPU described by `rates`."""
    tokens, seq, layers, h = sf.tokens, setup.seq_len, spec.num_layers, spec.hidden_size
    act_bytes = 4.0 if precision == "fp32" else 2.0
    full_ckpt = setup.grad_checkpointing == "full"
    ref_tokens = tokens if sf.reference_flops else 0
    tensors = trainable_tensors(spec, setup)
    lora_modules = sum(c for _, c in tensors) / 2 if setup.lora is not None else 0

    # Attention core: forward, 2x in backward, again when recomputed, once for a DPO reference.
    attn_fwd = F.attention_core_flops_per_token(spec, seq, F.causal_skip(setup)) * tokens
    attn_passes = 3.0 + (1.0 if setup.grad_checkpointing in ("full", "selective") else 0.0)
    attn_flops = attn_fwd * attn_passes + (attn_fwd if ref_tokens else 0.0)
    context = min(seq, spec.sliding_window or seq)
    attn_rate = torch_fp32_peak(rates) * CPU_ATTENTION_CEILING * context / (context + CPU_ATTENTION_HALF_SEQ)
    if precision != "fp32":
        attn_rate *= min(1.0, spec.head_dim / CPU_ATTENTION_16BIT_FULL_HEAD_DIM)
    gemm_s = _cpu_gemm_seconds(spec, rates, sf, precision, peak_flops, attn_fwd, attn_flops, full_ckpt)

    ffn = F.active_ffn_width(spec)
    elementwise_s, dropout_s, casts = _cpu_elementwise(spec, setup, rates, precision, tokens, ref_tokens, context,
                                                       ffn, lora_modules)
    vocabulary_s, fresh = _cpu_vocabulary(spec, rates, precision, tokens, ref_tokens)
    # Activations saved for backward: the widest per-layer tensors (MLP gate/up/product, hidden).
    fresh += layers * (fresh_bytes(tokens * ffn * act_bytes, 3) + fresh_bytes(tokens * h * act_bytes, 6))

    passes = 1.0 + CPU_OPS_BACKWARD_FACTOR + (1.0 if full_ckpt else 0.0)
    per_layer = CPU_OPS_PER_LAYER_FORWARD
    if spec.num_experts > 0:  # every expert is hit once a micro-batch has a few tokens per expert
        per_layer += CPU_MOE_ROUTER_OPS + CPU_MOE_OPS_PER_EXPERT * min(spec.num_experts, tokens * spec.experts_per_token)
    ops = (per_layer * layers + 4 * lora_modules + casts) * passes  # LoRA: A, B, scale, add
    dispatch_s = ops * CPU_OP_SECONDS

    optimizer_s, step_fresh = _cpu_optimizer(setup, rates, tensors)
    # The fresh-page cost measured on this machine where it was (a VM's faults also run in the hypervisor).
    touch_per_byte = (rates.first_touch_seconds_per_byte if rates.first_touch_seconds_per_byte is not None
                      else CPU_FIRST_TOUCH_SECONDS_PER_BYTE)
    return CpuStep(
        gemm_seconds=gemm_s,
        attention_seconds=attn_flops / attn_rate,
        elementwise_seconds=elementwise_s,
        vocabulary_seconds=vocabulary_s,
        dispatch_seconds=dispatch_s,
        first_touch_seconds=fresh * touch_per_byte,
        step_first_touch_seconds=step_fresh * touch_per_byte,
        optimizer_seconds=optimizer_s,
        dropout_seconds=dropout_s,
    )


def _cpu_gemm_seconds(spec: ModelSpec, rates: DeviceRates, sf: F.StepFlops, precision: str, peak_flops: float,
                      attn_fwd: float, attn_flops: float, full_ckpt: bool) -> float:
    """Seconds of the step's matmuls (every FLOP but the attention core's)."""
    h, tokens = spec.hidden_size, sf.tokens
    gemm_rate = gemm_flops_per_second(rates, precision, peak_flops, h, tokens)
    gemm_flops = sf.total_flops - attn_flops
    if full_ckpt:
        # Checkpointing wraps the decoder layers only: the LM head is not run again (step_flops
        # counts a whole forward as recompute, which the GPU calibration was fitted with).
        gemm_flops -= 2.0 * h * spec.vocab_size * tokens
    if precision == "bf16" and peak_flops < rates.peak_flops.get("fp32", 0.0):
        return emulated_gemm_seconds(sf, attn_fwd, max(gemm_flops, 0.0), peak_flops)
    return max(gemm_flops, 0.0) / gemm_rate


def _cpu_elementwise(spec: ModelSpec, setup: TrainingSetup, rates: DeviceRates, precision: str, tokens: int,
                     ref_tokens: int, context: int, ffn: float, lora_modules: float
                     ) -> tuple[float, float, float]:
    """(elementwise s, dropout s, autocast casts per pass): the memory-bound traffic of a step."""
    seq, layers, h = setup.seq_len, spec.num_layers, spec.hidden_size
    act_bytes = 4.0 if precision == "fp32" else 2.0
    full_ckpt = setup.grad_checkpointing == "full"
    mixed = precision != "fp32" and setup.precision.endswith("mixed")
    # Elementwise traffic, in forward-equivalent passes: forward 1 + backward 2 (+1 recompute).
    per_token_layer = F.elementwise_elements_per_token_layer(spec, setup.torch_compile) * act_bytes
    fwd_equiv = 3.0 + (1.0 if full_ckpt else 0.0)
    elem_bytes = per_token_layer * layers * (tokens * fwd_equiv + ref_tokens)
    # The path that runs (T5's trainable bias and MQA falcon fall back to SDPA's math path; so does attention
    # dropout on a CPU), which materialises the scores as eager attention does.
    kind = attention_kind(spec, setup)
    scores_materialised = kind == "eager" or model_dropout.sdpa_math_fallback(spec, setup, kind)
    if scores_materialised:
        # The full s x s score matrix is written, softmaxed and read back (fp32 softmax in HF).
        score_passes = 3.0 + (CPU_SOFTCAP_SCORE_PASSES if spec.capabilities.attention_softcap else 0.0)
        elem_bytes += score_passes * 8.0 * layers * spec.num_heads * min(seq, context) * tokens
    # The model's own dropout: masks drawn in every forward (and recompute), applied again in backward.
    dropped = model_dropout.dropped_elements_per_token(spec, setup, scores_materialised) * (tokens + ref_tokens)
    draw_s = rates.dropout_seconds_per_element or CPU_DROPOUT_SECONDS_UNMEASURED
    dropout_s = dropped * (2.0 if full_ckpt else 1.0) * draw_s
    elem_bytes += dropped * 3.0 * act_bytes
    weight_passes = 1.0 + (1.0 if full_ckpt else 0.0) + (1.0 if ref_tokens else 0.0)
    casts = 0.0  # autocast ops casting an fp32 activation to 16 bit (and its gradient back)
    if mixed:
        # Weights are cast once per forward (autocast caches leaf casts); inputs at every linear
        # fed from the fp32 residual stream (all but o_proj and down_proj) and every LoRA A.
        elem_bytes += weight_passes * F.matmul_params_stored(spec) * (4.0 + 2.0)
        casts = (len(F.layer_linear_dims(spec)) - 2) * layers + lora_modules
        elem_bytes += casts * tokens * h * (4.0 + 2.0) * (2.0 + (1.0 if full_ckpt else 0.0))
    if setup.quant in ("nf4", "nf4-dq", "int8"):
        # Quantised weights are dequantised to 16 bit before every use: read packed, write bf16.
        packed = 1.0 if setup.quant == "int8" else 0.5625
        elem_bytes += (weight_passes + 1.0) * F.matmul_params_stored(spec) * (packed + 2.0)
    # An op's operands: about three tensors as wide as the widest activation of a layer.
    return stream_seconds(elem_bytes, 3.0 * tokens * max(h, ffn) * act_bytes, rates), dropout_s, casts


def _cpu_vocabulary(spec: ModelSpec, rates: DeviceRates, precision: str, tokens: int, ref_tokens: int
                    ) -> tuple[float, float]:
    """(seconds, fresh bytes) of the logits and the loss over every vocab entry of every token."""
    n16 = CPU_VOCAB_16BIT_TENSORS if precision != "fp32" else 0
    n32 = CPU_VOCAB_FP32_TENSORS + (CPU_SOFTCAP_VOCAB_TENSORS if spec.capabilities.logit_softcap else 0)
    vocab_tensor = spec.vocab_size * tokens * 4.0
    vocab_bytes = (n32 + n16 / 2) * vocab_tensor * CPU_VOCAB_PASSES
    vocab_bytes += 2.0 * vocab_tensor if ref_tokens else 0.0  # reference logits and log-softmax
    vocabulary_s = stream_seconds(vocab_bytes, 3.0 * vocab_tensor, rates)
    return vocabulary_s, fresh_bytes(vocab_tensor, n32) + fresh_bytes(vocab_tensor / 2, n16)


def _cpu_optimizer(setup: TrainingSetup, rates: DeviceRates, tensors: list[tuple[float, int]]) -> tuple[float, float]:
    """(optimizer s, fresh bytes) once per optimizer step: the big gradients are fresh pages
    (zero_grad frees them), then the optimizer walks every trainable tensor."""
    grad_bytes = 2.0 if setup.precision in ("bf16", "fp16") else 4.0
    step_fresh = sum(fresh_bytes(n * grad_bytes, c) for n, c in tensors)
    optimizer_s = 0.0
    if tensors:
        if setup.optimizer == "adamw":
            step_fresh += sum(fresh_bytes(n * 4.0, c * CPU_ADAMW_TEMPORARIES) for n, c in tensors)
            per_param, per_tensor = CPU_ADAMW_BYTES_PER_PARAM, CPU_ADAMW_OPS_PER_TENSOR
        else:
            per_param = OPTIMIZER_BYTES[setup.optimizer] * OPTIMIZER_PASSES["cpu"]
            per_tensor = CPU_OPTIMIZER_OPS_PER_TENSOR
        for n, c in tensors:  # a tensor's param, grad and two states (16 B/param) stream together
            optimizer_s += c * (stream_seconds(n * per_param, n * 16.0, rates) + per_tensor * CPU_OP_SECONDS)
    return optimizer_s, step_fresh
