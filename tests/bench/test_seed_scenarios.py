"""bench/seed_scenarios.py: the seed guides' settings beside trainfit's plans. The committed results pass
the benchmark's check, cover every scenario, and a few scenarios re-run live give the same verdicts
(the ones that need the planner's shorter sequences and attention-only adapters among them)."""

import json
from pathlib import Path

import pytest

import seed_scenarios as bench

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "seed_scenarios.json"


def test_committed_results_pass_the_check_and_cover_every_scenario():
    doc = json.loads(RESULTS.read_text())
    assert doc["failures"] == [] and bench.check(doc["scenarios"]) == []
    assert [r["id"] for r in doc["scenarios"]] == [s.id for s in bench.SCENARIOS]
    assert {r["seed"] for r in doc["scenarios"]} == {"000", "002", "003", "004"}


@pytest.mark.parametrize("scenario_id", ["002-8gb-llama3-8b-qlora", "002-12gb-llama3-8b-dpo",
                                         "004-a10g-qwen2.5-7b-lora", "004-a100-llama3-70b-lora"])
def test_live_scenarios_match_the_committed_verdicts(scenario_id):
    committed = {r["id"]: r for r in json.loads(RESULTS.read_text())["scenarios"]}[scenario_id]
    live = bench.run_scenario(next(s for s in bench.SCENARIOS if s.id == scenario_id))
    assert bench.check([live]) == []
    assert (live["guide_fits"], live["plan_fits"]) == (committed["guide_fits"], committed["plan_fits"])
    assert {m: v["setting"] for m, v in live["modes"].items()} == \
        {m: v["setting"] for m, v in committed["modes"].items()}


def test_the_check_flags_a_guide_setting_the_planner_misses():
    row = {"id": "x", "guide_fits": True, "plan_fits": False, "guide_setting": "s", "guide_needed_gib": 7.0,
           "capacity_gib": 8.0}
    assert len(bench.check([row])) == 1 and bench.check([dict(row, plan_fits=True)]) == []
