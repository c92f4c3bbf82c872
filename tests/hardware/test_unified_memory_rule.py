"""One rule for what an Apple GPU may use of unified memory, in analyze, estimate, plan and profile.

`analyze --hardware m2-16gb` used to score 14.4 GiB (RAM minus the OS reserve) while `estimate`
checked against 10.7 GiB (Metal's working-set limit); both now take
core.machines.hardware_spec.metal_working_set_bytes through core.memory.overheads.gpu_capacity.
"""

import argparse

import pytest

from trainfit.cli import cmd_analyze
from trainfit.cli.cmd_estimate import estimate
from trainfit.cli.render_profile import profile_lines
from trainfit.core.machines.hardware_spec import metal_working_set_bytes, resolve_hardware
from trainfit.core.memory.overheads import gpu_capacity

from .conftest import fixture_profile

GIB, MIB = 1 << 30, 1 << 20


@pytest.mark.parametrize("ram_gib, reported_mib", [
    (16, 10922.67),  # M1 Pro 16 GB (abetlen/llama-cpp-python#687)
    (32, 21845.34),  # M1/M2 Max 32 GB (ollama/ollama#434)
    (64, 49152.00),  # M1/M2 Max 64 GB (ggml-org/llama.cpp#1870)
    (96, 73728.00),  # M2 Max 96 GB (ggml-org/llama.cpp#3213)
])
def test_rule_matches_reported_recommended_max_working_set(ram_gib, reported_mib):
    assert metal_working_set_bytes(ram_gib * GIB) / MIB == pytest.approx(reported_mib, rel=1e-5)


def test_rule_edges():
    assert metal_working_set_bytes(None) is None and metal_working_set_bytes(0) is None
    assert metal_working_set_bytes(36 * GIB) == int(36 * GIB * 2 / 3)  # no report: the smaller share
    assert metal_working_set_bytes(48 * GIB) == 36 * GIB


def _analyze(hardware: str) -> dict:
    parser = argparse.ArgumentParser()
    cmd_analyze.add_arguments(parser)
    return cmd_analyze.analyze(parser.parse_args(["--hardware", hardware]))


def _usable_everywhere(hardware: str) -> dict[str, int]:
    doc = _analyze(hardware)
    result, _, _ = estimate("gpt2", hardware=hardware)
    profile = doc["profile"]
    modes = doc["plan"]["modes"]
    return {
        "analyze": doc["analysis"]["memory_bytes"],
        "estimate": result.devices[0].capacity_bytes,
        "plan": {round(m["memory_budget_bytes"] / m["targets"]["memory_share"]) for m in modes if m["fits"]}.pop(),
        "capacity": gpu_capacity(profile),
    }


def test_analyze_and_estimate_agree_for_m2_16gb():
    usable = _usable_everywhere("m2-16gb")
    assert set(usable.values()) == {metal_working_set_bytes(16 * GIB)}, usable
    assert f"{metal_working_set_bytes(16 * GIB) / GIB:.1f} GiB" == "10.7 GiB"
    p = resolve_hardware("m2-16gb")
    assert p.gpus[0].vram_free_bytes == metal_working_set_bytes(16 * GIB)
    assert "the GPU may use 10.7 GiB of it (Metal working-set limit)" in dict(profile_lines(p))["RAM"]


def test_analyze_and_estimate_agree_for_a_saved_apple_profile(tmp_path):
    live = fixture_profile("macbook-m2-16gb")
    path = tmp_path / "mac.json"
    path.write_text(live.to_json())
    usable = _usable_everywhere(str(path))
    expected = metal_working_set_bytes(live.memory.total_bytes)
    assert set(usable.values()) == {expected}, usable
    # what the live probe reports free for the GPU stays within the same limit
    assert live.gpus[0].vram_free_bytes <= expected
