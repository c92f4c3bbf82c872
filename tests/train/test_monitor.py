"""The live monitor (trainfit.train.monitor), its dashboard and the `monitoring:` config section."""

from __future__ import annotations

import io
import json
import random
import time

import pytest

from trainfit.hardware.sample_fakes import FakeSampler, ramp
from trainfit.hardware.sample_types import Sample
from trainfit.train.monitor.callback import build_monitor, monitor_training
from trainfit.train.monitor.leaks import LeakDetector, theil_sen
from trainfit.train.monitor.live import Monitor
from trainfit.train.monitor.units import MIB

from .conftest import make_config

GIB = 1 << 30


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def rich_sampler(**host):
    return FakeSampler(
        host={"process_rss_bytes": 900 * MIB, "ram_used_bytes": 8 * GIB, "ram_total_bytes": 16 * GIB,
              "cpu_percent": 55.0, "cpu_temperature_c": 72.0, "on_ac": False, "battery_percent": 15.0, **host},
        gpus=[{"temperature_c": ramp((0, 60), (0.3, 86)), "slowdown_temperature_c": 87.0, "power_watts": 300.0,
               "power_limit_watts": 450.0, "throttle_reasons": ("sw_thermal",), "allocated_bytes": 2 * GIB,
               "memory_used_bytes": 10 * GIB, "memory_total_bytes": 24 * GIB, "utilization_percent": 98.0}])


# ---- the thread -------------------------------------------------------------------------------

def test_thread_writes_samples_at_the_interval(tmp_path):
    path = tmp_path / "metrics.jsonl"
    fake = rich_sampler()
    mon = Monitor(path, interval_seconds=0.05, sampler=fake)
    mon.start()
    t0 = time.monotonic()
    assert wait_for(lambda: fake.calls >= 8)
    for _ in range(3):
        mon.step(loss=1.0, tokens=10)
    mon.stop()
    elapsed = time.monotonic() - t0
    recs = records(path)
    samples = [r for r in recs if r["event"] == "sample"]
    assert len(samples) == fake.calls >= 8
    assert len(samples) <= elapsed / 0.05 + 3  # not faster than the interval
    gaps = [b["time"] - a["time"] for a, b in zip(samples, samples[1:])]
    assert 0.03 < sorted(gaps)[len(gaps) // 2] < 0.1
    assert Sample.from_record(samples[0]).gpus[0].allocated_bytes == 2 * GIB
    assert {r["step"] for r in samples} <= {0, 1, 2, 3}
    assert fake.threads == {"trainfit-monitor"} and fake.closed
    assert not mon.running and len(mon.samples()) == len(samples)
    n = fake.calls
    time.sleep(0.12)
    assert fake.calls == n  # stopped


def test_subscribers_and_a_raising_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    got = []
    mon = Monitor(path, interval_seconds=0.05, sampler=rich_sampler())

    @mon.subscribe
    def bad(sample):
        raise ValueError("policy bug")

    mon.subscribe(got.append)
    with mon:
        assert wait_for(lambda: len(got) >= 5)
    errors = [r for r in records(path) if r["event"] == "monitor_subscriber_error"]
    assert len(errors) == 1 and "ValueError: policy bug" in errors[0]["reason"]
    assert errors[0]["subscriber"].endswith("bad")
    assert all(isinstance(s, Sample) for s in got)
    mon.unsubscribe(got.append)


def test_sampler_failure_is_one_event_and_sampling_goes_on(tmp_path):
    path = tmp_path / "metrics.jsonl"
    fake = FakeSampler(host={"cpu_percent": 1.0}, fail_at=[1, 2])
    with Monitor(path, interval_seconds=0.05, sampler=fake):
        assert wait_for(lambda: fake.calls >= 5)
    recs = records(path)
    assert [r["event"] for r in recs].count("monitor_error") == 1
    assert sum(r["event"] == "sample" for r in recs) >= 3


def test_unwritable_metrics_path_keeps_monitoring(tmp_path):
    mon = Monitor(tmp_path / "missing-dir" / "metrics.jsonl", interval_seconds=0.05, sampler=rich_sampler())
    with mon:
        assert wait_for(lambda: len(mon.samples()) >= 3)
    assert mon.write_error and "cannot append" in mon.write_error


# ---- training numbers -------------------------------------------------------------------------

def test_eta_and_rates_follow_the_recent_steps():
    mon = Monitor(None, total_steps=100, leak_warning=False)
    assert mon.eta_seconds() is None
    for i in range(1, 21):
        mon.step(step_seconds=0.5, tokens=1000, samples=4, loss=10.0 / i)
    assert mon.eta_seconds() == pytest.approx(80 * 0.5)
    for i in range(21, 41):  # the run speeds up: the ETA follows within RECENT_STEPS steps
        mon.step(step_seconds=0.25, tokens=1000, samples=4)
    assert mon.eta_seconds() == pytest.approx(60 * 0.25)
    mon.total_steps = 50  # a --max-steps stop
    assert mon.eta_seconds() == pytest.approx(10 * 0.25)
    st = mon.status()
    assert st["step"] == 40 and st["tokens_seen"] == 40_000 and st["loss"] == pytest.approx(0.5)
    assert st["tokens_per_second"] == pytest.approx(4000) and st["samples_per_second"] == pytest.approx(16)


def test_loss_tensor_is_kept_detached_and_read_later():
    torch = pytest.importorskip("torch")
    w = torch.ones(2, requires_grad=True)
    mon = Monitor(None, leak_warning=False)
    mon.step(loss=(w * 3).sum())
    stored = mon._metrics["loss"]
    assert not stored.requires_grad and mon.status()["loss"] == 6.0
    assert mon.losses() == []  # read by the monitor thread, not in the step hook
    mon.start()
    mon.stop()
    assert mon.losses() == [(1, 6.0)]


def test_step_hook_is_cheap():
    mon = Monitor(None)
    mon._want_memory = False
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        mon.step(loss=1.0, tokens=512, samples=4)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 50e-6, per_call  # ~3 us measured; 0.5 % of a 10 ms step is 50 us


# ---- memory leak ------------------------------------------------------------------------------

def feed(det: LeakDetector, values, key=None, start=1):
    found = []
    for i, v in enumerate(values):
        det.add(start + i, int(v), key)
        found += det.check(seconds_per_step=0.5)
    return found


def test_theil_sen_ignores_outliers():
    pts = [(x, 2.0 * x) for x in range(20)]
    pts[5] = (5, 1000.0)
    slope, tau = theil_sen(pts)
    assert slope == pytest.approx(2.0) and tau > 0.8


def test_leak_fires_once_with_the_rate():
    rng = random.Random(1)
    det = LeakDetector()
    values = [GIB + 4 * MIB * i + rng.gauss(0, 2 * MIB) for i in range(200)]
    found = feed(det, values, key=((4, 128), "process_rss"))
    assert len(found) == 1
    f = found[0]
    assert f.bytes_per_step == pytest.approx(4 * MIB, rel=0.05)
    assert f.bytes_per_hour == pytest.approx(4 * MIB * 7200, rel=0.05)
    assert f.since_step == 11 and f.memory_kind == "process_rss" and f.shape == (4, 128)
    reason = f.reason()
    assert "MiB per step" in reason and "per hour" in reason and "4 x 128" in reason
    assert f.details()["mib_per_step"] == pytest.approx(4, rel=0.05)


def test_leak_is_reported_again_only_when_the_rate_changes():
    det = LeakDetector()
    values = [GIB + 4 * MIB * i for i in range(150)]
    values += [values[-1] + 12 * MIB * i for i in range(1, 150)]
    found = feed(det, values)
    assert len(found) == 2 and found[1].bytes_per_step == pytest.approx(12 * MIB, rel=0.15)
    det = LeakDetector()
    values = [GIB + 4 * MIB * i for i in range(150)] + [GIB + 4 * MIB * 150 + 4.4 * MIB * i for i in range(150)]
    assert len(feed(det, values)) == 1  # +10 %: the same leak


@pytest.mark.parametrize("series", ["flat-noisy", "sawtooth", "jump-then-flat", "slow-creep", "alternating-shapes"])
def test_no_leak(series):
    rng = random.Random(7)
    det = LeakDetector()
    n = 300
    if series == "flat-noisy":
        values = [GIB + rng.gauss(0, 30 * MIB) for _ in range(n)]
    elif series == "sawtooth":  # a cache that fills and is freed every 25 steps
        values = [GIB + (i % 25) * 8 * MIB for i in range(n)]
    elif series == "jump-then-flat":  # growth for 30 steps (20 past the warm-up), then steady
        values = [GIB + min(i, 30) * 20 * MIB + rng.gauss(0, MIB) for i in range(n)]
    elif series == "slow-creep":  # 16 KiB per step: under the minimum growth for this window
        values = [GIB + 16 * 1024 * i for i in range(n)]
    else:  # two batch shapes at two levels, each flat: compared within a shape only
        for i in range(n):
            det.add(i + 1, GIB + (512 * MIB if i % 2 else 0), key=((4, 128 if i % 2 else 64), "process_rss"))
        assert det.check(seconds_per_step=0.5) == []
        return
    assert feed(det, values) == []


def test_monitor_writes_memory_leak_event(tmp_path):
    path = tmp_path / "metrics.jsonl"
    printed = []
    with monitor_training(path, interval_seconds=0.05, sampler=rich_sampler(), say=printed.append,
                          leak_check_seconds=0) as mon:
        for i in range(120):
            mon.step(step_seconds=0.1, memory_bytes=GIB + 8 * MIB * i, shape=(2, 64))
        assert wait_for(lambda: any(e["event"] == "memory_leak" for e in mon.events()))
    (leak,) = [r for r in records(path) if r["event"] == "memory_leak"]
    assert leak["mib_per_step"] == pytest.approx(8, rel=0.02)
    assert leak["mib_per_hour"] == pytest.approx(8 * 36000, rel=0.02)
    assert leak["steps_to_full"] is not None  # 8 GiB of RAM free in the fake sample
    assert isinstance(leak["step"], int) and "per hour" in leak["reason"]
    assert printed and printed[0].startswith("warning: possible memory leak")


def test_monitor_reads_memory_at_step_ends_once_per_interval():
    mon = Monitor(None, interval_seconds=0.05, sampler=FakeSampler(host={}), leak_read_seconds=0.05)
    with mon:
        for _ in range(60):
            mon.step()
            time.sleep(0.005)
    series = list(mon.leak_detector._series.values())
    assert len(series) == 1
    readings = series[0]["window"]
    assert 0 < len(readings) <= 15  # at most one per tick, not one per step (warm-up excluded)
    assert all(v > 10 * MIB for _, v in readings)  # the process RSS
    assert list(mon.leak_detector._series)[0] == (None, "process_rss")
    assert Monitor(None, interval_seconds=0.05).leak_read_seconds == 1.0  # at most one a second by default


# ---- the three ways in ------------------------------------------------------------------------

def _tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def test_trainer_callback_on_a_real_trainer(tmp_path):
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    from trainfit.train.monitor.callback import MonitorCallback

    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids.clone()} for ids in torch.randint(0, 64, (64, 16), generator=g)]
    path = tmp_path / "metrics.jsonl"
    cb = MonitorCallback(path, interval_seconds=0.05, total_steps=None, sampler=rich_sampler(), shape=(4, 16))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=8,
                             logging_steps=2, save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True,
                             learning_rate=1e-3)
    trainer = Trainer(model=_tiny_llama(), args=args, train_dataset=data, data_collator=default_data_collator,
                      callbacks=[cb])
    trainer.train()
    mon = cb.monitor
    assert not mon.running
    assert [p.step for p in mon.steps()] == list(range(1, 9))
    assert all(p.samples == 4 for p in mon.steps())
    assert mon.total_steps == 8 and mon.eta_seconds() == 0
    st = mon.status()
    assert st["loss"] is not None and st["loss_step"] == 8 and st["learning_rate"] is not None
    recs = records(path)
    assert any(r["event"] == "sample" for r in recs)


def test_build_monitor_inside_trainfit_train(tmp_path):
    from trainfit.config.run_config import load_run_config
    from trainfit.train.runner import run_training

    cfg = load_run_config(make_config(tmp_path, "pretrain", schedule={"max_steps": 6},
                                      monitoring={"interval_seconds": 0.05, "dashboard": "on"}))
    run_dir = tmp_path / "run"
    shown = []

    cb = build_monitor(run_dir, settings=cfg.monitoring, predicted_peak_bytes=GIB, total_steps=4, interactive=False,
                       shape=(cfg.training.micro_batch, cfg.training.seq_len))
    cb.dashboard = lambda mon: type("D", (), {"start": lambda self: shown.append("start"),
                                              "stop": lambda self: shown.append("stop")})()
    from transformers import TrainerCallback

    class OneSamplePerStep(TrainerCallback):  # a loaded machine must not make the run outpace the sampler
        def on_step_end(self, args, state, control, **kw):
            n = len(cb.monitor.samples())
            wait_for(lambda: len(cb.monitor.samples()) > n)

    result = run_training(cfg, run_dir, quiet=True, stop_after=4, extra_callbacks=[cb, OneSamplePerStep()])
    assert result.global_step == 4 and shown == ["start", "stop"]
    recs = records(run_dir / "metrics.jsonl")
    steps = [r for r in recs if "loss" in r]
    samples = [r for r in recs if r.get("event") == "sample"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert samples and all(isinstance(r["step"], int) for r in samples)
    s = Sample.from_record(samples[-1])
    assert s.host.process_rss_bytes and s.host.ram_total_bytes  # the live sampler of this machine
    assert cb.monitor.total_steps == 4 and cb.monitor.predicted_peak_bytes == GIB
    assert cb.monitor.interval_seconds == 0.05


def test_disabled_monitor_does_nothing(tmp_path):
    from trainfit.config.run_config import MonitoringConfig

    cb = build_monitor(tmp_path, settings=MonitoringConfig(enabled=False))
    state = type("S", (), {"is_world_process_zero": True, "max_steps": 5, "global_step": 0})()
    cb.on_step_begin(None, state, None)
    assert not cb.monitor.running
    cb = build_monitor(tmp_path, settings=MonitoringConfig(dashboard="auto"), interactive=False)
    assert cb.dashboard is False
    cb = build_monitor(tmp_path, settings=MonitoringConfig(dashboard="auto"), interactive=True,
                       interval_seconds=2.0)
    assert cb.dashboard is True and cb.monitor.interval_seconds == 2.0


def test_context_manager_around_a_plain_pytorch_loop(tmp_path):
    import torch

    path = tmp_path / "metrics.jsonl"
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    with monitor_training(path, interval_seconds=0.05, total_steps=40) as mon:
        for i in range(40):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.step(loss=loss, tokens=256 * 32, samples=256)
            time.sleep(0.005)
    st = mon.status()
    assert st["step"] == 40 and st["eta_seconds"] == 0 and st["loss"] < 2
    recs = records(path)
    assert sum(r.get("event") == "sample" for r in recs) >= 2
    assert Sample.from_record(next(r for r in recs if r.get("event") == "sample")).host.ram_total_bytes
    # a logged-step line per reported loss (`trainfit report` reads the folder)
    assert [r["step"] for r in recs if "event" not in r] == list(range(1, 41))


# ---- dashboard --------------------------------------------------------------------------------

def _monitor_with_history(predicted=3 * GIB):
    mon = Monitor(None, interval_seconds=0.02, total_steps=100, predicted_peak_bytes=predicted,
                  sampler=rich_sampler())
    with mon:
        for i in range(30):
            mon.step(step_seconds=0.2, loss=2.0 - i * 0.01, tokens=4096, samples=8)
        wait_for(lambda: len(mon.samples()) >= 4)
    mon.emit("thermal_pause", "GPU 0 at 86 C, 1 C under its slowdown temperature: paused")
    return mon


def test_dashboard_renders_prediction_and_readings():
    from rich.console import Console

    from trainfit.train.monitor.dashboard import Dashboard

    mon = _monitor_with_history()
    console = Console(file=io.StringIO(), width=140, record=True, color_system=None)
    console.print(Dashboard(mon).render())
    text = console.export_text()
    assert "predicted peak 3.00 GiB" in text and "67 % of predicted" in text and "┃" in text
    assert "2.00 GiB now" in text and "torch allocated" in text
    assert "tokens/s" in text and "step 30 / 100" in text and "ETA 14 s" in text and "loss 1.7100" in text
    assert "GPU 0" in text and "throttle: sw_thermal" in text and "slows at 87 °C" in text
    assert "ON BATTERY 15 %" in text and "RAM 8.00 GiB / 16.00 GiB" in text
    assert "thermal_pause" in text


def test_dashboard_without_prediction_or_samples():
    from rich.console import Console

    from trainfit.train.monitor.dashboard import Dashboard

    console = Console(file=io.StringIO(), width=100, record=True, color_system=None)
    console.print(Dashboard(Monitor(None)).render())
    text = console.export_text()
    assert "no memory reading yet" in text and "waiting for the first sample" in text and "ETA -" in text


def test_dashboard_live_on_a_terminal_and_under_a_progress_bar():
    from rich.console import Console
    from rich.progress import Progress

    from trainfit.train.monitor.dashboard import Dashboard

    mon = _monitor_with_history()
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    dash = Dashboard(mon, console=console, refresh_per_second=20).start()
    time.sleep(0.15)
    dash.stop()
    assert "predicted peak" in out.getvalue()
    out2 = io.StringIO()
    console2 = Console(file=out2, width=120, force_terminal=True, color_system=None)
    with Progress(console=console2) as bar:  # the runner's progress bar: one display on one console
        task = bar.add_task("train", total=10)
        dash = Dashboard(mon, console=console2).start()
        bar.update(task, advance=5)
        time.sleep(0.15)
        dash.stop()
    assert "predicted peak" in out2.getvalue() and "train" in out2.getvalue()


# ---- config -----------------------------------------------------------------------------------

def test_monitoring_section(tmp_path):
    from trainfit.errors import BadInputError
    from trainfit.config.run_config import load_run_config

    a = load_run_config(make_config(tmp_path, name="a.yaml"))
    b = load_run_config(make_config(tmp_path, name="b.yaml", monitoring={"interval_seconds": 5, "dashboard": "off",
                                                                         "leak_warning": False}))
    assert a.monitoring.interval_seconds == 1.0 and a.monitoring.dashboard == "auto"
    assert b.monitoring.interval_seconds == 5.0 and b.monitoring.leak_warning is False
    assert a.config_hash() == b.config_hash()  # monitoring does not change the maths
    for bad, msg in (({"interval_seconds": 0.001}, "from 0.05 to 3,600"), ({"interval_seconds": float("nan")}, "nan"),
                     ({"dashboard": "yes"}, "'auto', 'on', 'off'"), ({"intervall_seconds": 1}, "did you mean")):
        with pytest.raises(BadInputError, match=msg):
            load_run_config(make_config(tmp_path, name="c.yaml", monitoring=bad))
