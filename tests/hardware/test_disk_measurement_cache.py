"""A filesystem's measured speed is reused for a day on the live machine (so `profile` does not
write 64 MiB every time), says when it was measured, and is measured again when it is older,
when --benchmark asks, or for a fixture machine."""

import dataclasses
import json

from trainfit.hardware import storage
from trainfit.hardware.fakes import load_fixture

from .conftest import FIXTURES


def _sources(name: str = "live"):
    calls = []
    src = load_fixture(FIXTURES / "desktop-rtx4090.yaml")

    def bench(path, size):
        calls.append(size)
        return 2000.0 + len(calls), 900.0

    return dataclasses.replace(src, name=name, disk_bench=bench), calls


def test_measured_once_then_reused_with_its_time(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls = _sources()
    first = storage.probe_storage(src)
    measured = len(calls)  # one per filesystem (work and cache dirs)
    second = storage.probe_storage(src)
    assert measured >= 1 and len(calls) == measured
    assert [s.read_mbps for s in second] == [s.read_mbps for s in first]
    assert [s.measured_at for s in second] == [s.measured_at for s in first]
    assert first[0].measured_at.endswith("+00:00")


def test_benchmark_and_age_measure_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls = _sources()
    storage.probe_storage(src)
    per_probe = len(calls)
    storage.probe_storage(src, reuse=False)
    assert len(calls) == 2 * per_probe
    entries = sorted((tmp_path / "disk").glob("*.json"))
    assert len(entries) == per_probe
    for entry in entries:
        data = json.loads(entry.read_text())
        data["measured_at_epoch"] -= storage.DISK_MEASUREMENT_MAX_AGE_SECONDS + 1
        entry.write_text(json.dumps(data))
    storage.probe_storage(src)
    assert len(calls) == 3 * per_probe
    for entry in entries:
        entry.write_text("{damaged")
    storage.probe_storage(src)
    assert len(calls) == 4 * per_probe


def test_fixture_machines_are_always_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    src, calls = _sources(name="fixture")
    storage.probe_storage(src)
    per_probe = len(calls)
    storage.probe_storage(src)
    assert per_probe >= 1 and len(calls) == 2 * per_probe and not (tmp_path / "disk").exists()
