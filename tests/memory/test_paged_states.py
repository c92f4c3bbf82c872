"""Paged optimizers (bitsandbytes): states of parameters with >= 1e5 elements live in managed memory,
outside PyTorch's caching allocator, and the driver evicts them to CPU RAM when the card runs short."""

import dataclasses

import pytest

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.memory import estimate_memory
from trainfit.core.memory.paged_states import PAGED_MIN_ELEMENTS, paged_elements
from trainfit.core.memory.states import model_states
from trainfit.core.memory.stats import model_stats
from trainfit.core.models.catalog import get_model
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.core.speed import predict_step
from trainfit.core.speed.rates import device_rates

GIB = 2**30
# torchtune's Llama 3.1 8B full fine-tune on one RTX 4090 (bench/data/published_memory.yaml)
TORCHTUNE_4090 = dict(method="full", precision="bf16", optimizer="paged-adamw-8bit", micro_batch=2, seq_len=2048,
                      grad_checkpointing="full", optimizer_in_backward=True, loss="chunked")


@pytest.fixture(scope="module")
def llama():
    return get_model("meta-llama/Llama-3.1-8B")


def _parts(dev):
    return {c.name: c for c in dev.components}


def test_paged_8bit_states_are_outside_the_allocator(llama):
    st = model_stats(llama)
    paged = estimate_memory(llama, TrainingSetup(**TORCHTUNE_4090)).devices[0]
    plain = estimate_memory(llama, TrainingSetup(**{**TORCHTUNE_4090, "optimizer": "adamw-8bit"})).devices[0]
    # every tensor but the norms has >= 1e5 elements: two uint8 states each, in managed memory
    big = st.total - st.norms
    comp = _parts(paged)["paged_optimizer"]
    assert comp.bytes == pytest.approx(2 * big, rel=1e-6) and not comp.in_tensor_peak
    # the fp32 absmax (two per 256 elements) and the norms' states (4096 elements: 8-bit, not paged)
    # stay in the allocator
    assert _parts(paged)["optimizer"].bytes == pytest.approx(2 * 4 * st.total / 256 + 2 * st.norms, rel=1e-6)
    assert paged.tensor_peak_bytes == pytest.approx(plain.tensor_peak_bytes - 2 * big, rel=1e-3)
    # max_memory_reserved leaves it out; nvidia-smi (free-running) shows it; the verdict does not need it
    slack = _parts(paged)["fragmentation"].bytes
    assert paged.reserved_peak_bytes == paged.tensor_peak_bytes + slack + _parts(paged)["framework_overhead"].bytes
    assert paged.total_bytes == paged.reserved_peak_bytes + comp.bytes + _parts(paged)["cuda_context"].bytes
    assert paged.needed_bytes == int(paged.total_bytes - comp.bytes - slack + min(slack, 0.05 * paged.tensor_peak_bytes))


def test_the_4090_run_fits_with_its_states_spilled_to_ram(llama):
    hw = resolve_hardware("1x rtx-4090")
    est = estimate_memory(llama, TrainingSetup(**TORCHTUNE_4090), hw)
    gpu = est.devices[0]
    assert est.fits and gpu.fits_under_pressure
    paged = _parts(gpu)["paged_optimizer"].bytes
    # what does not fit beside the rest waits in RAM, and the card shows its whole capacity
    assert gpu.spilled_bytes == min(paged, gpu.total_bytes - gpu.capacity_bytes) and 0 < gpu.spilled_bytes
    assert gpu.device_total_bytes == gpu.capacity_bytes
    # PyTorch's pool: its free-running size, or at most what the card leaves once the pages are out
    context = _parts(gpu)["cuda_context"].bytes
    assert gpu.reserved_peak_bytes == min(gpu.total_bytes - paged, gpu.capacity_bytes) - context
    host = [d for d in est.devices if d.device == "cpu"][0]
    assert _parts(host)["paged_optimizer"].bytes == gpu.spilled_bytes
    assert any("wait in CPU RAM" in n for n in est.notes)
    # the same run with bitsandbytes' unpaged 8-bit AdamW needs the states on the card: no fit
    assert estimate_memory(llama, TrainingSetup(**{**TORCHTUNE_4090, "optimizer": "adamw-8bit"}), hw).fits is False


def test_no_spill_when_the_states_fit(llama):
    est = estimate_memory(llama, TrainingSetup(**TORCHTUNE_4090), resolve_hardware("1x a100-80gb"))
    gpu = est.devices[0]
    assert gpu.spilled_bytes == 0 and not gpu.fits_under_pressure
    assert [d.device for d in est.devices] == ["cuda:0"]
    assert gpu.device_total_bytes == gpu.total_bytes  # nvidia-smi shows the resident states
    assert any("fit on the card" in n for n in est.notes)


def test_small_adapters_stay_in_the_allocator(llama):
    """LoRA A is r x in and B out x r: at r=8 on q and v of a 4096-wide model each has at most 32,768
    elements (< 1e5), so bitsandbytes keeps their states in ordinary tensors; down_proj's A reads
    14,336 features (114,688 elements at r=8: paged); at r=64 most are paged."""
    def lora(rank, targets=("q_proj", "v_proj", "down_proj")):
        return TrainingSetup(method="lora", optimizer="paged-adamw-32bit",
                             lora=LoraSettings(rank=rank, target_modules=list(targets)))

    assert paged_elements(llama, lora(8, ("q_proj", "v_proj")), 10**9) == 0
    assert paged_elements(llama, lora(8), 10**9) == llama.num_layers * 8 * 14336
    # r=64: q (4096 -> 4096), v (4096 -> 1024: B is 1024 x 64 = 65,536, not paged), down (14336 -> 4096)
    layers = llama.num_layers
    expect = layers * (64 * 4096 * 2 + 64 * 4096 + 64 * 14336 + 64 * 4096)
    assert all(n >= PAGED_MIN_ELEMENTS for n in (64 * 4096, 64 * 14336))
    assert paged_elements(llama, lora(64), 10**9) == expect
    st = model_stats(llama)
    states = model_states(llama, st, lora(64), 10**8)  # 32-bit: 8 B per element, paged or not
    assert states.paged_optimizer == pytest.approx(8 * expect) and states.optimizer == pytest.approx(8 * (10**8 - expect))


def test_only_paged_optimizers_on_devices_with_managed_memory(llama):
    for kw in (dict(optimizer="adamw-8bit"), dict(optimizer="paged-adamw-8bit", device="cpu"),
               dict(optimizer="paged-adamw-8bit", device="mps")):
        states = model_states(llama, model_stats(llama), TrainingSetup(**{**TORCHTUNE_4090, **kw}), 0)
        assert states.paged_optimizer == 0.0


def test_the_spill_crosses_the_host_link_every_step(llama):
    hw = resolve_hardware("1x rtx-4090")
    rates = device_rates(hw, "cuda")
    setup = TrainingSetup(**TORCHTUNE_4090)
    spilled = estimate_memory(llama, setup, hw).devices[0].spilled_bytes
    with_spill = predict_step(llama, setup, rates)
    catalog_only = predict_step(llama, setup, dataclasses.replace(rates, profile=None))
    extra = with_spill.step_seconds - catalog_only.step_seconds
    assert extra == pytest.approx(spilled / rates.pcie_bytes_per_s, rel=1e-6)
    assert with_spill.seconds_by_part["offload"] == pytest.approx(extra)
    assert any("wait in CPU RAM" in n for n in with_spill.notes)
    # on a card where the states fit, nothing crosses
    big = resolve_hardware("1x a100-80gb")
    fits = predict_step(llama, setup, device_rates(big, "cuda"))
    assert fits.seconds_by_part["offload"] == 0.0
