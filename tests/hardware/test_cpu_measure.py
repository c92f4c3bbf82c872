"""The live machine's profile carries measured CPU rates without --benchmark: measured once, kept
per machine / CPU / library versions, measured again with --benchmark, not kept when the machine
was busy; the speed model uses them; bf16 without bf16 instructions is measured (and, when it
cannot be, estimated far below fp32, never above it)."""

import dataclasses
import json
import time

import pytest

from trainfit.core.machines.profile import BenchmarkInfo
from trainfit.core.speed import rates
from trainfit.hardware import cpu_load, cpu_measure, profiler
from trainfit.hardware.benchmark import cpu_autocast_bf16_gflops, cpu_bf16_rate
from trainfit.hardware.fakes import load_fixture

from .conftest import FIXTURES


def _src(name: str = "live"):
    return dataclasses.replace(load_fixture(FIXTURES / "desktop-rtx4090.yaml"), name=name)


def _fake_measure(calls: list, fp32: float = 180.0):
    def measure(cpu):
        calls.append(cpu.model)
        return BenchmarkInfo(30.0, fp32 + len(calls), 3.0, {}, None, None, None, 0.5, {}, measured_at=cpu_measure._iso(time.time()),
                             scope="cpu", cpu_dropout_ns_per_element=20.0, cpu_fp32_training_gflops=150.0, cpu_fp32_training_narrow_gflops=140.0,
                             cpu_first_touch_ns_per_page=1800.0)
    return measure


def _window(other_cores: float) -> cpu_load.LoadWindow:
    return cpu_load.LoadWindow(1.0, 2, other_cores, 0.0, 0.1, 0.1)


def _load(monkeypatch, other_cores: list[float]) -> None:
    """Fake load readings: other processes use other_cores[0] of 2 cores (changed by the test)."""
    monkeypatch.setattr(cpu_measure, "RETRY_PAUSE_SECONDS", 0.0)
    monkeypatch.setattr(cpu_load, "window", lambda start, end=None: _window(other_cores[0]))
    monkeypatch.setattr(cpu_load, "sample", lambda seconds=0.5: _window(other_cores[0]))


@pytest.fixture
def quiet(monkeypatch):
    _load(monkeypatch, [0.0])


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


def test_a_measurement_under_load_is_retried_flagged_and_never_kept_as_the_machines_rates(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    load = [1.5]  # another job on 1.5 of the 2 cores
    _load(monkeypatch, load)
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    got = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    # measured again up to MAX_ATTEMPTS times; the least disturbed (highest fp32) used, flagged
    assert len(calls) == cpu_measure.MAX_ATTEMPTS and got.cpu_fp32_gflops == 183.0
    assert not got.load_check.reliable and got.load_check.attempts == 3 and got.load_check.other_cores == 1.5
    assert "other processes used 1.50 of 2 cores" in got.load_check.reason
    assert "not kept as this machine's rates" in got.unavailable["under_load"]
    (entry,) = (tmp_path / "cpu-rates").glob("*.json")
    stored = json.loads(entry.read_text())
    assert "benchmark" not in stored and not stored["under_load"]["load_check"]["reliable"]
    again = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))  # still busy: the same flagged figures
    assert len(calls) == 3 and again.cpu_fp32_gflops == got.cpu_fp32_gflops and again.cached
    assert "under_load" in again.unavailable
    load[0] = 0.02
    quiet = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert len(calls) == 4 and "under_load" not in quiet.unavailable and quiet.load_check.reliable
    assert "under_load" not in json.loads(entry.read_text())
    # a busy --benchmark-style refresh is shown but never replaces the quiet measurement
    load[0] = 1.9
    busy = cpu_measure.cpu_rates(src, cpu, refresh=True, measure=_fake_measure(calls))
    assert not busy.load_check.reliable and len(calls) == 7
    kept = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert len(calls) == 7 and kept.cpu_fp32_gflops == quiet.cpu_fp32_gflops and kept.load_check.reliable


def test_a_busy_try_is_replaced_by_a_quiet_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    readings = iter([1.0, 0.0])
    monkeypatch.setattr(cpu_measure, "RETRY_PAUSE_SECONDS", 0.0)
    monkeypatch.setattr(cpu_load, "window", lambda start, end=None: _window(next(readings)))
    src, calls = _src(), []
    got = cpu_measure.cpu_rates(src, profiler.cpu.probe_cpu(src), measure=_fake_measure(calls))
    assert len(calls) == 2 and got.load_check.reliable and got.load_check.attempts == 2
    assert got.cpu_fp32_gflops == 182.0  # the quiet try, not the busy one


def test_a_flagged_measurement_expires(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    _load(monkeypatch, [1.5])
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    monkeypatch.setattr(cpu_measure, "PROVISIONAL_SECONDS", 0.0)
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert len(calls) == 6  # measured again, still busy: flagged again


def test_unsteady_repeats_flag_a_measurement():
    check = cpu_load.judge(_window(0.0), 0.45, 1)
    assert not check.reliable and "varied by 45%" in check.reason
    assert cpu_load.judge(_window(0.0), 0.05, 1).reliable
    assert not cpu_load.judge(_window(0.5), 0.0, 1).reliable  # 25 % of 2 cores


def test_load_window_counts_other_processes_not_our_own_threads():
    """Counters are read for real: our own busy threads are not 'other work'."""
    import threading

    start = cpu_load.snapshot()
    stop = time.monotonic() + 0.6
    def spin():
        while time.monotonic() < stop:
            pass
    threads = [threading.Thread(target=spin) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    win = cpu_load.window(start)
    assert win.other_cores is not None and win.seconds >= 0.5 and win.cores >= 1
    # what others do on this shared machine is not ours to control; our own spinning must not add
    # to it: others can use at most every core minus what we used
    assert win.other_cores <= win.cores


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
    assert any(f"measured on this machine on {live.benchmark.measured_at[:10]}" in n for n in r.notes)


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
    assert data["benchmark"]["cpu_fp32_gflops"] == 181.0 and data["identity"].startswith("v2|")


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


@pytest.mark.parametrize("field", cpu_measure.MEASURED_FIELDS)
def test_a_kept_measurement_without_a_step_rate_is_measured_again(tmp_path, monkeypatch, quiet, field):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    (entry,) = (tmp_path / "cpu-rates").glob("*.json")
    data = json.loads(entry.read_text())
    data["benchmark"].pop(field)
    entry.write_text(json.dumps(data))
    assert not cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls)).cached and len(calls) == 2


def test_torch_training_matmul_and_first_touch_are_measured_and_reach_the_rates():
    pytest.importorskip("torch")
    from trainfit.core.speed import cpu as cpu_model
    from trainfit.hardware import benchmark

    assert benchmark.cpu_training_gemm_gflops(64, 64, reps=1) > 0
    assert benchmark.cpu_first_touch_ns_per_page(4 << 20, reps=1) >= 0
    # the step model carries the rate from the shape the benchmark measures
    assert (benchmark.TRAINING_GEMM_TOKENS, benchmark.TRAINING_GEMM_WIDTH) == (
        cpu_model.CPU_TRAINING_GEMM_TOKENS, cpu_model.CPU_TRAINING_GEMM_WIDTH)
    profile = profiler.build_profile(sources=_src("fixture"), quick=True)
    bench = BenchmarkInfo(30.0, 180.0, 3.0, {}, None, None, None, 0.5, {}, scope="cpu", cpu_dropout_ns_per_element=17.5,
                          cpu_fp32_training_gflops=150.0, cpu_first_touch_ns_per_page=2048.0)
    r = rates.cpu_rates(dataclasses.replace(profile, benchmark=bench))
    assert r.training_gemm_flops == pytest.approx(150e9) and r.first_touch_seconds_per_byte == pytest.approx(0.5e-9)
    unmeasured = rates.cpu_rates(dataclasses.replace(profile, benchmark=None))
    assert unmeasured.training_gemm_flops is None and unmeasured.first_touch_seconds_per_byte is None


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


def test_a_full_benchmark_under_load_is_flagged_and_does_not_replace_the_kept_rates(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from trainfit.hardware.benchmark import run_benchmark

    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    load = [0.0]
    _load(monkeypatch, load)
    src, calls = _src(), []
    cpu = profiler.cpu.probe_cpu(src)
    quiet = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    load[0] = 1.6
    bench = run_benchmark(src, cpu, [], work_dir=str(tmp_path), disk_bytes=1 << 20, scale=0.05)
    assert not bench.load_check.reliable and "CPU part measured under load" in bench.unavailable["under_load"]
    assert bench.cpu_fp32_training_gflops is not None and bench.cpu_first_touch_ns_per_page is not None
    profiler._keep_cpu_part(src, cpu, bench)
    kept = cpu_measure.cpu_rates(src, cpu, measure=_fake_measure(calls))
    assert kept.cpu_fp32_gflops == quiet.cpu_fp32_gflops and len(calls) == 1  # the quiet one stays
