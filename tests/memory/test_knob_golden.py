"""estimate / plan outputs of varied command lines (full, LoRA, QLoRA, DPO, ZeRO, FSDP, offload,
the runtime-emulation knobs, refusals and their exit codes) equal those recorded from the code
before the knob table (tests/memory/golden_cases.py says how they were recorded)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from golden_cases import CASES, run_case  # noqa: E402

GOLDEN = json.loads((Path(__file__).parent / "data" / "knob_golden.json").read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_unchanged(name):
    assert run_case(CASES[name]) == GOLDEN[name]


def test_every_case_recorded():
    assert sorted(GOLDEN) == sorted(CASES)
