"""bench/hub_hostile.py measures what it says: the real CLI as a subprocess, its own peak RSS."""

from __future__ import annotations

import tempfile
from pathlib import Path

import _fake_hub as fh
import hub_hostile
import pytest


@pytest.mark.parametrize("name,deadline_s", [("gzip-bomb-config", None), ("drip-config", 1.0)])
def test_a_hostile_case_runs_the_cli_within_its_deadline_and_memory(name, deadline_s):
    (case,) = [c for c in hub_hostile.cases() if c["name"] == name]
    with fh.serve() as hub, tempfile.TemporaryDirectory() as tmp:
        hub.add(f"acme/{name}", case["files"], info=case.get("info"))
        result = hub_hostile.run_case(case, hub.endpoint, deadline_s, Path(tmp))
    assert result["exit_code"] == case["expect"] and result["stderr_lines"] == 1 and not result["traceback"]
    assert 10 < result["peak_rss_mb"] < hub_hostile.PEAK_RSS_TARGET_MB  # read from the child's VmHWM
    if deadline_s is not None:
        assert "1 s deadline" in result["message"]
        assert result["wall_seconds"] < deadline_s + hub_hostile.STARTUP_ALLOWANCE_S
