"""Step time of a training (or inference) setup on a device: FLOPs over achievable throughput,
plus memory-bound work, host overhead, optimizer step, offload and communication.

Per micro-batch on one device (kernels run one after another, so the parts add up):
    matmuls      max(FLOPs / (peak x efficiency), weight bytes / bandwidth)   (roofline per GEMM);
                 the attention core of flash / SDPA kernels at its own, lower efficiency
    elementwise  activation bytes (norms, rotary, activations, residuals, logits) / bandwidth
    overhead     kernels launched x per-kernel host overhead
    dequant      QLoRA: NF4 -> bf16 weight traffic at every pass
Per optimizer step: the optimizer reads and writes params + states at memory bandwidth (on the
host when offloaded, with the PCIe copies), and the data-parallel collectives not hidden behind
the backward pass (ring all-reduce 2(n-1)/n; ZeRO-2 reduce-scatter; ZeRO-3 all-gathers in
forward and backward; Rajbhandari et al. 2020, arXiv 1910.02054 §7) - on one node or across
nodes, hybrid sharding included: core/speed/comm.py.
"""

from __future__ import annotations

import math

from trainfit.core.memory import model_dropout
from trainfit.core.memory.activations import attention_kind
from trainfit.core.memory.paged_states import pages_states
from trainfit.core.memory.quant_formats import experts_left_dense
from trainfit.core.memory.stats import model_stats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.runtime import BITSANDBYTES, runtime_of
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed import flops as F
from trainfit.core.speed.cpu import cpu_step
from trainfit.core.speed.comm import MIN_EXPOSED, ZERO3_OVERLAP, communication
from trainfit.core.speed.optimizer_traffic import OPTIMIZER_BYTES, OPTIMIZER_PASSES
from trainfit.core.speed.rates import DeviceRates, compute_precision, device_rates
from trainfit.core.speed.types import Bottleneck, SpeedEstimate, Workload
from trainfit.errors import BadInputError

# Logits: bf16 logits, fp32 upcast, log-softmax and its gradient: bytes per vocab entry per token.
LOGIT_BYTES_TRAIN = 20.0
LOGIT_BYTES_FORWARD = 6.0
# QLoRA: extra time per weight per pass over the weights, as bytes at streaming bandwidth. The
# step-time gap between QLoRA and LoRA at the same shape, where both were published, is ~0.2 s
# per micro-batch for a 7B model and ~0.45 s for 14B on one A100 whatever the sequence length
# (Qwen README, GPTQ int4 base, 256-8192 tokens), and 0.37 s per step for Llama 3.1 8B on an RTX
# 4090 (torchtune README, NF4): 13-18 bytes per weight per pass, where dequantisation moves
# only 2.6 (4-bit read + bf16 write): the lookup / double-dequantised absmax kernels run far
# below streaming bandwidth. bench/published_speed.py checks it on every QLoRA row.
NF4_DEQUANT_BYTES_PER_WEIGHT = 14.0
# Kernels per layer in an eager forward (HF Llama-style block); backward launches ~2x.
KERNELS_PER_LAYER_FORWARD = 40
# Under torch.compile: the 7 projections, attention and ~6 fused elementwise kernels.
KERNELS_PER_LAYER_FORWARD_COMPILED = 16


def _bytes_per_weight(setup: TrainingSetup) -> float:
    if setup.quant in ("nf4", "nf4-dq"):
        return 0.5625  # 4-bit weights + one fp32 absmax per 64 (nf4-dq shrinks that further)
    if setup.quant == "int8":
        return 1.0
    if setup.precision == "fp32":
        return 4.0
    if setup.method in ("full", "pretrain") and setup.precision.endswith("mixed"):
        return 4.0  # AMP keeps fp32 master weights and casts them to 16 bit at every forward
    return 2.0


def _trainable_params(spec: ModelSpec, setup: TrainingSetup) -> float:
    if setup.trains_adapters and setup.lora is not None:
        return F.lora_params_per_token(spec, setup.lora.target_modules, setup.lora.rank)
    if setup.method == "inference":
        return 0.0
    return F.matmul_params_stored(spec)


def _check(setup: TrainingSetup) -> None:
    if setup.micro_batch < 1 or setup.seq_len < 1 or setup.grad_accum < 1 or setup.num_gpus < 1:
        raise BadInputError("micro_batch, seq_len, grad_accum and num_gpus must be at least 1")
    if setup.method in ("lora", "qlora") and setup.lora is None:
        raise BadInputError(f"method {setup.method!r} needs LoRA settings (setup.lora)")


def predict_step(
    spec: ModelSpec,
    setup: TrainingSetup,
    hardware: HardwareProfile | DeviceRates,
    workload: Workload | None = None,
) -> SpeedEstimate:
    """Predict step time, throughput, run time and bottleneck of `setup` for `spec` on `hardware`."""
    _check(setup)
    rates = hardware if isinstance(hardware, DeviceRates) else device_rates(hardware, setup.device)
    notes = list(rates.notes)
    if setup.images_per_example and spec.vision is not None:
        from trainfit.core.memory.vision import image_tokens, with_image_tokens

        # The language model runs over the image tokens too (as the memory model counts them); the
        # vision tower's own FLOPs are not costed (a small share next to the language model's).
        notes.append(f"{image_tokens(spec, setup)} image tokens per example join the {setup.seq_len} text tokens "
                     "(vision tower not timed)")
        setup = with_image_tokens(spec, setup)
    n_dev = max(1, setup.num_gpus) if rates.kind == "gpu" else 1
    if rates.kind == "gpu" and n_dev > rates.count:
        notes.append(f"setup asks for {n_dev} GPUs, the hardware has {rates.count}: predicted for {n_dev} of them")
    if setup.method == "inference":
        return _predict_inference(spec, setup, rates, notes)

    precision = compute_precision(setup.precision, setup.method)
    peak, used = rates.flops_for(precision)
    if used != precision:
        notes.append(f"{rates.name} has no {precision} matmul rate: predicted at {used}")
    sf = F.step_flops(spec, setup)
    if rates.kind == "cpu":
        eff, micro_s, optimizer_s, offload_s, comm_s, parts = _cpu_parts(spec, setup, rates, sf, used, peak)
        if rates.dropout_seconds_per_element is None and model_dropout.dropped_elements_per_token(spec, setup, True):
            notes.append("the model's dropout is costed at a reference CPU's rate (this profile carries no "
                         "dropout measurement: the default one needs torch)")
    else:
        eff, micro_s, optimizer_s, offload_s, comm_s, parts = _gpu_parts(spec, setup, rates, sf, precision, peak, n_dev, notes)
        spill_s = _paged_spill_seconds(spec, setup, rates, notes)
        offload_s += spill_s
        parts["offload"] += spill_s
    data_s = 0.0  # tokenised data is read from RAM / page cache; set by callers that know the disk
    parts["data loading"] = data_s
    step_s = setup.grad_accum * micro_s + optimizer_s + offload_s + comm_s + data_s
    bottleneck: Bottleneck = max(parts, key=parts.get)  # type: ignore[arg-type]
    samples_per_step = setup.micro_batch * setup.grad_accum * n_dev
    tokens_per_step = setup.seq_len * samples_per_step * (2 if setup.method == "dpo" else 1)
    model_flops = F.model_flops_per_token(spec, setup.seq_len) * tokens_per_step
    est = SpeedEstimate(
        model_id=spec.id,
        device=_device_label(rates, n_dev, setup.device),
        compute_precision=used,
        micro_step_seconds=micro_s,
        step_seconds=step_s,
        tokens_per_second=tokens_per_step / step_s,
        samples_per_second=samples_per_step / step_s,
        step_flops=sf.total_flops * setup.grad_accum * n_dev,
        achieved_tflops_per_device=sf.total_flops * setup.grad_accum / step_s / 1e12,
        mfu=model_flops / (peak * n_dev * step_s),
        matmul_efficiency=eff,
        seconds_by_part=parts,
        bottleneck=bottleneck,
        notes=notes,
    )
    return with_workload(est, setup, workload) if workload else est


def _paged_spill_seconds(spec: ModelSpec, setup: TrainingSetup, rates: DeviceRates, notes: list[str]) -> float:
    """Paged optimizer states that do not fit on the card wait in CPU RAM (core.memory.paged_states):
    every optimizer step touches all of them, so the spilled part crosses the host link each step,
    in while the part it displaces goes out. PCIe is full duplex, so the link's per-direction rate
    bounds it from below; the driver's page migration only adds to it (not measured here)."""
    if not pages_states(setup) or rates.profile is None or rates.pcie_bytes_per_s <= 0:
        return 0.0
    from trainfit.core.memory import estimate_memory

    spilled = estimate_memory(spec, setup, rates.profile).devices[0].spilled_bytes
    if not spilled:
        return 0.0
    seconds = spilled / rates.pcie_bytes_per_s
    notes.append(f"paged optimizer: {spilled / 2**30:.2f} GiB of states wait in CPU RAM and cross the host "
                 f"link at every optimizer step (+{seconds:.2f} s)")
    return seconds


def _gpu_parts(
    spec: ModelSpec, setup: TrainingSetup, rates: DeviceRates, sf: F.StepFlops, precision: str, peak: float, n_dev: int,
    notes: list[str] | None = None,
) -> tuple[float, float, float, float, float, dict[str, float]]:
    """GPU: (matmul efficiency, micro-batch s, optimizer s, offload s, communication s, parts)."""
    tokens = sf.tokens
    eff = rates.matmul_efficiency(spec.hidden_size, tokens)
    bw = rates.memory_bandwidth_bytes_per_s * rates.memory_efficiency
    act_bytes = 4.0 if precision == "fp32" else 2.0
    w_bytes = _bytes_per_weight(setup)
    n_stored, n_dense, n_quant, trainable = _gpu_weights(spec, setup)
    if setup.zero_stage >= 3 and n_dev > 1:
        pass  # weights are gathered whole before use: the reads below stay per full model
    # Passes over the weights per micro-batch: forward, backward, recompute, DPO reference.
    passes = 2.0 + (1.0 if setup.grad_checkpointing == "full" else 0.0)
    if sf.reference_flops:
        passes += 1.0
    grad_bytes = 2.0 if setup.precision in ("bf16", "fp16") else 4.0
    weight_traffic = passes * (n_quant * w_bytes + n_dense * 2.0) + 3.0 * trainable * grad_bytes  # + grad accumulate
    gemm_flops, attention_s = _attention_split(spec, setup, rates, sf, peak)
    flops_s = gemm_flops / (peak * eff) + attention_s
    matmul_s = max(flops_s, weight_traffic / bw)

    memory_s = _gpu_elementwise_seconds(spec, setup, sf, bw, act_bytes, passes, n_dense > 0)
    dequant_s = _dequant_seconds(setup, n_quant, w_bytes, passes, bw)
    fwd_equiv = 3.0 + (1.0 if setup.grad_checkpointing == "full" else 0.0)
    per_layer = KERNELS_PER_LAYER_FORWARD_COMPILED if setup.torch_compile else KERNELS_PER_LAYER_FORWARD
    kernels = per_layer * spec.num_layers * fwd_equiv * (1.5 if setup.quant != "none" else 1.0)
    overhead_s = kernels * rates.op_overhead_seconds
    micro_s = matmul_s + memory_s + dequant_s + overhead_s

    optimizer_s, offload_s = _gpu_optimizer_seconds(setup, rates, n_dev, n_stored, trainable, w_bytes, passes,
                                                    micro_s, bw)
    comm_s = _communication_seconds(setup, rates, n_dev, n_stored, trainable, micro_s, sf, notes)

    compute_total = setup.grad_accum * matmul_s
    parts = {
        "compute": compute_total if flops_s >= 0.999 * matmul_s else 0.0,
        "memory bandwidth": setup.grad_accum * (memory_s + dequant_s) + optimizer_s,
        "framework overhead": setup.grad_accum * overhead_s,
        "communication": comm_s,
        "offload": offload_s,
    }
    if parts["compute"] == 0.0:  # the GEMMs themselves were bound by weight reads
        parts["memory bandwidth"] += compute_total
    return eff, micro_s, optimizer_s, offload_s, comm_s, parts


def _gpu_weights(spec: ModelSpec, setup: TrainingSetup) -> tuple[float, float, float, float]:
    """(matmul weights stored, of them left 16-bit, of them quantised, trainable parameters)."""
    n_stored = F.matmul_params_stored(spec)
    # MoE experts bitsandbytes leaves 16-bit (transformers >= 5 fuses them): read at 2 B, never de-quantised.
    n_dense = 0.0
    if spec.num_experts and setup.quant in BITSANDBYTES:
        st = model_stats(spec)
        n_dense = float(st.experts) if experts_left_dense(st, setup) else 0.0
    n_quant = n_stored - n_dense
    return n_stored, n_dense, n_quant, _trainable_params(spec, setup)


def _gpu_elementwise_seconds(spec: ModelSpec, setup: TrainingSetup, sf: F.StepFlops, bw: float, act_bytes: float,
                             passes: float, experts_dense: bool) -> float:
    """Seconds of memory-bound work per micro-batch: elementwise ops, logits, eager scores, dropout."""
    tokens = sf.tokens
    # Elementwise (memory-bound) work. Training runs it ~3x (forward + 2x backward) + recompute.
    # An fp32 residual stream over 4-bit linears (PEFT's k-bit preparation, or autocast's fp32
    # LayerNorm output) runs every norm, residual, rotary and activation in fp32 and casts around
    # each 4-bit linear (core/runtime.py).
    fp32_stream = runtime_of(setup).fp32_stream_over_16bit_weights(spec)
    per_token_layer = _gpu_elementwise_elements(spec, setup.torch_compile) * (4.0 if fp32_stream else act_bytes)
    fwd_equiv = 3.0 + (1.0 if setup.grad_checkpointing == "full" else 0.0)
    ref_tokens = tokens if sf.reference_flops else 0
    elementwise_bytes = per_token_layer * spec.num_layers * (tokens * fwd_equiv + ref_tokens)
    if fp32_stream:
        elementwise_bytes += _stream_cast_bytes(spec, experts_dense) * spec.num_layers * tokens * passes
    logits_bytes = spec.vocab_size * (tokens * LOGIT_BYTES_TRAIN + ref_tokens * LOGIT_BYTES_FORWARD)
    if setup.attention == "eager":
        # The full s x s score matrix is written, softmaxed and read back (fp32 softmax in HF).
        elementwise_bytes += 3.0 * 8.0 * spec.num_layers * spec.num_heads * setup.seq_len * tokens
    # The model's own dropout (fused SDPA / flash draw the attention's inside the kernel): CUDA's
    # native_dropout reads x and writes y and a 1-byte mask, its backward reads the gradient and the
    # mask and writes the gradient; drawn again in a recompute.
    eager = attention_kind(spec, setup) == "eager"
    dropped = model_dropout.dropped_elements_per_token(spec, setup, eager) * (tokens + ref_tokens)
    draws = 2.0 if setup.grad_checkpointing == "full" else 1.0
    elementwise_bytes += dropped * (draws + 1.0) * (2.0 * act_bytes + 1.0)
    return (elementwise_bytes + logits_bytes) / bw


def _dequant_seconds(setup: TrainingSetup, n_quant: float, w_bytes: float, passes: float, bw: float) -> float:
    """Seconds per micro-batch de-quantising the quantised weights before each use."""
    dequant_s = 0.0
    if setup.quant in ("nf4", "nf4-dq"):
        # Every 4-bit weight is dequantised to bf16 before each use (forward, backward, recompute).
        # Measured, this costs far more than the 2.6 bytes it moves: see NF4_DEQUANT_BYTES_PER_WEIGHT.
        # An fp16 QuantState under bf16 compute casts each de-quantised weight once more: read 2 B,
        # write 2 B (Runtime.dequant_copies).
        cast = 4.0 if runtime_of(setup).dequant_copies == 2 else 0.0
        dequant_s = passes * n_quant * (NF4_DEQUANT_BYTES_PER_WEIGHT + cast) / bw
    elif setup.quant == "int8":
        # bitsandbytes int8: read 1 byte, write 2 per weight and use (no published figure to fit).
        dequant_s = passes * n_quant * (w_bytes + 2.0) / bw
    return dequant_s


def _gpu_optimizer_seconds(setup: TrainingSetup, rates: DeviceRates, n_dev: int, n_stored: float, trainable: float,
                           w_bytes: float, passes: float, micro_s: float, bw: float) -> tuple[float, float]:
    """(optimizer s, offload s) per step: the optimizer step on the GPU, or on the host with offload."""
    # Optimizer step, sharded over data-parallel ranks by ZeRO >= 1.
    shard = min(n_dev, setup.shard_group) if setup.zero_stage >= 1 else 1  # hybrid: one node's GPUs
    opt_bytes = trainable * OPTIMIZER_BYTES[setup.optimizer] * OPTIMIZER_PASSES[rates.kind] / shard
    offload_s = 0.0
    if setup.offload != "none" and rates.kind == "gpu":
        # Optimizer on the host (DeepSpeed CPUAdam): host DRAM shared by all ranks; grads down and
        # bf16 params up over each GPU's own PCIe link.
        # Each host updates the shards of its own GPUs: trainable x G / shard group (one node: all).
        host_params = trainable * setup.gpus_per_node / max(1, min(n_dev, setup.shard_group))
        host_s = host_params * OPTIMIZER_BYTES[setup.optimizer] / rates.host_bandwidth_bytes_per_s / 0.6
        pcie_s = trainable / max(1, min(n_dev, setup.shard_group)) * (2.0 + 2.0) / rates.pcie_bytes_per_s
        offload_s = host_s + pcie_s
        optimizer_s = 0.0
        if setup.offload == "optimizer+params":
            # Parameters stream in from host memory at every pass, in their stored width (4-bit
            # QLoRA weights move 0.56 bytes, not 2), prefetched behind compute like ZeRO-3 gathers:
            # published FSDP CPU-offload runs take the time of the same run without offload (2x
            # RTX 4090: Yi-34B QLoRA 2,061 s vs 2,072 s, Llama-2 7B LoRA 482 s vs 481 s; Answer.AI
            # fsdp_qlora benchmarks, bench/data/published_speed.yaml).
            stream = passes * n_stored / n_dev * w_bytes / rates.pcie_bytes_per_s
            offload_s += setup.grad_accum * max(stream - ZERO3_OVERLAP * micro_s, MIN_EXPOSED * stream)
    else:
        optimizer_s = opt_bytes / bw
    return optimizer_s, offload_s


def _stream_cast_bytes(spec: ModelSpec, experts_dense: bool) -> float:
    """Bytes per token per layer, in one pass, of the casts around the block's 4-bit linears under
    an fp32 stream: bitsandbytes' Linear4bit casts its input to the 16-bit compute dtype (read 4 B,
    write 2 B per element) and its output back to the input's fp32 (read 2, write 4); backward
    casts the gradients the same way. MoE experts bitsandbytes leaves 16-bit are not wrapped."""
    dims = F.layer_linear_dims(spec)
    if experts_dense:
        dims = {k: v for k, v in dims.items() if k not in ("gate_proj", "up_proj", "down_proj")}
    return 6.0 * sum((i + o) * c for i, o, c in dims.values())


# flops.ELEMENTWISE_PER_HIDDEN charges each norm ~12h elements: RMSNorm in eager PyTorch is ~6
# kernels (fp32 upcast, pow, mean, rsqrt, mul, cast) - what the CPU benchmark measures. On CUDA,
# torch.nn.functional.layer_norm is one fused kernel forward and one backward (read x, write y:
# ~3h), so each LayerNorm costs ~9h fewer elements. Checked on the LayerNorm (MPT) rows of
# bench/data/published_speed.yaml: small models at short sequences were 20-30 % too slow.
FUSED_LAYERNORM_SAVING_PER_HIDDEN = 9.0


def _gpu_elementwise_elements(spec: ModelSpec, compiled: bool = False) -> float:
    """Elements the memory-bound ops of one layer touch per token on a GPU (forward); compiled, every
    norm is already one fused kernel."""
    elements = F.elementwise_elements_per_token_layer(spec, compiled)
    if spec.norm == "layernorm" and not compiled:
        norms = spec.block_norms or (1 if spec.parallel_attention else 2)
        elements -= FUSED_LAYERNORM_SAVING_PER_HIDDEN * norms * spec.hidden_size
    return elements


# FlashAttention's backward recomputes the score matrix: 5 matmuls against the forward's 2, i.e.
# 2.5 forward-equivalents (Dao 2023, arXiv 2307.08691 §3.1); the FLOP count (flops.py) says 2.
FLASH_BACKWARD_FORWARDS = 2.5


def _attention_split(
    spec: ModelSpec, setup: TrainingSetup, rates: DeviceRates, sf: F.StepFlops, peak: float
) -> tuple[float, float]:
    """(FLOPs left for the GEMMs, seconds of the attention core) of one micro-batch.

    Fused kernels (flash / SDPA) run the attention core at their own efficiency
    (DeviceRates.attention_efficiency) and their backward costs 2.5 forwards; eager attention is
    batched GEMMs and stays with them (its score-matrix traffic is costed as memory)."""
    if not F.causal_skip(setup):
        return sf.total_flops, 0.0
    fwd = F.attention_core_flops_per_token(spec, setup.seq_len, True) * sf.tokens
    reruns = 1.0 if setup.grad_checkpointing in ("full", "selective") else 0.0
    if sf.reference_flops:
        reruns += 1.0
    counted = fwd * (1.0 + 2.0 + reruns)  # what step_flops put in total_flops
    executed = fwd * (1.0 + FLASH_BACKWARD_FORWARDS + reruns)
    return sf.total_flops - counted, executed / (peak * rates.attention_efficiency(setup.seq_len))


def _cpu_parts(
    spec: ModelSpec, setup: TrainingSetup, rates: DeviceRates, sf: F.StepFlops, precision: str, peak: float
) -> tuple[float, float, float, float, float, dict[str, float]]:
    """CPU: the terms of trainfit.core.speed.cpu, grouped into the bottleneck categories."""
    c = cpu_step(spec, setup, rates, sf, precision, peak)
    optimizer_s = c.optimizer_seconds + c.step_first_touch_seconds
    parts = {
        "compute": setup.grad_accum * (c.gemm_seconds + c.attention_seconds + c.dropout_seconds),
        "memory bandwidth": setup.grad_accum * (c.elementwise_seconds + c.vocabulary_seconds + c.first_touch_seconds)
        + optimizer_s,
        "framework overhead": setup.grad_accum * c.dispatch_seconds,
        "communication": 0.0,
        "offload": 0.0,
    }
    eff = sf.total_flops / (peak * (c.gemm_seconds + c.attention_seconds)) if sf.total_flops else 0.0
    return eff, c.micro_seconds, optimizer_s, 0.0, 0.0, parts


def _communication_seconds(
    setup: TrainingSetup, rates: DeviceRates, n: int, n_stored: float, trainable: float, micro_s: float,
    sf: F.StepFlops, notes: list[str] | None = None,
) -> float:
    """Collective time per optimizer step that is not hidden behind compute (core/speed/comm.py:
    volumes per ZeRO stage, hybrid sharding, the inter-node network and the overlap rule)."""
    if n <= 1:
        return 0.0
    network = rates.network_bytes_per_s
    if setup.num_nodes > 1 and network <= 0:
        from trainfit.core.machines.network_catalog import default_network, usable_node_bandwidth_gbps

        net = default_network(rates.architecture, "datacenter" if rates.link_kind == "nvlink" else None,
                              "nvlink" if rates.link_kind == "nvlink" else None)
        network = usable_node_bandwidth_gbps(net.node_bandwidth_gbps(setup.gpus_per_node)) * 1e9
        if notes is not None:
            notes.append(f"{setup.num_nodes} nodes on hardware without a network figure: assumed {net.id}")
    bwd_share = sf.backward_flops / max(sf.total_flops, 1.0)
    result = communication(setup, rates, n_stored=n_stored, trainable=trainable, micro_s=micro_s,
                           bwd_share=bwd_share, network_bytes_per_s=network)
    if result.note and notes is not None:
        notes.append(result.note)
    return result.seconds


# The backend a GPU setup runs on, as the speed line names it: Apple -> "mps", Intel -> "xpu",
# AMD -> "rocm" (PyTorch's ROCm builds still take the device string "cuda"; the label names the
# stack, the run config keeps "cuda" for torch: export/plan_files.py).
DEVICE_LABELS = {"cuda": "cuda", "rocm": "rocm", "mps": "mps", "xpu": "xpu"}


def _device_label(rates: DeviceRates, n: int, device: str = "cuda") -> str:
    if rates.kind == "cpu":
        return f"cpu ({rates.name})"
    return f"{DEVICE_LABELS.get(device, 'cuda')} x{n} ({rates.name})"


def with_workload(est: SpeedEstimate, setup: TrainingSetup, workload: Workload) -> SpeedEstimate:
    """Fill steps per epoch, total steps and run time for a dataset."""
    import dataclasses

    if workload.epochs <= 0:
        raise BadInputError(f"--epochs must be positive, got {workload.epochs}")
    if workload.examples is not None:
        samples = workload.examples
    elif workload.dataset_tokens is not None:
        samples = math.ceil(workload.dataset_tokens / setup.seq_len)
    else:
        raise BadInputError("give --dataset-tokens N or --examples N")
    if samples <= 0:
        raise BadInputError("the dataset must have at least one example / token")
    per_step = setup.micro_batch * setup.grad_accum * max(1, setup.num_gpus if setup.device != "cpu" else 1)
    steps_per_epoch = math.ceil(samples / per_step)
    total_steps = math.ceil(steps_per_epoch * workload.epochs)
    return dataclasses.replace(
        est,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        total_seconds=total_steps * est.step_seconds,
    )


def _predict_inference(spec: ModelSpec, setup: TrainingSetup, rates: DeviceRates, notes: list[str]) -> SpeedEstimate:
    """Prefill is compute-bound; each decode step reads all weights plus the KV cache."""
    precision = compute_precision(setup.precision, setup.method)
    peak, used = rates.flops_for(precision)
    batch = setup.micro_batch
    prompt_tokens = batch * setup.seq_len
    bw = rates.memory_bandwidth_bytes_per_s * rates.memory_efficiency
    w_bytes = _bytes_per_weight(setup)
    weights = F.matmul_params_stored(spec) * w_bytes
    eff_prefill = rates.matmul_efficiency(spec.hidden_size, prompt_tokens)
    prefill_flops = prompt_tokens * (
        2.0 * F.matmul_params_per_token(spec) + F.attention_core_flops_per_token(spec, setup.seq_len, True)
    )
    overhead = KERNELS_PER_LAYER_FORWARD * spec.num_layers * rates.op_overhead_seconds
    prefill_s = max(prefill_flops / (peak * eff_prefill), weights / bw) + overhead
    kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * (4.0 if precision == "fp32" else 2.0)
    gen = max(setup.generate_tokens, 0)
    avg_context = setup.seq_len + gen / 2
    decode_flops = batch * F.decode_flops_per_token(spec, int(avg_context))
    decode_bytes = weights + batch * avg_context * kv_per_token
    eff_decode = rates.matmul_efficiency(spec.hidden_size, batch)
    decode_compute = decode_flops / (peak * eff_decode)
    decode_memory = decode_bytes / bw
    decode_s = max(decode_compute, decode_memory) + overhead
    total = prefill_s + gen * decode_s
    parts = {
        "compute": prefill_s + (gen * decode_compute if decode_compute >= decode_memory else 0.0),
        "memory bandwidth": gen * decode_memory if decode_memory > decode_compute else 0.0,
        "framework overhead": (1 + gen) * overhead,
    }
    bottleneck: Bottleneck = max(parts, key=parts.get)  # type: ignore[arg-type]
    produced = batch * gen if gen else prompt_tokens
    return SpeedEstimate(
        model_id=spec.id,
        device=_device_label(rates, 1, setup.device),
        compute_precision=used,
        micro_step_seconds=total,
        step_seconds=total,
        tokens_per_second=produced / total,
        samples_per_second=batch / total,
        step_flops=prefill_flops + gen * decode_flops,
        achieved_tflops_per_device=(prefill_flops + gen * decode_flops) / total / 1e12,
        mfu=(prefill_flops + gen * decode_flops) / (peak * total),
        matmul_efficiency=eff_prefill,
        seconds_by_part=parts,
        bottleneck=bottleneck,
        prefill_seconds=prefill_s,
        decode_seconds_per_token=decode_s if gen else None,
        notes=notes,
    )
