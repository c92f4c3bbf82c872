"""The run config's safety.interruption_hours (a spot machine's figure): validated, combined with
the mode's risk by the cadence policy, named in its decision events, and wired through
`trainfit train` for real."""

from __future__ import annotations

import math

import pytest

from trainfit.config.run_config import load_run_config
from trainfit.core.run.checkpoint_cadence import cadence_interval
from trainfit.core.run.safety_thresholds import safety_thresholds
from trainfit.errors import BadInputError
from trainfit.train.monitor.run_policies import CadencePolicy

from .conftest import make_config
from .test_safety import Machine, callbacks, drive, events


def test_interruption_hours_in_the_run_config(tmp_path):
    cfg = load_run_config(make_config(tmp_path, "pretrain", safety={"interruption_hours": 2.1345}))
    plain = load_run_config(make_config(tmp_path, "pretrain", name="plain.yaml"))
    assert cfg.safety.interruption_hours == 2.1345 and plain.safety.interruption_hours is None
    assert cfg.config_hash() == plain.config_hash()  # how often a run checkpoints is not its maths


@pytest.mark.parametrize("value,needle", [
    (0, "safety.interruption_hours: must be a number from 0.01 to 1,000,000, got 0"),
    (-3, "safety.interruption_hours: must be a number from 0.01"),
    (".nan", "safety.interruption_hours: must be a number from 0.01"),
    ("'soon'", "safety.interruption_hours"),
])
def test_interruption_hours_is_checked(tmp_path, value, needle):
    path = make_config(tmp_path, "pretrain")
    path.write_text(path.read_text() + f"safety:\n  interruption_hours: {value}\n")
    with pytest.raises(BadInputError) as err:
        load_run_config(path)
    assert needle in str(err.value)


def test_cadence_uses_the_config_figure_and_says_so(tmp_path):
    """Balanced mode (8 h) with a 2 h spot figure: 1 / (1/28800 + 1/7200) = 5760 s between
    interruptions; a 2 s checkpoint -> Young sqrt(2 x 2 x 5760) = 151.8 s of training (mode alone:
    sqrt(2 x 2 x 28800) = 339.4 s)."""
    m = Machine(heat=0.0)
    cbs = callbacks(tmp_path / "spot", m, "balanced", interruption_hours=2.0)
    drive(cbs, m, steps=400, step_seconds=1.0, save_seconds=2.0)
    measured = [e for e in events(tmp_path / "spot", "checkpoint_cadence") if e["cost_source"] == "measured"]
    assert measured, events(tmp_path / "spot")
    d = measured[-1]
    assert d["interruption_seconds"] == pytest.approx(5760.0)
    assert d["config_interruption_hours"] == 2.0
    assert "safety.interruption_hours 2 h" in d["interruption_source"] and "balanced" in d["interruption_source"]
    assert d["interval_seconds"] == pytest.approx(math.sqrt(2 * 2.0 * 5760.0), rel=1e-6)
    assert "safety.interruption_hours 2 h" in d["reason"]

    m2 = Machine(heat=0.0)
    drive(callbacks(tmp_path / "mode", m2, "balanced"), m2, steps=400, step_seconds=1.0, save_seconds=2.0)
    alone = [e for e in events(tmp_path / "mode", "checkpoint_cadence") if e["cost_source"] == "measured"][-1]
    assert alone["interruption_source"] == "balanced mode's assumed 8 h" and alone["config_interruption_hours"] is None
    assert alone["interval_seconds"] == pytest.approx(math.sqrt(2 * 2.0 * 28800.0), rel=1e-6)
    # the trainer and the planner use the same rule
    assert d["interval_seconds"] == cadence_interval(2.0, 5760.0, safety_thresholds("balanced")).interval_seconds


def test_elevated_risk_still_applies_on_top(tmp_path):
    m = Machine(heat=0.0, on_ac=False, battery=90.0)
    cbs = callbacks(tmp_path, m, "balanced", interruption_hours=2.0)
    cadence = next(cb for cb in cbs if isinstance(cb, CadencePolicy))
    assert cadence.interruption_seconds("thermal") == pytest.approx(5760.0 * 0.25)


def test_train_passes_the_figure_to_the_policy(tmp_path):
    """A real tiny CPU run: the cadence event in metrics.jsonl names the config's figure."""
    from trainfit.train.runner import run_training

    cfg = load_run_config(make_config(tmp_path, "pretrain", schedule={"max_steps": 3},
                                      safety={"interruption_hours": 0.5}, monitoring={"enabled": False}))
    run_training(cfg, tmp_path / "run", quiet=True)
    cadence = events(tmp_path / "run", "checkpoint_cadence")
    assert cadence and cadence[0]["config_interruption_hours"] == 0.5
    # 1 / (1/28800 + 1/1800) = 1694.1 s
    assert cadence[0]["interruption_seconds"] == pytest.approx(1694.1, abs=0.1)
