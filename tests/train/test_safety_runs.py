"""Every safety policy through a real `trainfit train` (the CLI entry, on CPU): a scripted machine
(TRAINFIT_FAKE_MACHINE, hardware/sample_fakes.MachineScript) heats up, throttles, runs on battery,
fills its RAM, swaps or leaks at a given step, and the run must log the policy's events, pause
and resume when the readings say so, and still finish with the same optimizer steps, data order
and losses as a clean run of the same config (one clean run per module).

The scripted series start at a training step and then follow the wall clock (a pause is real
waiting), so the timings are checked against the script's own numbers with a margin for a busy
machine, never against a fixed duration of a training step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfit.cli.main import main
from trainfit.train.recovery import faults

from .conftest import loss_trajectory, make_config

GIB = 1 << 30
MIB = 1 << 20
STEPS = 16
# Losses of a run whose threads were lowered (battery) or whose micro-batch was split sum in
# another order; fp32 on CPU agrees to ~1e-6 relative (bench/results/oom_recovery.md).
REL_TOL = 1e-4
FAST = {"interval_seconds": 0.05, "safety": {"check_seconds": 0.05, "cool_hold_seconds": 0.4}}
# A machine scripted by step (`by_step`) is checked at every step: a window of a few ~10 ms steps
# falls between two of FAST's 50 ms checks on an idle machine.
EVERY_STEP = {**FAST["safety"], "check_seconds": 0.0}


def train(config: Path, run_dir: Path, monkeypatch, machine: dict | None = None, capfd=None):
    """`trainfit train CONFIG --out RUN_DIR --quiet` in this process, with `machine` scripted.
    Returns (exit code, step -> sample digests of every optimizer step, stderr)."""
    from trainfit.train import runner

    if machine is not None:
        script = run_dir.parent / f"{run_dir.name}-machine.json"
        script.write_text(json.dumps({**FAST, **machine}))
        monkeypatch.setenv(faults.FAKE_MACHINE_ENV, str(script))
    else:
        monkeypatch.delenv(faults.FAKE_MACHINE_ENV, raising=False)
    log = faults.SampleLog()
    real = runner.run_training

    def observed(*args, **kwargs):  # the CLI's own call, with a callback that records the data order
        kwargs["extra_callbacks"] = [*(kwargs.get("extra_callbacks") or []), log]
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_training", observed)
    if capfd is not None:
        capfd.readouterr()
    code = main(["train", str(config), "--out", str(run_dir), "--quiet"])
    err = capfd.readouterr().err if capfd is not None else ""
    monkeypatch.setattr(runner, "run_training", real)
    return code, log.steps, err


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clean")
    config = make_config(tmp, "pretrain", schedule={"max_steps": STEPS})
    with pytest.MonkeyPatch.context() as mp:
        code, samples, _ = train(config, tmp / "run", mp)
    assert code == 0
    return config, tmp / "run", samples


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def events(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in records(run_dir) if r.get("event") == kind]


def assert_same_run(clean, run_dir: Path, samples: dict) -> None:
    _, ref_dir, ref_samples = clean
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == STEPS and summary["global_batch"] == 4
    assert samples == ref_samples  # every optimizer step trained on the same samples, in order
    got, want = loss_trajectory(run_dir), loss_trajectory(ref_dir)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step, loss in want.items():
        assert abs(got[step] - loss) <= REL_TOL * abs(loss), (step, got[step], loss)


def pause_seconds(pause: dict, end: dict) -> float:
    return end["time"] - pause["time"]


# ---------------------------------------------------------------------------------------------
def test_cpu_heat_pauses_and_resumes_with_hysteresis(clean, tmp_path, monkeypatch):
    """96 C from step 5 for 2.5 s, then 60 C: balanced pauses at 90 C, resumes once below 80 C
    (10 C of hysteresis) for the 0.4 s hold."""
    machine = {"host": {"cpu_temperature_c": {"from_step": 5, "before": 60,
                                              "ramp": [[0, 96], [2.5, 96], [3.0, 60]]}}}
    code, samples, _ = train(clean[0], tmp_path / "run", monkeypatch, machine)
    assert code == 0
    (pause,), (resume,) = events(tmp_path / "run", "thermal_pause"), events(tmp_path / "run", "thermal_resume")
    assert pause["step"] >= 5 and "CPU at 96 C" in pause["reason"] and "below 80 C" in pause["reason"]
    assert resume["step"] == pause["step"] and resume["readings"]["cpu_temperature_c"] < 80
    # the reading fell under 80 C at 2.5 + 0.5 x 16/36 = 2.72 s after step 5; then 0.4 s held
    waited = pause_seconds(pause, resume)
    assert 0.4 <= resume["paused_seconds"] <= waited + 0.05 and waited < 3.2 + 2.0
    samples_in_pause = [r for r in records(tmp_path / "run") if r.get("event") == "sample"
                        and pause["time"] <= r["time"] <= resume["time"]]
    assert samples_in_pause and all(r["step"] == pause["step"] for r in samples_in_pause)  # no step ran
    assert_same_run(clean, tmp_path / "run", samples)


def test_cpu_throttle_counters_pause_and_name_the_rate(clean, tmp_path, monkeypatch):
    """The kernel's throttle counter rises by 300 events a second for 2 s from step 5 (the
    temperature stays at 70 C): the pause names the rate and ends on the rate, not on a temperature."""
    # A rate needs two readings after step 5: the 11 steps left can take under 100 ms, two of FAST's
    # 50 ms samples, so this run samples every 10 ms and checks at every step.
    machine = {"host": {"cpu_temperature_c": 70,
                        "cpu_throttle_events": {"from_step": 5, "before": 1000,
                                                "ramp": [[0, 1000], [2.0, 1600]]}},
               "interval_seconds": 0.01, "safety": EVERY_STEP}
    code, samples, _ = train(clean[0], tmp_path / "run", monkeypatch, machine)
    assert code == 0
    (pause,), (resume,) = events(tmp_path / "run", "thermal_pause"), events(tmp_path / "run", "thermal_resume")
    assert "CPU thermal throttling" in pause["reason"] and "events/min" in pause["reason"]
    assert pause["readings"]["cpu_throttle_events_per_minute"] >= 10  # balanced: 10 events/min
    assert "throttling is under 10 events/min" in pause["reason"] and " C for" not in pause["reason"]
    assert pause["resume_below_c"] is None
    assert resume["paused_seconds"] >= 0.4 and pause_seconds(pause, resume) < 2.0 + 0.4 + 2.0
    assert_same_run(clean, tmp_path / "run", samples)


def test_on_battery_fewer_threads_then_ac_again(clean, tmp_path, monkeypatch):
    """Unplugged for steps 4-9 (60 % charge, above the pause threshold), plugged in again at step
    10: fewer CPU threads and more frequent checkpoints while on battery, full speed after, no pause."""
    import torch

    threads = torch.get_num_threads()
    machine = {"host": {"on_ac": {"by_step": [[0, True], [4, False], [10, True]]}, "battery_percent": 60},
               "safety": EVERY_STEP}
    code, samples, _ = train(clean[0], tmp_path / "run", monkeypatch, machine)
    assert code == 0
    (battery,), (back,) = events(tmp_path / "run", "power_battery"), events(tmp_path / "run", "power_resume")
    assert 4 <= battery["step"] <= 9 and battery["battery_percent"] == 60
    assert battery["threads_after"] == max(1, int(threads * 0.5)) and back["threads"] == threads
    assert 10 <= back["step"] < STEPS and back["paused_seconds"] is None  # no pause: charge was fine
    assert not events(tmp_path / "run", "battery_pause")
    assert any(e["risk"] == "battery" for e in events(tmp_path / "run", "checkpoint_cadence"))
    assert torch.get_num_threads() == threads
    assert_same_run(clean, tmp_path / "run", samples)


def test_low_battery_checkpoints_waits_and_ac_return_resumes(clean, tmp_path, monkeypatch):
    """Unplugged at step 6 with 12 % left (under balanced's 20 %): checkpoint, wait for AC, which
    comes back 1.2 s later; training resumes from where it paused."""
    machine = {"host": {"on_ac": {"from_step": 6, "before": True, "ramp": [[0, False], [1.2, True]]},
                        "battery_percent": {"from_step": 6, "before": 80, "ramp": [[0, 12]]}}}
    code, samples, _ = train(clean[0], tmp_path / "run", monkeypatch, machine)
    assert code == 0
    (pause,), (back,) = events(tmp_path / "run", "battery_pause"), events(tmp_path / "run", "power_resume")
    assert "battery at 12 %" in pause["reason"] and "checkpoint written" in pause["reason"]
    assert back["step"] == pause["step"] and 0 < back["paused_seconds"] <= pause_seconds(pause, back) + 0.05
    assert pause_seconds(pause, back) < 1.2 + 2.0
    assert_same_run(clean, tmp_path / "run", samples)


def test_ram_pressure_splits_the_micro_batch_before_an_oom(clean, tmp_path, monkeypatch):
    """99.5 % of RAM in use at steps 4-6: the micro-batch is split (4 -> 2, accumulation 1 -> 2) at
    the next step boundary; the same global batch, data order and losses."""
    full = int(15.92 * GIB)
    machine = {"host": {"ram_total_bytes": 16 * GIB, "swap_used_bytes": 0,
                        "ram_used_bytes": {"by_step": [[3, 8 * GIB], [4, full], [6, full], [7, 8 * GIB]]}},
               "safety": EVERY_STEP}
    code, samples, _ = train(clean[0], tmp_path / "run", monkeypatch, machine)
    assert code == 0
    shrinks = events(tmp_path / "run", "memory_pressure")
    assert shrinks and "RAM" in shrinks[0]["reason"] and "under balanced mode's 10% headroom" in shrinks[0]["reason"]
    assert shrinks[0]["step"] >= 4 and shrinks[0]["from"]["micro_batch"] == 4 and shrinks[0]["to"]["micro_batch"] == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["training"]["micro_batch"] * summary["training"]["grad_accum"] == 4
    assert_same_run(clean, tmp_path / "run", samples)


def test_swap_growth_splits_the_micro_batch(clean, tmp_path, monkeypatch):
    machine = {"host": {"ram_total_bytes": 16 * GIB, "ram_used_bytes": 10 * GIB,
                        "swap_used_bytes": {"by_step": [[4, 100 * MIB], [5, 700 * MIB]]}}}
    code, samples, _ = train(clean[0], tmp_path / "run", monkeypatch, machine)
    assert code == 0
    (shrink,) = events(tmp_path / "run", "memory_pressure")  # the new swap level is the new baseline
    assert "swap in use grew by" in shrink["reason"] and shrink["step"] >= 5
    assert shrink["to"] == {"micro_batch": 2, "grad_accum": 2, "grad_checkpointing": "none", "precision": "fp32"}
    assert_same_run(clean, tmp_path / "run", samples)


def test_a_leak_that_would_exhaust_memory_splits_the_micro_batch(clean, tmp_path, monkeypatch):
    """The memory read at step ends grows 200 MiB a step with 450 MiB free (above the headroom):
    the leak detector's finding says it runs out before the run ends, so the split shrinks."""
    # The leak check runs in the monitor's thread, once per sample: at FAST's 50 ms a run of ~5 ms
    # steps was first checked at step 12 of 16 once in a full run. This run samples every 10 ms and
    # the leak runs out in 2.25 steps, so a finding up to step 13 still comes before the end.
    machine = {"leak_detector": {"warmup_steps": 1, "window": 10, "min_points": 7, "min_growth_bytes": 64 * MIB},
               "leak_read_seconds": 0, "leak_check_seconds": 0, "interval_seconds": 0.01, "safety": EVERY_STEP,
               "memory_reading": {"by_step": [[0, GIB], [STEPS, GIB + STEPS * 200 * MIB]]},
               "host": {"ram_total_bytes": 4 * GIB, "ram_used_bytes": 4 * GIB - 450 * MIB}}
    code, samples, _ = train(clean[0], tmp_path / "run", monkeypatch, machine)
    assert code == 0
    (leak, *_) = events(tmp_path / "run", "memory_leak")
    assert leak["steps_to_full"] < STEPS - leak["step"]
    (shrink,) = events(tmp_path / "run", "memory_pressure")
    assert "memory leak" in shrink["reason"] and "before the run's end" in shrink["reason"]
    assert shrink["step"] >= leak["step"]
    assert_same_run(clean, tmp_path / "run", samples)


def test_eta_in_metrics_without_a_terminal(clean):
    """--quiet (no terminal): every logged step carries the ETA to the run's end (0 at the last)."""
    steps = [r for r in records(clean[1]) if "event" not in r]
    assert all(r["eta_seconds"] is not None and r["eta_seconds"] >= 0 for r in steps)
    assert steps[-1]["eta_seconds"] == 0 and steps[0]["eta_seconds"] > 0
    (plan,) = events(clean[1], "run_plan")
    assert plan["max_steps"] == STEPS and plan["predicted"]["total_bytes"] > 0 and plan["step"] == 0


@pytest.mark.parametrize("device, sample, expected", [
    ("cuda", {"gpus": [{"index": 0, "memory_total_bytes": 80 * GIB, "memory_used_bytes": 77 * GIB}]},
     "GPU 0 memory 77.00 GiB of 80.00 GiB used, 3.8% free"),
    ("rocm", {"gpus": [{"index": 0, "memory_total_bytes": 64 * GIB, "memory_used_bytes": 20 * GIB},
                       {"index": 1, "memory_total_bytes": 64 * GIB, "memory_used_bytes": 63 * GIB}]}, "GPU 1 memory"),
    ("mps", {"host": {"ram_total_bytes": 16 * GIB, "ram_used_bytes": 15 * GIB}}, "RAM 15.00 GiB of 16.00 GiB"),
    ("cuda", {"host": {"ram_total_bytes": 16 * GIB, "ram_used_bytes": 15 * GIB},  # host RAM: not a GPU's memory
              "gpus": [{"index": 0, "memory_total_bytes": 80 * GIB, "memory_used_bytes": 10 * GIB}]}, None),
])
def test_memory_pressure_reads_the_memory_of_the_device_kind(device, sample, expected):
    from trainfit.core.run.safety_thresholds import safety_thresholds
    from trainfit.hardware.sample_types import GpuSample, HostSample, Sample
    from trainfit.train.monitor.machine_policies import MemoryPressurePolicy
    from trainfit.train.monitor.safety_context import SafetyContext

    policy = MemoryPressurePolicy(SafetyContext(thresholds=safety_thresholds("balanced"), device=device))
    reading = Sample(0.0, HostSample(**sample.get("host", {})), tuple(GpuSample(**g) for g in sample.get("gpus", [])))
    found = policy.pressure(reading)
    assert (found is None) if expected is None else (expected in found and "10% headroom" in found)


@pytest.mark.parametrize("script, expected", [
    ({"host": {"cpu_temp": 90}}, "host has no field(s) cpu_temp"),
    ({"safety": {"cool_hold": 1}}, "safety.cool_hold is not a setting"),
    ({"host": {"on_ac": {"by_step": [[0]]}}}, "points must be a non-empty list"),
    ({"interval_seconds": 0}, "interval_seconds must be a number of seconds > 0"),
    ({"leak_detector": {"window": "ten"}}, "leak_detector.window must be a number"),
])
def test_a_bad_machine_script_is_exit_2_with_one_line(tmp_path, capfd, script, expected):
    config = make_config(tmp_path, "pretrain")
    (tmp_path / "m.json").write_text(json.dumps(script))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(faults.FAKE_MACHINE_ENV, str(tmp_path / "m.json"))
        code = main(["train", str(config), "--out", str(tmp_path / "run"), "--quiet"])
    err = capfd.readouterr().err
    assert code == 2 and expected in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing left behind


def test_machine_script_series_follow_the_steps_and_the_clock():
    from trainfit.hardware.sample_fakes import MachineScript, ManualClock

    clock, step = ManualClock(), [0]
    script = MachineScript({"host": {"cpu_temperature_c": {"from_step": 3, "before": 60, "ramp": [[0, 96], [2, 70]]},
                                     "on_ac": {"by_step": [[0, True], [4, False]]},
                                     "ram_used_bytes": {"by_step": [[0, 0], [10, 1000]]}}},
                           lambda: step[0], clock)
    sampler = script.sampler()
    read = lambda: sampler.sample().host  # noqa: E731
    assert (read().cpu_temperature_c, read().on_ac, read().ram_used_bytes) == (60, True, 0)
    step[0] = 3
    clock.advance(5.0)  # the ramp starts when step 3 is first seen, not at the clock's start
    assert read().cpu_temperature_c == 96 and read().ram_used_bytes == 300
    clock.advance(1.0)
    assert read().cpu_temperature_c == 83 and read().on_ac is True
    step[0] = 4
    clock.advance(5.0)
    assert read().cpu_temperature_c == 70 and read().on_ac is False
    assert isinstance(read().ram_used_bytes, int)
