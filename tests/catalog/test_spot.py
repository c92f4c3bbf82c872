"""Spot pricing, interruption figures, the checkpoint-cadence rule and the expected cost with
interruptions, each checked against the numbers it is derived from (computed by hand in the
comments), and `trainfit cloud --spot --json`."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from trainfit.core.run.checkpoint_cadence import cadence_interval, checkpoint_seconds, combined_interruption_seconds
from trainfit.core.cloud.catalog import load_cloud_catalog, parse_interruptions
from trainfit.core.run.safety_thresholds import safety_thresholds
from trainfit.core.cloud.spot import (InterruptionFigure, estimate_spot, expected_spot_run, mean_hours_from_events,
                                mean_hours_from_share)
from trainfit.errors import BadInputError

# The shipped GPU spot trace: 202 preemptions in 431.17 running hours of p3.2xlarge (data/cloud.yaml).
TRACE_HOURS = 431.17 / 202  # = 2.13450 h
TRACE_SECONDS = TRACE_HOURS * 3600  # = 7684.2 s
BALANCED_SECONDS = 8 * 3600.0  # core.plan.modes: balanced's assumed time between interruptions


# ---------------------------------------------------------------------------------------------
# interruption figures
def test_shipped_figures_follow_their_conversions():
    cat = load_cloud_catalog()
    trace = cat.interruptions["aws-v100-spot-trace-2023"]
    assert trace.mean_hours == pytest.approx(2.1345, abs=1e-4)
    assert trace.source.startswith("https://github.com/skypilot-org/spot-traces") and trace.as_of
    # AWS advisor band 5-10 %/month, read at its upper edge: M = 720 / -ln(0.90) = 720 / 0.105361 = 6833.7 h
    assert cat.interruptions["aws-band-5-10"].mean_hours == pytest.approx(6833.7, abs=0.1)
    # <5 %: 720 / -ln(0.95) = 720 / 0.0512933 = 14036.9 h
    assert cat.interruptions["aws-band-0-5"].mean_hours == pytest.approx(14036.9, abs=0.1)
    assert mean_hours_from_share(0.10, 720) == pytest.approx(6833.7, abs=0.1)
    assert mean_hours_from_events(202, 431.17) == pytest.approx(TRACE_HOURS)
    for f in cat.interruptions.values():
        assert f.source.startswith("https://") and f.provider and f.as_of and "M =" in f.basis


def test_spot_terms_per_flavor():
    cat = load_cloud_catalog()
    t4 = cat.spot_terms(cat.get("n1-standard-8+t4"))
    assert t4 is not None and t4.usd_per_hour == 0.18
    assert t4.interruption.id == "aws-v100-spot-trace-2023" and t4.assumed  # measured on AWS, flavor is GCP
    assert cat.spot_terms(cat.get("g5.xlarge")) is None  # no spot price in the catalog
    assert cat.spot_terms(cat.get("lambda-1x-h100-sxm")) is None  # Lambda sells no spot
    # RunPod's Community Cloud is an on-demand tier, not spot: no spot price is claimed for it.
    assert all(f.spot_usd_per_hour is None for f in cat.flavors if f.provider == "runpod")


def test_price_file_names_a_band_or_its_own_figure(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("id,spot_usd_per_hour,spot_interruption,spot_interruption_hours\n"
                    "g5.xlarge,0.45,aws-band-5-10,\nt4-small,0.2,,3.5\n")
    cat = load_cloud_catalog(path)
    g5 = cat.spot_terms(cat.get("g5.xlarge"))
    assert g5.usd_per_hour == 0.45 and g5.interruption.mean_hours == pytest.approx(6833.7, abs=0.1)
    assert not g5.assumed  # an AWS band for an AWS flavor
    own = cat.spot_terms(cat.get("t4-small"))
    assert own.interruption.mean_hours == 3.5 and "given" in own.interruption.basis


@pytest.mark.parametrize("text,needle", [
    ("id,spot_usd_per_hour,spot_interruption\ng5.xlarge,0.4,aws-band-5-11\n",
     "unknown spot_interruption 'aws-band-5-11'"),
    ("id,spot_usd_per_hour,spot_interruption_hours\ng5.xlarge,0.4,0\n", "spot_interruption_hours' must be mean hours"),
    ("id,spot_usd_per_hour,spot_interruption_hours\ng5.xlarge,0.4,soon\n", "must be a number"),
    ("id,spot_interruptions\ng5.xlarge,1\n", "unknown column 'spot_interruptions'"),
])
def test_bad_spot_columns(tmp_path, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(BadInputError) as err:
        load_cloud_catalog(path)
    assert needle in str(err.value)
    if "unknown spot_interruption" in needle:
        assert "aws-band-5-10" in str(err.value)  # the hint names the nearest valid id


@pytest.mark.parametrize("entry,needle", [
    ({"provider": "x", "events": 2, "running_hours": 5, "share": 0.1, "window_hours": 720, "source": "s", "as_of": "d"},
     "either events + running_hours or share + window_hours"),
    ({"provider": "x", "share": 1.0, "window_hours": 720, "source": "s", "as_of": "d"}, "'share' must be below 1"),
    ({"provider": "x", "events": 0, "running_hours": 5, "source": "s", "as_of": "d"}, "'events' must be a positive"),
    ({"provider": "x", "events": 3, "running_hours": 5, "as_of": "d"}, "needs provider, source and as_of"),
    ({"provider": "x", "events": 3, "running_hours": 5, "source": "s", "as_of": "d", "rate": 1}, "unknown key 'rate'"),
])
def test_interruption_table_is_strict(entry, needle):
    with pytest.raises(BadInputError) as err:
        parse_interruptions({"f": entry}, "test", {})
    assert needle in str(err.value)


# ---------------------------------------------------------------------------------------------
# the cadence rule (one rule: core.run.checkpoint_cadence, used by the trainer, cloud and plan)
def test_cadence_with_the_spot_trace_by_hand():
    th = safety_thresholds("balanced")
    # Rates add: 1 / (1/7684.2 + 1/28800) = 6065.8 s
    m = combined_interruption_seconds(BALANCED_SECONDS, TRACE_SECONDS)
    assert m == pytest.approx(6065.8, abs=0.1)
    # C = 5 s: Young sqrt(2 x 5 x 6065.8) = 246.3 s, above the 3 % floor 5 / 0.03 = 166.7 s
    c = cadence_interval(5.0, m, th)
    assert c.limited_by == "young" and c.interval_seconds == pytest.approx(246.3, abs=0.1)
    # C = 30 s: Young 603.3 s < floor 30 / 0.03 = 1000 s > balanced's 900 s maximum loss -> 900 s
    c = cadence_interval(30.0, m, th)
    assert c.limited_by == "max_loss" and c.interval_seconds == 900.0 and c.overhead_share == pytest.approx(30 / 900)
    # The mode alone (8 h), C = 5 s: sqrt(2 x 5 x 28800) = 536.7 s; a spot figure only shortens it.
    assert cadence_interval(5.0, BALANCED_SECONDS, th).interval_seconds == pytest.approx(536.7, abs=0.1)
    assert combined_interruption_seconds(BALANCED_SECONDS, None, math.inf) == BALANCED_SECONDS


def test_checkpoint_cost_estimate():
    # 1 GB at the assumed 200 MB/s + the 0.1 s fixed part
    assert checkpoint_seconds(10**9) == pytest.approx(5.1)


# ---------------------------------------------------------------------------------------------
# expected time and cost with interruptions
def test_expected_ten_hour_run_by_hand():
    """10 h of training on the trace's spot machine, C = 5 s, tau = 246.3 s, restart R = 600 s.

    First order: each of the W / tau = 146.2 segments costs tau + C = 251.3 s plus, per
    interruption, half a segment re-done and a restart; interruptions = T / M. Solving
    T = W (1 + C/tau) / (1 - (tau/2 + C/2 + R) / M) = 36731 / (1 - 725.7 / 7684.2) = 40562 s."""
    tau = cadence_interval(5.0, combined_interruption_seconds(BALANCED_SECONDS, TRACE_SECONDS),
                           safety_thresholds("balanced")).interval_seconds
    run = expected_spot_run(36000.0, tau, 5.0, 600.0, TRACE_SECONDS)
    first_order = 36000 * (1 + 5 / tau) / (1 - (tau / 2 + 5 / 2 + 600) / TRACE_SECONDS)
    assert first_order == pytest.approx(40562, abs=5)
    assert run.expected_seconds == pytest.approx(first_order, rel=0.02)  # exact vs first order
    assert run.checkpoints == 147 and run.expected_interruptions == pytest.approx(run.expected_seconds / TRACE_SECONDS)
    # at the t4 flavor's spot price $0.18/h: about 11.3 h billed = $2.03 instead of $1.80 uninterrupted
    assert run.expected_seconds / 3600 * 0.18 == pytest.approx(2.03, abs=0.02)


def test_expected_run_matches_a_simulation():
    """Monte Carlo of the model the formula solves: Poisson interruptions over billed time, the
    segment in progress lost, a restart (itself interruptible) after each."""
    work, tau, c, r, m = 20000.0, 900.0, 30.0, 300.0, 3000.0
    rng = random.Random(12)
    totals = []
    for _ in range(3000):
        t, done = 0.0, 0.0
        need_restart = False
        while done < work - 1e-9:
            seg = (r if need_restart else 0.0) + min(tau, work - done) + c
            x = rng.expovariate(1 / m)
            if x < seg:
                t += x
                need_restart = True
                continue
            t += seg
            done += min(tau, work - done)
            need_restart = False
        totals.append(t)
    simulated = sum(totals) / len(totals)
    # Daly's value counts a restart before every retried segment; the simulation does the same.
    assert expected_spot_run(work, tau, c, r, m).expected_seconds == pytest.approx(simulated, rel=0.03)


def test_expected_run_limits():
    never = expected_spot_run(1000.0, 100.0, 2.0, 60.0, math.inf)
    assert never.expected_seconds == pytest.approx(1000 + 10 * 2) and never.expected_interruptions == 0
    # one segment, no restart cost: M (e^(s/M) - 1)
    one = expected_spot_run(100.0, 100.0, 0.0, 0.0, 1000.0)
    assert one.expected_seconds == pytest.approx(1000 * math.expm1(0.1))
    assert math.isinf(expected_spot_run(10**6, 10**6, 0.0, 0.0, 10.0).expected_seconds)
    with pytest.raises(ValueError):
        expected_spot_run(100.0, 0.0, 1.0, 1.0, 10.0)


def test_estimate_spot_states_its_figures():
    figure = InterruptionFigure("t", TRACE_HOURS, "basis", "https://x", "2023", "aws", capacity_wait_minutes=81.5)
    est = estimate_spot(work_seconds=36000, checkpoint_size_bytes=10**9, setup_seconds=600, figure=figure,
                        thresholds=safety_thresholds("balanced"), assumed=False)
    assert est.checkpoint_seconds == pytest.approx(5.1)
    assert est.restart_seconds == pytest.approx(600 + 5.0)  # setup + reading 1 GB back at 200 MB/s
    assert est.checkpoint_interval_seconds == pytest.approx(math.sqrt(2 * 5.1 * 6065.8), abs=0.1)
    assert est.cadence_interruption_hours == pytest.approx(6065.8 / 3600, abs=1e-3)
    assert est.expected_hours > est.uninterrupted_hours == 10
    assert est.expected_wait_hours == pytest.approx(est.expected_interruptions * 81.5 / 60)


# ---------------------------------------------------------------------------------------------
# trainfit cloud --spot
def _cloud_json(*args):
    done = subprocess.run([sys.executable, "-m", "trainfit", "cloud", *args, "--json"], capture_output=True,
                          text=True, timeout=120)
    return done, json.loads(done.stdout) if done.stdout else None


def test_cloud_spot_json_order_and_fields():
    flavors = ["--flavor", "n1-standard-8+t4", "--flavor", "a3-highgpu-1g", "--flavor", "g5.xlarge"]
    done, doc = _cloud_json("Qwen/Qwen2.5-0.5B", "--method", "lora", "--examples", "20000", "--spot", *flavors)
    assert done.returncode == 0, done.stderr
    assert doc["spot"] is True
    rows = {r["flavor"]: r for r in doc["results"]}
    costs = [r["cost_usd"] for r in doc["results"]]
    assert costs == sorted(costs)  # ranked by expected cost (all three fit and there are no limits)
    t4 = rows["n1-standard-8+t4"]
    assert t4["price_kind"] == "spot" and t4["usd_per_hour"] == 0.18 and t4["on_demand_usd_per_hour"] == 0.73
    s = t4["spot"]
    assert s["interruption_id"] == "aws-v100-spot-trace-2023" and s["assumed"] is True
    assert s["interruption_hours"] == pytest.approx(TRACE_HOURS) and s["interruption_source"].startswith("https://")
    assert s["checkpoint_interval_seconds"] > 0 and s["expected_overhead_share"] > 0
    assert t4["cost_usd"] == pytest.approx(t4["hours"] * 0.18)
    assert t4["hours"] == pytest.approx(s["expected_hours"] + 10 / 60)  # + the setup, billed once
    assert t4["cost_usd"] > t4["cost_usd_uninterrupted"]
    g5 = rows["g5.xlarge"]
    assert g5["price_kind"] == "on-demand" and g5["spot"] is None and "no spot price" in g5["spot_note"]
    assert g5["usd_per_hour"] == 1.006
    assert any("on-demand" in line for line in doc["reasoning"])


def test_cloud_without_spot_is_unchanged():
    done, doc = _cloud_json("Qwen/Qwen2.5-0.5B", "--method", "lora", "--examples", "2000",
                            "--flavor", "n1-standard-8+t4")
    assert done.returncode == 0 and doc["spot"] is False
    row = doc["results"][0]
    assert row["usd_per_hour"] == 0.73 and row["spot"] is None and row["spot_note"] == ""
