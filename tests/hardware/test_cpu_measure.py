"""The live machine's profile carries measured CPU rates without --benchmark: measured once, kept
per machine / CPU / library versions, measured again with --benchmark, not kept when the machine
was busy; the speed model uses them; bf16 without bf16 instructions is measured (and, when it
cannot be, estimated far below fp32, never above it)."""

import dataclasses
import json

import pytest

from trainfit.core.profile import BenchmarkInfo
from trainfit.core.speed import rates
from trainfit.hardware import cpu_measure, profiler
from trainfit.hardware.benchmark import cpu_autocast_bf16_gflops, cpu_bf16_rate
from trainfit.hardware.fakes import load_fixture

from .conftest import FIXTURES


def _src(name: str = "live"):
    return dataclasses.replace(load_fixture(FIXTURES / "desktop-rtx4090.yaml"), name=name)


def _fake_measure(calls: list, fp32: float = 180.0):
    def measure(cpu):
        calls.append(cpu.model)
        return BenchmarkInfo(30.0, fp32 + len(calls), 3.0, {}, None, None, None, 0.5, {}, measured_at="2026-01-01T00:00:00+00:00",
                             scope="cpu", cpu_dropout_ns_per_element=20.0)
    return measure


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(cpu_measure.os, "getloadavg", lambda: (0.1, 0.1, 0.1))


def test_measured_once_then_read_back(tmp_path, monkeypatch, quiet):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls, told = _src(), [], []
    cpu = profiler.cpu.probe_cpu(src)
    first = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls), on_measure=told.append)
    second = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls), on_measure=told.append)
    assert len(calls) == 1 and len(told) == 1 and "measuring" in told[0]
    assert second.cpu_fp32_gflops == first.cpu_fp32_gflops == 181.0
    assert second.cached and not first.cached and second.measured_at == first.measured_at
    refreshed = cpu_measure.cpu_rates(src, cpu, refresh=True, measure=_fake_measure(calls))
    assert len(calls) == 2 and refreshed.cpu_fp32_gflops == 182.0


def test_a_new_torch_or_cpu_measures_again(tmp_path, monkeypatch, quiet):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    monkeypatch.setattr(cpu_measure, "_version", lambda dist: "99.0" if dist == "torch" else "1.0")
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    cpu_measure.cpu_rates(src, dataclasses.replace(cpu, usable_cores=1), measure=_fake_measure(calls))
    assert len(calls) == 3
    for entry in (tmp_path / "cpu-rates").glob("*.json"):
        entry.write_text("{damaged")
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert len(calls) == 4


def test_a_measurement_under_load_is_reused_while_busy_and_replaced_when_quiet(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    load = [400.0]
    monkeypatch.setattr(cpu_measure.os, "getloadavg", lambda: (load[0], load[0], load[0]))
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    got = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert "under load" in got.unavailable["under_load"]
    again = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))  # still busy: the same figures
    assert len(calls) == 1 and again.cpu_fp32_gflops == got.cpu_fp32_gflops
    load[0] = 0.1
    quiet = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert len(calls) == 2 and "under_load" not in quiet.unavailable
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert len(calls) == 2


def test_live_profile_carries_rates_fixtures_do_not(tmp_path, monkeypatch, quiet):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(cpu_measure, "measure_cpu", _fake_measure(calls))
    live = profiler.build_profile(sources=_src("live"), quick=True)
    assert live.benchmark is not None and live.benchmark.scope == "cpu" and live.benchmark.cpu_fp32_gflops == 181.0
    assert "benchmark" not in live.unavailable
    fixture = profiler.build_profile(sources=_src("fixture"), quick=True)
    assert fixture.benchmark is None and "not requested" in fixture.unavailable["benchmark"]
    # the speed model reads the measured rate and says where it came from
    r = rates.cpu_rates(live)
    assert r.peak_flops["fp32"] == 181.0e9 and r.peak_flops["bf16"] == 3.0e9
    assert any("measured on this machine on 2026-01-01" in n for n in r.notes)


def test_unmeasured_bf16_without_instructions_is_far_below_fp32():
    prof = profiler.build_profile(sources=_src("fixture"), quick=True)
    cpu = dataclasses.replace(prof.cpu, flags={**prof.cpu.flags, "avx512_bf16": False, "amx_bf16": False, "bf16": False})
    r = rates.cpu_rates(dataclasses.replace(prof, cpu=cpu, benchmark=None))
    assert r.peak_flops["bf16"] == pytest.approx(r.peak_flops["fp32"] * rates.CPU_EMULATED_BF16_SHARE)
    native = dataclasses.replace(cpu, flags={**cpu.flags, "avx512_bf16": True, "bf16": True})
    assert rates.cpu_rates(dataclasses.replace(prof, cpu=native, benchmark=None)).peak_flops["bf16"] > r.peak_flops["fp32"]


def test_bf16_is_measured_without_bf16_instructions():
    pytest.importorskip("torch")
    prof = profiler.build_profile(sources=_src("fixture"), quick=True)
    cpu = dataclasses.replace(prof.cpu, flags={**prof.cpu.flags, "avx512_bf16": False, "amx_bf16": False, "bf16": False})
    gflops, why = cpu_bf16_rate(cpu, scale=0.25)
    assert why is None and gflops > 0
    assert cpu_autocast_bf16_gflops(64, 64, reps=1) > 0


def test_stored_entry_is_plain_json(tmp_path, monkeypatch, quiet):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    (entry,) = (tmp_path / "cpu-rates").glob("*.json")
    data = json.loads(entry.read_text())
    assert data["benchmark"]["cpu_fp32_gflops"] == 181.0 and data["identity"].startswith("v1|")


def test_a_kept_measurement_without_the_dropout_rate_is_measured_again(tmp_path, monkeypatch, quiet):
    """A cache entry of a trainfit that did not measure dropout yet is replaced, not reused."""
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    for entry in (tmp_path / "cpu-rates").glob("*.json"):
        data = json.loads(entry.read_text())
        data["benchmark"].pop("cpu_dropout_ns_per_element")
        entry.write_text(json.dumps(data))
    again = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert len(calls) == 2 and again.cpu_dropout_ns_per_element == 20.0 and not again.cached
    assert cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls)).cached and len(calls) == 2


def test_the_dropout_rate_is_measured_and_reaches_the_cpu_rates():
    pytest.importorskip("torch")
    from trainfit.hardware.benchmark import cpu_dropout_ns_per_element

    ns = cpu_dropout_ns_per_element(1 << 14, reps=1)
    assert 0.05 < ns < 10_000  # random numbers drawn one by one: nanoseconds per element
    profile = profiler.build_profile(sources=_src("fixture"), quick=True)
    bench = BenchmarkInfo(30.0, 180.0, 3.0, {}, None, None, None, 0.5, {}, scope="cpu", cpu_dropout_ns_per_element=17.5)
    r = rates.cpu_rates(dataclasses.replace(profile, benchmark=bench))
    assert r.dropout_seconds_per_element == pytest.approx(17.5e-9)
    assert rates.cpu_rates(dataclasses.replace(profile, benchmark=None)).dropout_seconds_per_element is None
