"""The second hardening pass's "tracebacks and silent nonsense": each hostile input found by the
probe is refused through the real CLI with a one-line message (exit 2 for bad input, 4 for a full
disk), no traceback, a bounded message, and nothing left behind."""

from __future__ import annotations

import copy
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainfit.cli.main import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
LONG = "a" * 300  # one path part over the 255 bytes every common filesystem allows
HUGE_INT = "9" * 5000  # over Python's 4,300-digit limit for int(str)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.err


def refused(capsys, *argv: str, code: int = 2) -> str:
    got, err = run_cli(capsys, *argv)
    assert got == code, err
    message = err.strip().splitlines()[-1]  # training logs its progress before the error
    assert "Traceback" not in err and message.startswith("trainfit: error:"), err
    assert len(message) < 1000, f"message of {len(message)} characters"
    return message


def _tiny_config(tmp_path: Path, name: str = "run.yaml", **sections) -> Path:
    cfg = {"version": 1, "method": "pretrain", "model": {"shape": {"layers": 1, "hidden": 64, "heads": 4}},
           "data": {"paths": ["builtin:tiny-corpus"], "max_samples": 200},
           "tokenizer": {"vocab_size": 300, "train_max_bytes": 50_000},
           "training": {"precision": "fp32", "micro_batch": 2, "seq_len": 32},
           "schedule": {"max_steps": 2, "lr": 1e-3}}
    cfg.update(sections)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


# ---------------------------------------------------------------- names too long for a filesystem
@pytest.mark.parametrize("argv", [
    ["models", "show", LONG],
    ["estimate", LONG, "--hardware", "rtx-4090"],
    ["estimate", f"./{LONG}", "--hardware", "rtx-4090"],
    ["estimate", f"{LONG}/config.json", "--hardware", "rtx-4090"],
    ["plan", LONG, "--hardware", "rtx-4090"],
    ["estimate", f"shape:layers=2,hidden=64,heads=4,{LONG}=1", "--hardware", "rtx-4090"],
    ["estimate", "llama-3.2-1b", "--hardware", LONG],
    ["plan", "llama-3.2-1b", "--hardware", LONG],
    ["analyze", "--hardware", LONG, "--profile-only"],
    ["estimate", "llama-3.2-1b", "--hardware", f"{LONG}.json"],
    ["train", f"{LONG}.yaml"],
    ["verify", f"{LONG}.yaml"],
    ["train", str(EXAMPLES / "pretrain.yaml"), "--out", LONG],
    ["profile", "--quick", "--out", LONG],
    ["plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--data", LONG],
    ["plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--out", LONG],
])
def test_names_over_255_bytes_are_refused_in_one_short_line(capsys, argv):
    err = refused(capsys, *argv)
    assert LONG not in err  # quoted in a few dozen characters, not echoed whole


# ---------------------------------------------------------------- integers over 4,300 digits
def _llama_config(**overrides) -> dict:
    return {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 256, **overrides}


def test_config_json_with_a_5000_digit_integer(capsys, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_llama_config()).replace('"vocab_size": 256', f'"vocab_size": {HUGE_INT}'))
    for argv in (["models", "show", str(d)], ["estimate", str(d), "--hardware", "rtx-4090"]):
        assert "4,300 digits" in refused(capsys, *argv)


def test_safetensors_shape_with_a_5000_digit_integer(capsys, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(_llama_config()))
    header = ('{"w": {"dtype": "F32", "shape": [' + HUGE_INT + ', 1], "data_offsets": [0, 4]}}').encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    assert "4,300 digits" in refused(capsys, "models", "show", str(d))


def test_cloud_price_file_with_a_5000_digit_price(capsys, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"flavors:\n  - {{id: x, usd_per_hour: {HUGE_INT}, gpu: h100-sxm, gpu_count: 1}}\n")
    assert "4,300 digits" in refused(capsys, "cloud", "llama-3.2-1b", "--examples", "1000", "--prices", str(prices))


def test_run_config_with_a_5000_digit_seed(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(_tiny_config(tmp_path).read_text() + f"seed_extra: {HUGE_INT}\n")
    for cmd in (["train", str(config), "--out", str(tmp_path / "run")], ["verify", str(config)]):
        assert "4,300 digits" in refused(capsys, *cmd)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- deeply nested and oversize documents
@pytest.mark.parametrize("name, text", [
    ("deep.json", "[" * 100_000 + "]" * 100_000),
    ("deep.jsonl", '{"a":' * 100_000 + "1" + "}" * 100_000),
    ("deep150.jsonl", '{"text": ' + "[" * 150 + "]" * 150 + "}"),  # parses, but no dataset row is 150 deep
])
def test_plan_data_nested_too_deeply(capsys, tmp_path, name, text):
    data = tmp_path / name
    data.write_text(text)
    assert "nested" in refused(capsys, "plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--data", str(data))


def test_a_hardware_profile_nested_too_deeply(capsys, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"gpus": ' + "[" * 150 + "]" * 150 + "}")  # parses, but no profile is 150 deep
    assert "nested more than 100 levels deep" in refused(capsys, "estimate", "qwen2.5-0.5b", "--hardware", str(deep))


@pytest.mark.parametrize("doc, levels, deeper", [
    (1, 0, False), ([], 0, True), ([], 1, False), ({"a": [1, {"b": []}]}, 4, False), ({"a": [1, {"b": []}]}, 3, True),
    ([[[]]] * 3, 3, False), ("5000 deep", 4999, True),
])
def test_one_depth_check_for_every_json_reader(doc, levels, deeper):
    """validate.nested_deeper_than: the Hub's JSON (hub_http), --data rows (dataset_size), profiles."""
    from trainfit.validate import nested_deeper_than

    if doc == "5000 deep":  # past the recursion limit: the walk recurses not
        doc = []
        for _ in range(4999):
            doc = [doc]
    assert nested_deeper_than(doc, levels) is deeper


def test_plan_data_on_a_fifo_or_a_device_is_refused_at_once(capsys, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for data in (str(fifo), "/dev/zero"):
        err = refused(capsys, "plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--data", data)
        assert "not a regular file" in err


def _laughs(levels: int) -> str:
    """A flow list whose anchors each repeat the one before nine times: 9**levels values."""
    parts = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


@pytest.mark.parametrize("section, key", [
    (None, "method"), (None, "version"), ("training", "precision"), ("schedule", "lr"),
    ("training", "micro_batch"), ("data", "format"), ("model", "weights"),
])
def test_yaml_alias_bomb_is_quoted_in_a_few_dozen_characters(capsys, tmp_path, section, key):
    base = _tiny_config(tmp_path).read_text()
    for levels, needle in ((3, "..."), (9, "1,000,000 values")):  # 729 values: quoted short; 387M: refused
        line = f"{key}: {_laughs(levels)}" if section is None else f"{section}:\n  {key}: {_laughs(levels)}"
        kept = [block for block in base.split("\n") if not block.startswith(f"{section or key}:")]
        if section is not None:  # drop the section's indented lines too
            text = yaml.safe_load(base)
            text.pop(section, None)
            kept = yaml.safe_dump(text).splitlines()
        config = tmp_path / f"laughs-{levels}.yaml"
        config.write_text("\n".join(kept) + "\n" + line + "\n")
        err = refused(capsys, "train", str(config), "--out", str(tmp_path / "run"))
        assert needle in err and len(err) < 400, err
    assert not (tmp_path / "run").exists()


def test_yaml_alias_bomb_as_a_price_file(capsys, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"flavors: {_laughs(9)}\n")
    assert "1,000,000 values" in refused(capsys, "cloud", "llama-3.2-1b", "--examples", "1000", "--prices", str(prices))


# ---------------------------------------------------------------- duplicate keys
def test_a_second_schedule_block_is_refused_not_merged(capsys, tmp_path):
    config = tmp_path / "dup.yaml"
    config.write_text("version: 1\nmethod: pretrain\nmodel: {shape: {layers: 1, hidden: 64, heads: 4}}\n"
                      "data: {paths: [builtin:tiny-corpus]}\nschedule:\n  lr: 1.0e-3\n  seed: 7\n"
                      "training: {micro_batch: 2}\nschedule:\n  max_steps: 5\n")
    err = refused(capsys, "train", str(config), "--out", str(tmp_path / "run"))
    assert "'schedule' is given twice (lines 5 and 9)" in err
    assert not (tmp_path / "run").exists()


def test_duplicate_key_inside_a_flow_mapping_and_merge_keys_still_work(tmp_path):
    from trainfit.errors import BadInputError
    from trainfit.validate import parse_yaml

    with pytest.raises(BadInputError, match="'lr' is given twice"):
        parse_yaml("schedule: {lr: 1, lr: 2}\n", "x.yaml")
    merged = parse_yaml("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\n", "x.yaml")  # an override, not a duplicate
    assert merged["d"] == {"x": 3, "y": 2}


def test_duplicate_keys_in_a_shape_spec(capsys):
    err = refused(capsys, "estimate", "shape:layers=2,layers=4,hidden=64,heads=4", "--hardware", "rtx-4090")
    assert "'layers' is given twice" in err


# ---------------------------------------------------------------- numbers and digits
def test_memory_budget_of_400_digits(capsys):
    err = refused(capsys, "plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--memory-budget", "9" * 400 + "GiB")
    assert "--memory-budget: must be more than 0 and at most 1024 TiB" in err


def test_time_budget_of_400_digits(capsys):
    err = refused(capsys, "plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--time-budget", "9" * 400 + "h")
    assert "--time-budget" in err


@pytest.mark.parametrize("spec", ["٢x rtx-4090", "cpu-٦٤gb", "２x rtx-4090", "٢ nodes x 8x h100-sxm"])
def test_non_ascii_digits_in_hardware_are_refused_as_flags_refuse_them(capsys, spec):
    assert "ASCII digits" in refused(capsys, "estimate", "llama-3.2-1b", "--hardware", spec)


def test_non_ascii_digits_in_a_shape_spec(capsys):
    assert "ASCII digits" in refused(capsys, "estimate", "shape:layers=٢,hidden=64,heads=4", "--hardware", "rtx-4090")


@pytest.mark.parametrize("argv", [
    ["analyze", "--hardware", "", "--profile-only"],
    ["analyze", "--hardware", " ", "--profile-only"],
    ["estimate", "llama-3.2-1b", "--hardware", ""],
    ["plan", "llama-3.2-1b", "--hardware", ""],
])
def test_empty_hardware_is_refused_everywhere(capsys, argv):
    assert "--hardware: empty" in refused(capsys, *argv)


# ---------------------------------------------------------------- profile values, not only types
def _profile_with(tmp_path: Path, name: str, section: str, key: str, value, index: int | None = 0) -> Path:
    from trainfit.core.machines.hardware_spec import resolve_hardware

    data = json.loads(resolve_hardware("rtx-4090").to_json())
    target = data[section][index] if index is not None else data[section]
    target[key] = value
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name, section, key, value, index, needle", [
    ("bandwidth0", "gpus", "memory_bandwidth_gbps", 0, 0, "gpus[0].memory_bandwidth_gbps: must be more than 0"),
    ("vram-negative", "gpus", "vram_total_bytes", -5, 0, "gpus[0].vram_total_bytes: must be more than 0"),
    ("vram-zero", "gpus", "vram_total_bytes", 0, 0, "gpus[0].vram_total_bytes: must be more than 0"),
    ("vram-1e30", "gpus", "vram_total_bytes", 10**30, 0, "gpus[0].vram_total_bytes: must be from 0 to"),
    ("tflops-nan", "gpus", "peak_tflops", {"bf16": float("nan")}, 0, "gpus[0].peak_tflops.bf16: must be a finite"),
    ("tflops-negative", "gpus", "peak_tflops", {"bf16": -3.0}, 0, "gpus[0].peak_tflops.bf16: must be more than 0"),
    ("ram-negative", "memory", "total_bytes", -1, None, "memory.total_bytes: must be more than 0"),
    ("usable-negative", "memory", "usable_bytes", -(1 << 30), None, "memory.usable_bytes: must be from 0"),
    ("cores-negative", "cpu", "logical_cores", -4, None, "cpu.logical_cores: must be more than 0"),
    ("cores-zero", "cpu", "usable_cores", 0.0, None, "cpu.usable_cores: must be more than 0"),
])
def test_profile_values_outside_what_a_machine_has_are_refused(capsys, tmp_path, name, section, key, value, index,
                                                               needle):
    path = _profile_with(tmp_path, name, section, key, value, index)
    for cmd in ("estimate", "plan"):
        err = refused(capsys, cmd, "llama-3.2-1b", "--hardware", str(path))
        assert needle in err and "nan h" not in err


def test_every_catalog_machine_passes_the_profile_value_check():
    from trainfit.core.machines.hardware_spec import resolve_hardware
    from trainfit.core.machines.profile import HardwareProfile, value_problems

    for spec in ("rtx-4090", "8x h100-sxm", "m2-16gb", "cpu", "cpu-64gb", "2 nodes x 8x h100-sxm", "mi300x"):
        profile = resolve_hardware(spec)
        assert value_problems(profile) == []
        assert HardwareProfile.from_json(profile.to_json()) == profile


# ---------------------------------------------------------------- model shapes
def test_num_experts_per_tok_above_num_experts_is_refused(capsys, tmp_path):
    d = tmp_path / "moe"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "mixtral", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256, "num_local_experts": 4,
        "num_experts_per_tok": 8}))
    err = refused(capsys, "estimate", str(d), "--hardware", "rtx-4090")
    assert "num_experts_per_tok" in err and "8" in err and "4" in err


def test_train_refuses_an_absurd_shape_at_once(capsys, tmp_path):
    import time

    config = _tiny_config(tmp_path, model={"shape": {"layers": 100_000, "hidden": 1 << 20, "heads": 1024}})
    started = time.perf_counter()
    err = refused(capsys, "train", str(config), "--out", str(tmp_path / "run"))
    assert "1.32e+18 parameters" in err
    assert time.perf_counter() - started < 5  # estimate's refusal, before any allocation
    assert not (tmp_path / "run").exists()


def test_train_refuses_dev_zero_and_a_fifo_as_data_before_start_up(capsys, tmp_path):
    import time

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for data in ("/dev/zero", str(fifo)):
        config = _tiny_config(tmp_path, data={"paths": [data]})
        started = time.perf_counter()
        err = refused(capsys, "train", str(config), "--out", str(tmp_path / "run"))
        assert "not a regular file or a directory" in err
        assert time.perf_counter() - started < 5
        assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- writing
def test_gpus_json_to_a_full_device_exits_4_without_a_traceback():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "trainfit", "gpus", "--json"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert "no space left" in done.stderr


def test_train_without_out_in_a_read_only_directory_is_refused_before_work(capsys, tmp_path, monkeypatch):
    import time

    config = _tiny_config(tmp_path)
    work = tmp_path / "read-only"
    work.mkdir()
    work.chmod(0o555)
    monkeypatch.chdir(work)
    if os.geteuid() == 0:  # root writes anywhere: make the check see the mode bits as a user would
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p).resolve() == work.resolve()
                            else real_access(p, mode, **kw))
    started = time.perf_counter()
    err = refused(capsys, "train", str(config))
    assert "the default run directory runs/run" in err and "give --out" in err
    assert time.perf_counter() - started < 5
    work.chmod(0o755)
    assert list(work.iterdir()) == []


def test_a_full_disk_during_a_checkpoint_exits_4_with_what_to_do_and_resumes(capsys, tmp_path, monkeypatch):
    import torch

    config = _tiny_config(tmp_path, schedule={"max_steps": 6, "lr": 1e-3, "seed": 3},
                          checkpointing={"every_steps": 2, "keep_last": 3})
    real_save = torch.save
    saves = {"n": 0}

    def save_until_full(obj, f, *args, **kwargs):
        if "optimizer" in str(f):
            saves["n"] += 1
            if saves["n"] == 2:  # the second checkpoint's optimizer state: what torch's zip writer says
                raise RuntimeError("[enforce fail at inline_container.cc:820] . unexpected pos 4160 vs 4054")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_full)
    run = tmp_path / "run"
    err = refused(capsys, "train", str(config), "--out", str(run), code=4)
    assert "disk filled up while writing the checkpoint of step 4" in err
    assert "--resume" in err and "checkpoint-2" in err
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["checkpoint-2"]  # the half-written one is gone, the complete one intact
    monkeypatch.setattr(torch, "save", real_save)
    code, err = run_cli(capsys, "train", str(config), "--out", str(run), "--resume")
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["global_step"] == 6


def test_profile_and_metrics_with_a_5000_digit_integer(capsys, tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"schema_version": 1, "gpus": []}).replace("[]", f"[{HUGE_INT}]"))
    err = refused(capsys, "estimate", "llama-3.2-1b", "--hardware", str(profile))
    assert "4,300 digits" in err and "set_int_max_str_digits" not in err
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("version: 1\n")
    (run / "metrics.jsonl").write_text(f'{{"step": {HUGE_INT}, "loss": 1.0}}\n')
    assert "4,300 digits" in refused(capsys, "report", str(run), "--out", str(tmp_path / "report"))
