"""Every plan says which speed rates it used and when they were measured, and warns when the
CPU rates were measured under load (core.speed.rates.rates_source, Plan.rates)."""

import dataclasses

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.shapes import parse_shape
from trainfit.core.plan.planner import PlanRequest, plan
from trainfit.core.machines.profile import BenchmarkInfo, MeasurementLoad
from trainfit.core.speed.rates import rates_source

CPU = resolve_hardware("cpu")


def _bench(reliable: bool, cached: bool = True) -> BenchmarkInfo:
    check = MeasurementLoad(reliable, None if reliable else "other processes used 1.50 of 2 cores while it was measured",
                            2, 0.0 if reliable else 1.5, 0.0, 0.3, 2.9, 0.02, 1 if reliable else 3)
    return BenchmarkInfo(30.0, 205.0, 3.5, {}, None, None, None, 3.0, {}, measured_at="2026-11-28T09:15:00+00:00",
                         scope="cpu", cached=cached, cpu_dropout_ns_per_element=12.0, load_check=check,
                         cpu_fp32_training_gflops=160.0, cpu_first_touch_ns_per_page=1800.0)


def test_measured_cpu_rates_say_when():
    src = rates_source(dataclasses.replace(CPU, benchmark=_bench(True)), "cpu")
    assert src["source"] == "measured" and src["reliable"] is True and src["warning"] is None
    assert src["measured_at"] == "2026-11-28T09:15:00+00:00" and src["cpu_fp32_gflops"] == 205.0
    assert "measured on this machine 2026-11-28 09:15 UTC, kept in trainfit's cache" in src["text"]


def test_rates_measured_under_load_are_flagged():
    src = rates_source(dataclasses.replace(CPU, benchmark=_bench(False)), "cpu")
    assert src["reliable"] is False and "measured under load" in src["text"]
    assert "1.50 of 2 cores" in src["warning"] and "profile --benchmark" in src["warning"]


def test_unmeasured_and_gpu_rates_say_they_are_not_measured():
    assert "not measured" in rates_source(dataclasses.replace(CPU, benchmark=None), "cpu")["text"]
    gpu = rates_source(resolve_hardware("rtx-4090"), "cuda")
    assert gpu["source"] == "datasheet" and "datasheet" in gpu["text"]


def test_every_plan_carries_its_rates_and_the_load_warning():
    req = PlanRequest(model=parse_shape("30m"), hardware=dataclasses.replace(CPU, benchmark=_bench(False)),
                      method="full", examples=100)
    result = plan(req)
    assert result.rates["reliable"] is False and result.rates["measured_at"]
    assert any("measured under load" in n for n in result.notes)
    quiet = plan(dataclasses.replace(req, hardware=dataclasses.replace(CPU, benchmark=_bench(True))))
    assert quiet.rates["reliable"] is True and not any("under load" in n for n in quiet.notes)


def test_plan_and_estimate_on_the_command_line_say_which_rates(tmp_path):
    import json
    import subprocess
    import sys

    saved = tmp_path / "machine.json"
    saved.write_text(dataclasses.replace(CPU, benchmark=_bench(False)).to_json())

    def trainfit(*args):
        done = subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    doc = json.loads(trainfit("plan", "shape:1m", "--examples", "100", "--hardware", str(saved), "--json"))
    assert doc["rates"]["reliable"] is False and doc["rates"]["cpu_fp32_training_gflops"] == 160.0
    assert any("measured under load" in n for n in doc["notes"])
    text = trainfit("plan", "shape:1m", "--examples", "100", "--hardware", str(saved))
    assert "CPU rates measured on this machine 2026-11-28 09:15 UTC" in text and "measured under load" in text
    est = json.loads(trainfit("estimate", "shape:1m", "--device", "cpu", "--hardware", str(saved), "--json"))
    assert est["rates"]["measured_at"] == "2026-11-28T09:15:00+00:00" and est["rates"]["warning"]
    assert "rates: CPU rates measured" in trainfit("estimate", "shape:1m", "--device", "cpu", "--hardware", str(saved))
    pipeline = json.loads(trainfit("plan", "shape:1m", "--pipeline", "sft+dpo", "--examples", "100", "--hardware",
                                   str(saved), "--json"))
    assert pipeline["rates"]["reliable"] is False and any("measured under load" in n for n in pipeline["notes"])


def test_profile_shows_the_load_its_cpu_rates_were_measured_under():
    from trainfit.cli.render_profile import profile_lines

    def cpu_row(bench):
        return dict(profile_lines(dataclasses.replace(CPU, benchmark=bench)))["CPU rates"]

    quiet = cpu_row(_bench(True))
    assert "torch fp32 training matmul 160 GFLOP/s" in quiet and "measured 2026-11-28 09:15 UTC" in quiet
    assert "others used 0.00 of 2 cores" in quiet and "UNDER LOAD" not in quiet
    busy = cpu_row(_bench(False))
    assert "MEASURED UNDER LOAD" in busy and "3 tries" in busy and "1.50 of 2 cores" in busy
    assert "reused while the machine stays busy" in busy
