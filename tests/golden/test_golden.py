"""Every golden case (tests/golden/cases.py: estimate, plan, cloud and analyze across architectures,
methods and machines) prints byte for byte what was recorded, with the same exit code."""

import difflib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cases import CASES, recorded, run_case  # noqa: E402

RECORDED = recorded()


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_is_byte_identical(name):
    got, want = run_case(CASES[name]), RECORDED[name]
    if got["stdout"] != want["stdout"]:
        diff = difflib.unified_diff(want["stdout"].splitlines(), got["stdout"].splitlines(),
                                    "recorded", "now", lineterm="", n=2)
        pytest.fail(f"{name}: output changed\n" + "\n".join(list(diff)[:60]))
    assert (got["exit"], got["stderr"]) == (want["exit"], want["stderr"])


def test_the_set_covers_every_command_and_is_recorded_whole():
    assert sorted(RECORDED) == sorted(CASES)
    commands = {argv[0] for argv in CASES.values()}
    assert commands == {"estimate", "plan", "cloud", "analyze"} and len(CASES) >= 60
