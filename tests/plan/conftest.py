from pathlib import Path

import pytest

from trainfit.hardware.fakes import load_fixture
from trainfit.hardware.profiler import build_profile

FIXTURES = Path(__file__).resolve().parents[1] / "hardware" / "fixtures"


@pytest.fixture(scope="session")
def fixture_machine():
    """A fixture machine (tests/hardware/fixtures/<name>.yaml) profiled once per session."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = build_profile(sources=load_fixture(FIXTURES / f"{name}.yaml"), timeouts={"gpus.nvidia": 0.5})
        return cache[name]
    return get
