"""estimate_memory: the per-device memory of one training or inference setup, with its parts.

A training step's components each come from a function of their own (weights, optimizer_states,
gradients, saved_activations, loss, transients: each takes the step's TrainingStep, step.py);
phases.py adds them up per phase of the step and finds the tensor peak, and peak_components.py
names what is alive there. Margins (context, fragmentation, NCCL: overheads.margins) sit on top of
the tensor peak in `total_bytes`; this module assembles the devices and the notes.
"""

from __future__ import annotations

import dataclasses

from trainfit.core.memory.checks import check_setup
from trainfit.core.memory.inference import inference_components
from trainfit.core.memory import dora, quant_formats, vision
from trainfit.core.memory.overheads import cpu_capacity, gpu_capacity, margins, required_bytes
from trainfit.core.memory.paged_states import paged_note, paged_what
from trainfit.core.memory.peak_components import peak_components
from trainfit.core.memory.phases import phase_peaks, training_parts
from trainfit.core.memory.states import States, model_states
from trainfit.core.memory.stats import lora_stats, model_stats
from trainfit.core.memory.step import training_step
from trainfit.core.knob_rules import check_knobs
from trainfit.core.memory_types import DeviceMemory, MemoryComponent, MemoryEstimate
from trainfit.core.models.spec import ModelSpec
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import LoraSettings, TrainingSetup

C = MemoryComponent


def estimate_memory(model: ModelSpec, setup: TrainingSetup,
                    hardware: HardwareProfile | None = None) -> MemoryEstimate:
    """Memory per device for `setup` on `model`; capacities from `hardware` when given."""
    check_knobs(setup, model)  # first: its messages name the combination to use (offload without ZeRO, FSDP)
    check_setup(model, setup)
    model, setup, notes = _as_run(model, setup)
    st = model_stats(model)
    if quant_formats.experts_left_dense(st, setup):
        notes.append(quant_formats.dense_experts_text(st))
    lora = setup.lora if setup.trains_adapters else None
    lora_params, where = lora_stats(model, lora.target_modules, lora.rank) if lora else (0, None)
    lora_params += dora.magnitude_params(model, setup)  # DoRA's trained magnitudes (fp32, like the adapters)
    states = model_states(model, st, setup, lora_params)
    host_comps: list[MemoryComponent] = []  # pinned CPU memory of activation offloading
    phase_pool = 0.0  # what the caching allocator holds across phases, free-running (overheads.margins)
    if setup.method == "inference":
        comps, notes = inference_components(model, st, setup, states)
        trainable = 0
    else:
        comps, phase_pool = _training_components(model, st, setup, states, where, notes, host_comps)
        trainable = states.trainable
    devices = _devices(setup, states, comps, phase_pool, host_comps, hardware, notes)
    notes += _closing_notes(setup, states, devices, hardware)
    return MemoryEstimate(model.id, st.total, trainable, devices, notes)


def _as_run(model: ModelSpec, setup: TrainingSetup) -> tuple[ModelSpec, TrainingSetup, list[str]]:
    """The model and setup as they run (LitGPT's own lm_head, image tokens in the sequence, default
    adapters, the attention that runs), with a note for each change and each caveat of the setup."""
    text_tokens = setup.seq_len
    setup = vision.with_image_tokens(model, setup)  # image tokens join the language model's sequence
    untied = setup.model_code == "litgpt" and model.tie_embeddings
    if untied:
        # LitGPT's GPT has an lm_head of its own: its checkpoint conversion copies a tied embedding
        # into lm_head.weight (scripts/convert_hf_checkpoint.py), so both are held and trained apart.
        model = dataclasses.replace(model, tie_embeddings=False)
    if setup.trains_adapters and setup.lora is None:
        setup = dataclasses.replace(setup, lora=LoraSettings())
    notes: list[str] = []
    if untied:
        notes.append("LitGPT keeps a copy of the tied embeddings as its own lm_head: counted apart")
    if setup.seq_len != text_tokens:
        notes.append(vision.image_note(model, setup, text_tokens))
    if model.capabilities.eager_attention_only and setup.attention != "eager":
        setup = dataclasses.replace(setup, attention="eager")
        notes.append(f"{model.architecture} supports only eager attention in transformers: estimated with eager")
    if setup.quantize_lm_head and model.tie_embeddings:  # knob_rules refused it for a non-bitsandbytes quant
        notes.append("the lm_head is tied to the embeddings: it stays 16-bit with them (--quantize-lm-head "
                     "quantises an lm_head of its own)")
    return model, setup, notes


def _training_components(model: ModelSpec, st, setup: TrainingSetup, states: States, where, notes: list[str],
                         host_comps: list[MemoryComponent]) -> tuple[list[MemoryComponent], float]:
    """(components at the tensor peak, allocator pool) of a training step: each component from its
    function (phases.training_parts), summed per phase (phases.phase_peaks)."""
    step = training_step(model, st, setup, states, where)
    parts = training_parts(step)
    if parts.activations.note:
        notes.append(parts.activations.note)
    if parts.activations.host:
        host_comps.append(parts.activations.host)
    if parts.reference_host_bytes:
        host_comps.append(C("reference_model", int(parts.reference_host_bytes), "frozen DPO reference's parameter "
                            "shards, offloaded like the policy's (all ranks on this host)", True))
    peaks = phase_peaks(step, parts)
    notes.append(peaks.note)
    return peak_components(step, parts, peaks), peaks.pool_bytes


def _devices(setup: TrainingSetup, states: States, comps: list[MemoryComponent], phase_pool: float,
             host_comps: list[MemoryComponent], hardware: HardwareProfile | None,
             notes: list[str]) -> list[DeviceMemory]:
    """The accelerator (or CPU) the setup runs on, with the margins on top of its tensor peak, and
    the CPU when it holds offloaded states or pinned activations."""
    peak = sum(c.bytes for c in comps if c.in_tensor_peak)
    device = setup.device
    arch = hardware.gpus[0].architecture if hardware is not None and hardware.gpus else None
    total_comps = comps + margins(device, peak, architecture=arch, num_gpus=setup.num_gpus,
                                  training=setup.method != "inference", zero_stage=setup.zero_stage,
                                  phase_pool=phase_pool)
    if states.paged_optimizer:
        total_comps.append(C("paged_optimizer", int(states.paged_optimizer), paged_what(setup), False))
    total = sum(c.bytes for c in total_comps)
    label = "cpu" if device == "cpu" else f"{'mps' if device == 'mps' else 'cuda'}:0"
    capacity = None
    if hardware is not None:
        capacity = cpu_capacity(hardware) if device == "cpu" else gpu_capacity(hardware)
        if capacity is None:
            notes.append(unknown_capacity_note(hardware, device))
    devices = [DeviceMemory(label, int(peak), int(total), capacity, total_comps,
                            required_bytes(device, int(total), total_comps))]
    if devices[0].spilled_bytes:
        host_comps.append(C("paged_optimizer", devices[0].spilled_bytes, "paged optimizer states the driver "
                            "evicts from the card to CPU RAM (managed memory)", True))
    host_bytes = sum(c.bytes for c in host_comps)
    if (states.cpu or host_bytes) and device != "cpu":
        cpu_comps = [C("offload", int(states.cpu), states.cpu_what, True)] if states.cpu else []
        cpu_comps += host_comps
        cpu_peak = int(states.cpu) + host_bytes
        if states.cpu:
            cpu_comps.append(C("framework_overhead", int(0.5 * states.cpu),
                               "pinned staging buffers and CPU Adam working copies: 50 % (DeepSpeed uses 1.5x)",
                               False))
        devices.append(DeviceMemory("cpu", cpu_peak, int(1.5 * states.cpu) + host_bytes,
                                    cpu_capacity(hardware) if hardware is not None else None, cpu_comps))
    return devices


def _closing_notes(setup: TrainingSetup, states: States, devices: list[DeviceMemory],
                   hardware: HardwareProfile | None) -> list[str]:
    """The notes on the whole estimate: per-GPU figures, paging, optimizer in backward, the GPU."""
    notes = []
    if setup.num_gpus > 1:
        notes.append(f"per GPU figures; all {setup.num_gpus} GPUs hold the same amount under data parallelism")
    if states.paged_optimizer:
        notes.append(paged_note(devices[0]))
    if setup.optimizer_in_backward:
        notes.append("optimizer in backward: no gradient clipping over the whole model is possible "
                     "(each parameter is stepped before the others' gradients exist)")
    if hardware is not None and hardware.gpus and hardware.gpus[0].name:
        notes.append(f"capacity: {hardware.gpus[0].name}")
    return notes


def unknown_capacity_note(hardware, device: str) -> str:
    """Why a device's capacity is unknown: an unknown size is "not known", never 0 GiB."""
    if device == "cpu":
        why = hardware.memory.unavailable.get("usable_bytes", "not reported")
        return f"usable RAM unknown ({why}): no fit verdict"
    if not hardware.gpus:
        return f"the hardware has no {device} device: capacity unknown"
    gpu = hardware.gpus[0]
    if gpu.unified_memory or device == "mps":
        why = hardware.memory.unavailable.get("total_bytes", "not reported")
        return f"unified memory size of {gpu.name} unknown ({why}): no fit verdict"
    why = gpu.unavailable.get("vram_total_bytes", "not reported")
    return f"memory of {gpu.name} unknown ({why}): no fit verdict"
