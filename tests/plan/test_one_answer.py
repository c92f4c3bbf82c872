"""One answer from `estimate`, `plan`, `cloud` and the files `plan --out` writes (issue: a plan you
can run as written). Over a grid of methods x machines (one GPU, several GPUs, several nodes, a
Mac, a CPU, rented flavors), for the same setting they agree on memory, step time, steps, run
time, cost, precision and LoRA targets, and the host RAM is checked against the machine planned
for (a flavor's own RAM). The Python twins of the commands keep it fast; a few real CLI calls
check that the commands print what the twins return."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import yaml

from trainfit.cli.cmd_cloud import cloud
from trainfit.cli.cmd_estimate import estimate_run
from trainfit.cli.cmd_plan import plan_for
from trainfit.core.cloud.catalog import load_cloud_catalog
from trainfit.core.plan.cloud_rank import flavor_hardware
from trainfit.core.plan.host_ram import host_ram_need_bytes, ram_is_the_device
from trainfit.core.plan.space import default_lora
from trainfit.core.setup import DEFAULT_METHOD
from trainfit.errors import UnavailableError
from trainfit.export.plan_files import plan_files

GIB = 1 << 30
EXAMPLES = 4000
SMALL, MID = "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-1.5B-Instruct"
# (model, --hardware or None, --flavor or None)
MACHINES = [
    (MID, "a10g", None), (MID, "rtx-3060", None), (MID, "2x rtx-4090", None), (MID, "8x h100-sxm", None),
    (MID, "2 nodes x 8x h100-sxm", None), (SMALL, "m2-16gb", None), (SMALL, "cpu", None),
    (MID, None, "t4-small"), (MID, None, "lambda-1x-h100-sxm"), (MID, None, "runpod-2x-rtx-4090"),
]
METHODS = ("full", "lora", "qlora", "dpo")
CASES = [(model, hw, flavor, method) for model, hw, flavor in MACHINES for method in METHODS]


def test_the_grid_covers_the_machines_the_issue_names():
    assert len(CASES) >= 40
    kinds = {hw or flavor for _, hw, flavor, _ in CASES}
    assert {"m2-16gb", "cpu", "2 nodes x 8x h100-sxm", "8x h100-sxm", "t4-small"} <= kinds


def _estimate_flags(s) -> dict:
    """The plan's setting as estimate's flags (LoRA targets left to estimate's default on purpose)."""
    flags = dict(method=s.method, precision=s.precision, optimizer=s.optimizer, micro_batch=s.micro_batch,
                 grad_accum=s.grad_accum, seq_len=s.seq_len, grad_checkpointing=s.grad_checkpointing,
                 attn=s.attention, zero=s.zero_stage, offload=s.offload, gpus=s.num_gpus, device=s.device,
                 examples=EXAMPLES)
    if s.quant != "none":
        flags["quant"] = s.quant
    if s.method == "dpo":
        flags["dpo_reference"] = s.dpo_reference
        if s.lora is not None:
            flags["lora_r"] = s.lora.rank
    return flags


def _files(mp, req, tmp_path) -> dict:
    texts = plan_files(mp, req, "trainfit plan ...", None, base_dir=tmp_path / mp.mode)
    return {"texts": texts, **{name: yaml.safe_load(text) for name, text in texts.items()
                               if name.endswith(".yaml")}}


def _check_files(mp, files) -> None:
    s, run = mp.setup, mp.run
    args, accel, cfg = files["training_args.yaml"], files["accelerate.yaml"], files["run.yaml"]
    # steps and run time: one source of truth for the headline, the header and max_steps
    assert args["max_steps"] == cfg["schedule"]["max_steps"] == run.steps
    assert f"run: {run.steps:,} steps" in files["texts"]["training_args.yaml"]
    assert run.hours * 3600 == pytest.approx(run.steps * mp.speed.step_seconds, rel=1e-9)
    # precision: the autocast switches follow a mixed precision; a pure 16-bit one is the weights' dtype
    assert cfg["training"]["precision"] == s.precision
    assert args["bf16"] is (s.precision == "bf16-mixed") and args["fp16"] is (s.precision == "fp16-mixed")
    if s.zero_stage == 0:
        assert accel["mixed_precision"] == {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(s.precision, "no")
    if s.precision in ("bf16", "fp16"):
        want = {"bf16": "bfloat16", "fp16": "float16"}[s.precision]
        assert args["model_init_kwargs"] == {"dtype": want}
        assert f"precision {s.precision}: the model's weights are {want}" in files["texts"]["accelerate.yaml"]
    # LoRA targets: the plan's, the run config's and PEFT's
    if s.lora is not None:
        assert files["lora.yaml"]["target_modules"] == cfg["training"]["lora"]["target_modules"] == \
            list(s.lora.target_modules)


@pytest.mark.parametrize("model,hardware,flavor,method", CASES,
                         ids=[f"{m}-{h or f}" for _, h, f, m in CASES])
def test_estimate_plan_and_files_agree(model, hardware, flavor, method, tmp_path):
    target = {"hardware": hardware} if hardware else {"flavor": flavor}
    try:
        result, req = plan_for(model, method=method, examples=EXAMPLES, mode=["balanced"], **target)
    except UnavailableError as exc:  # QLoRA off CUDA: estimate refuses it the same way
        assert method == "qlora" and "bitsandbytes" in str(exc)
        return
    catalog_hw = hardware or f"{flavor_hardware(load_cloud_catalog().get(flavor)).gpu_count}x " \
        f"{flavor_hardware(load_cloud_catalog().get(flavor)).gpus[0].catalog_id}"
    if flavor:  # the flavor's own host RAM, not a typical host's nor this machine's
        ram = load_cloud_catalog().get(flavor).ram_gib
        assert req.hardware.memory.total_bytes == int(ram * GIB)
    fitting = [mp for mp in result.modes if mp.fits]
    if method == "full":  # auto is the same rule as full (one default method)
        again, _ = plan_for(model, method="auto", examples=EXAMPLES, mode=["balanced"], **target)
        assert [m.setup for m in again.modes] == [m.setup for m in result.modes]
    for mp in fitting:
        s = mp.setup
        # host RAM: what the setting keeps there fits the machine planned for
        assert mp.host_ram_bytes == host_ram_need_bytes(mp.memory, s, req.hardware)
        assert result.host_ram_usable_bytes == req.hardware.memory.usable_bytes
        if not ram_is_the_device(s, req.hardware):
            assert mp.host_ram_bytes <= req.hardware.memory.usable_bytes
        # LoRA targets: one default (rank 16 on every linear layer of the blocks)
        if s.lora is not None:
            assert list(s.lora.target_modules) == default_lora(mp.model).target_modules
        _check_files(mp, _files(mp, req, tmp_path))
        if req.usd_per_hour is not None:  # cost of what will run
            assert mp.run.rental_usd == pytest.approx(mp.run.hours * req.usd_per_hour, rel=1e-9)
        if s.hybrid_shard:
            continue  # estimate has no flag for hybrid sharding
        mem, est_setup, nearest, run = estimate_run(model, hardware=catalog_hw, **_estimate_flags(s))
        assert est_setup == s, "estimate resolves the plan's flags to another setting"
        assert nearest is None and mem.fits is True
        for mine, theirs in zip(mp.memory.devices, mem.devices, strict=True):
            assert theirs.device == mine.device
            assert theirs.needed_bytes == mine.needed_bytes
            assert theirs.fits_under_pressure == mine.fits_under_pressure
        assert mem.params_trainable == mp.memory.params_trainable
        assert run.speed.step_seconds == pytest.approx(mp.speed.step_seconds, rel=1e-9)
        budget = mp.data_io.budget if mp.data_io is not None else None
        if budget is None or not budget.capped_by:
            assert run.speed.total_steps == mp.run.steps
            assert run.speed.total_seconds / 3600 == pytest.approx(mp.run.hours, rel=1e-9)
        else:  # the mode's hours cut the run: fewer steps than the whole data, about the mode's hours
            assert mp.run.steps < run.speed.total_steps
            assert mp.run.hours <= mp.targets.hours_max + mp.speed.step_seconds / 3600


FLAVORS = ("t4-small", "vast-rtx-3090", "lambda-1x-h100-sxm", "runpod-h100-sxm", "a10g-largex2", "l4x4")


@pytest.mark.parametrize("method", ("full", "lora", "dpo"))
def test_cloud_agrees_with_estimate_and_checks_each_flavors_ram(method):
    from trainfit.core.memory import estimate_memory
    from trainfit.core.models.catalog import resolve_model

    spec = resolve_model(MID)
    ranking = cloud(MID, method=method, examples=EXAMPLES, seq_len=1024, flavors=list(FLAVORS))
    catalog = load_cloud_catalog()
    assert len(ranking.results) == len(FLAVORS) and sum(r.fits for r in ranking.results) >= 4
    for row in ranking.results:
        if not row.fits:
            continue
        flavor = catalog.get(row.flavor)
        hw = flavor_hardware(flavor)
        flags = dict(method="dpo" if row.method.startswith("dpo") else row.method, precision=row.precision,
                     micro_batch=row.micro_batch, grad_accum=row.grad_accum, seq_len=1024,
                     grad_checkpointing=row.grad_checkpointing, zero=row.zero_stage, offload=row.offload,
                     gpus=flavor.gpu_count, examples=EXAMPLES)
        if row.method.endswith("qlora") or row.method == "qlora":
            flags["quant"] = "nf4-dq"
        if row.method.startswith("dpo+"):
            flags["lora_r"] = 16
        mem, setup, _, run = estimate_run(MID, hardware=f"{flavor.gpu_count}x {flavor.gpu}", **flags)
        if setup.lora is not None:  # the same default adapters
            assert list(setup.lora.target_modules) == default_lora(spec).target_modules
        assert row.memory_gib_per_device * GIB == pytest.approx(mem.devices[0].needed_bytes, rel=1e-12)
        assert row.tokens_per_second == pytest.approx(run.speed.tokens_per_second, rel=1e-9)
        assert row.hours == pytest.approx(run.speed.total_seconds / 3600 + 10 / 60, rel=1e-9)
        assert row.cost_usd == pytest.approx(row.hours * flavor.usd_per_hour, rel=1e-9)
        # the flavor's own RAM holds what the setting keeps on the host
        on_flavor = estimate_memory(spec, setup, hw)
        assert host_ram_need_bytes(on_flavor, setup, hw) <= hw.memory.usable_bytes


def test_the_three_commands_share_one_default_method():
    import argparse

    from trainfit.cli import cmd_cloud, cmd_estimate, cmd_plan

    defaults = []
    for mod in (cmd_estimate, cmd_plan, cmd_cloud):
        p = argparse.ArgumentParser()
        mod.add_arguments(p)
        defaults.append(p.parse_args(["x"] if mod is not cmd_plan else []).method)
    assert defaults == [DEFAULT_METHOD] * 3


# ---------------------------------------------------------------------------------------------
# the issue's own reproductions, through the real CLI
def _cli(*argv, ok=(0, 3)):
    done = subprocess.run([sys.executable, "-m", "trainfit", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode in ok, done.stderr
    return done


def test_cloud_does_not_rank_an_offload_the_flavors_ram_cannot_hold():
    doc = json.loads(_cli("cloud", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "full", "--examples", "10000",
                          "--seq-len", "1024", "--flavor", "t4-small", "--json").stdout)
    (row,) = doc["results"]
    assert row["offload"] in (None, "none"), "ZeRO-2 + optimizer offload needs ~35 GiB; t4-small has 15 GiB"


def test_plan_for_a_flavor_reports_the_flavors_ram():
    doc = json.loads(_cli("plan", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "full", "--examples", "10000",
                          "--seq-len", "1024", "--flavor", "t4-small", "--json").stdout)
    assert 13 * GIB < doc["host_ram_usable_bytes"] <= 15 * GIB  # t4-small's 15 GiB less the OS' share
    for mode in doc["modes"]:
        assert 0 < mode["host_ram_bytes"] <= doc["host_ram_usable_bytes"]
        cache = mode["data_io"]["reasons"]["cache"]
        left = float(cache.split(" vs ")[1].split(" GiB")[0].replace(",", ""))
        assert left < 15  # a share of the flavor's 15 GiB, not of a 64 GiB host
        assert not any(d["device"] == "cpu" for d in mode["memory"]["devices"])


def test_host_ram_counts_offloaded_states_once_70b_on_8x_h100():
    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.memory import estimate_memory
    from trainfit.core.models.catalog import resolve_model
    from trainfit.core.setup import TrainingSetup

    hw = resolve_hardware("8x h100-sxm")
    s = TrainingSetup(method="full", micro_batch=4, seq_len=2048, num_gpus=8, zero_stage=3, offload="optimizer",
                      grad_checkpointing="full", attention="flash")
    mem = estimate_memory(resolve_model("meta-llama/Meta-Llama-3-70B"), s, hw)
    cpu = next(d for d in mem.devices if d.device == "cpu")
    assert host_ram_need_bytes(mem, s, hw) == cpu.total_bytes  # estimate's 1,577 GiB, not 2,628
    result, _ = plan_for("meta-llama/Meta-Llama-3-70B", method="full", hardware="8x h100-sxm", examples=1000,
                         mode=["balanced"])
    (mp,) = result.modes
    assert mp.fits and mp.setup.offload != "none"
    need = host_ram_need_bytes(mp.memory, mp.setup, resolve_hardware("8x h100-sxm"))
    assert need < 1700 * GIB
    # over the mode's share of the host: said, with the host's figure
    assert any(w.startswith("host RAM:") and "1945.6 GiB usable" in w for w in mp.warnings)


def test_headline_steps_and_cost_are_what_the_files_run(tmp_path):
    out = tmp_path / "configs"
    done = _cli("plan", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--hardware", "a10g", "--examples", "10000",
                "--mode", "conservative", "--usd-per-hour", "1.5", "--out", str(out))
    text = " ".join(done.stdout.split())
    args = yaml.safe_load((out / "conservative" / "training_args.yaml").read_text())
    assert f"({args['max_steps']:,} steps)" in text
    hours = float(text.split("run time ")[1].split(" h")[0])
    assert hours <= 2.05  # conservative's 2 h cut the run: the headline is the cut run
    rental = float(text.split("rental $")[1].split()[0].rstrip(";,"))
    assert rental <= 1.5 * 2.05


def test_estimate_default_lora_targets_are_the_plans():
    mem, setup, _, _ = estimate_run("Qwen/Qwen2.5-7B-Instruct", hardware="a10g", method="lora")
    assert setup.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert mem.params_trainable == 40_370_176


def test_estimate_and_plan_print_one_memory_figure_and_verdict():
    result, _ = plan_for("Qwen/Qwen2.5-7B-Instruct", method="lora", hardware="a10g", examples=10000,
                         mode=["extreme"])
    (mp,) = result.modes
    s = mp.setup
    done = _cli("estimate", "Qwen/Qwen2.5-7B-Instruct", "--hardware", "a10g", "--method", "lora",
                "--micro-batch", str(s.micro_batch), "--grad-accum", str(s.grad_accum), "--seq-len", str(s.seq_len),
                "--grad-checkpointing", s.grad_checkpointing, "--attn", s.attention)
    text = " ".join(done.stdout.split())
    figure = f"{mp.memory_used_bytes / GIB:.2f}"
    assert f"needs {figure} of" in text
    pressed = any(d.fits_under_pressure for d in mp.memory.devices)
    assert ("fits under memory pressure" in text) is pressed
    from trainfit.cli.render_plan import memory_text

    assert memory_text(mp).startswith(f"{figure} GiB per device")
    assert ("fits under memory pressure" in memory_text(mp)) is pressed


def test_time_budget_in_minutes_is_never_written_as_a_fraction_of_an_hour():
    done = _cli("plan", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--hardware", "a10g", "--examples", "100000",
                "--time-budget", "5m")
    assert "0.0833" not in done.stdout and "e+0" not in done.stdout and " 0 min" not in done.stdout
    assert "5 min" in " ".join(done.stdout.split())


def test_inference_speed_is_per_batch():
    done = _cli("plan", "Qwen/Qwen2.5-0.5B", "--method", "inference", "--hardware", "a10g", "--mode", "balanced")
    text = " ".join(done.stdout.split())
    assert "per optimizer step" not in text and "per batch of" in text


def test_duration_text_never_writes_exponents_or_zero_minutes():
    from trainfit.core.durations import duration_text, hours_text

    assert duration_text(1100) == "18 min" and duration_text(0.31) == "0.31 s" and duration_text(19.1) == "19.1 s"
    assert hours_text(5 / 60) == "5 min" and hours_text(2) == "2 h" and hours_text(4.6) == "4.6 h"
    assert hours_text(1 / 600) == "6 s" and duration_text(4800) == "80 min" and hours_text(1520) == "1,520 h"
    for seconds in (0.001, 0.5, 59, 89.9, 90, 599, 3600, 5399, 86400, 1e7):
        text = duration_text(seconds)
        assert "e+" not in text and "e-" not in text and text != "0 min" and not text.startswith("0 min")
        assert not math.isnan(seconds)


# ---------------------------------------------------------------------------------------------
# reasons that agree with the choice
@pytest.mark.parametrize("hardware", ("8x h100-sxm", "4x a100-80gb", "2x rtx-4090", "2 nodes x 8x h100-sxm"))
def test_the_sharding_reason_names_the_sharding_chosen(hardware):
    result, _ = plan_for(MID, method="full", hardware=hardware, examples=2000)
    for mp in result.modes:
        s = mp.setup
        text = " ".join(mp.reasons)
        assert "shards cheaply" not in text and "communicates least" not in text
        chosen = ("FSDP hybrid sharding" if s.hybrid_shard else f"ZeRO-{s.zero_stage}") if s.zero_stage else "DDP"
        assert any(f"the chosen setting runs {chosen}" in r for r in mp.reasons)


def test_the_method_reason_does_not_say_the_chosen_tier_did_not_fit():
    result, _ = plan_for(MID, method="full", hardware="a10g", examples=2000)
    for mp in result.modes:
        line = next(r for r in mp.reasons if "chosen because" in r)
        winner, rest = line.split(": chosen because", 1)
        assert f"{winner} needs" not in rest and "tried first" not in line


def _candidate(mb: int, ckpt: str, step_s: float):
    from trainfit.core.plan.engine import Candidate
    from trainfit.core.setup import TrainingSetup
    from trainfit.core.speed.types import SpeedEstimate

    speed = SpeedEstimate.__new__(SpeedEstimate)
    object.__setattr__(speed, "step_seconds", step_s)
    return Candidate(TrainingSetup(micro_batch=mb, grad_checkpointing=ckpt, seq_len=1024), None, 0.5, speed)


def test_the_checkpointing_reason_never_claims_a_batch_it_does_not_gain():
    from trainfit.core.plan.plan_reasons import checkpointing_reason

    same = checkpointing_reason(_candidate(1, "full", 2.0), _candidate(1, "none", 2.5))
    assert "allows micro-batch" not in same and "(micro-batch 1" in same and "2 s per step against 2.5 s" in same
    larger = checkpointing_reason(_candidate(4, "full", 2.0), _candidate(1, "none", 2.5))
    assert larger.startswith("gradient checkpointing: it allows micro-batch 4 where at most 1 fits")
    slower = checkpointing_reason(_candidate(4, "full", 3.0), _candidate(2, "none", 2.5))
    assert "predicted faster" not in slower and "kept by this mode's ranking" in slower


def test_estimate_checks_the_host_ram_as_plan_does(tmp_path):
    """A machine whose RAM cannot hold the 16-bit model in each of its two processes while they load:
    estimate says so (exit 3, with the nearest setting), and plan does not pick that setting."""
    import dataclasses

    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.memory import estimate_memory
    from trainfit.core.models.catalog import resolve_model
    from trainfit.core.serde import to_jsonable

    hw = resolve_hardware("2x rtx-4090")
    ram = 16 * GIB
    hw = dataclasses.replace(hw, source="file:small-ram", memory=dataclasses.replace(
        hw.memory, total_bytes=ram, available_bytes=ram - GIB, usable_bytes=ram - GIB))
    path = tmp_path / "small-ram.json"
    path.write_text(json.dumps(to_jsonable(hw)))
    model = "Qwen/Qwen2.5-7B-Instruct"
    mem, setup, nearest, _ = estimate_run(model, hardware=str(path), method="lora", gpus=2, seq_len=512,
                                          grad_checkpointing="full", no_calibration=True)
    assert mem.fits is True and host_ram_need_bytes(mem, setup, hw) > hw.memory.usable_bytes
    if nearest is not None:  # the nearest setting estimate names fits the host too
        assert host_ram_need_bytes(estimate_memory(resolve_model(model), nearest, hw), nearest, hw) \
            <= hw.memory.usable_bytes
    done = _cli("estimate", model, "--hardware", str(path), "--method", "lora", "--gpus", "2", "--seq-len", "512",
                "--grad-checkpointing", "full", "--no-calibration", "--json")
    doc = json.loads(done.stdout)
    assert done.returncode == 3 and doc["fits"] is False and doc["host_ram_bytes"] > doc["host_ram_usable_bytes"]
    result, req = plan_for(model, method="lora", hardware=str(path), examples=1000)
    assert any(mp.fits for mp in result.modes)
    for mp in result.modes:
        assert not mp.fits or mp.host_ram_bytes <= req.hardware.memory.usable_bytes


def test_a_dpo_plan_prices_the_run_its_files_run():
    """--usd-per-hour prices the run max_steps runs, not the whole data the mode's hours cut."""
    result, req = plan_for("Qwen/Qwen2.5-1.5B-Instruct", method="dpo", hardware="a10g", examples=10000,
                           usd_per_hour=1.5, mode=["conservative"])
    (mp,) = result.modes
    assert mp.data_io.budget.capped_by == "time" and mp.run.steps == mp.data_io.budget.steps
    assert mp.run.hours <= 2 + mp.speed.step_seconds / 3600
    assert mp.run.rental_usd == pytest.approx(mp.run.hours * 1.5, rel=1e-9) and mp.run.rental_usd <= 3.01
    assert mp.run.energy_kwh == pytest.approx(mp.power.energy_kwh, rel=1e-9)
