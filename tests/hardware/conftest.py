from pathlib import Path

import pytest

from trainfit.hardware.fakes import load_fixture, load_fixture_data, sources_from_data
from trainfit.hardware.profiler import build_profile

FIXTURES = Path(__file__).parent / "fixtures"
MACHINES = sorted(p.stem for p in FIXTURES.glob("*.yaml") if not p.name.startswith("_"))


def fixture_profile(name: str, **kwargs):
    kwargs.setdefault("timeouts", {"gpus.nvidia": 0.5})
    return build_profile(sources=load_fixture(FIXTURES / f"{name}.yaml"), **kwargs)


def fixture_data(name: str) -> dict:
    return load_fixture_data(FIXTURES / f"{name}.yaml")


@pytest.fixture(scope="session")
def profiles():
    """Every fixture machine profiled once per test session."""
    return {name: fixture_profile(name) for name in MACHINES}


__all__ = ["FIXTURES", "MACHINES", "fixture_profile", "fixture_data", "sources_from_data"]
