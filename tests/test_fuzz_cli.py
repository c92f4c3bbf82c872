"""Fuzz every subcommand with malformed values, files and configs (a seeded generator, so a
failure reproduces), and hold each run to the CLI's contract:

* the exit code is 0, 2, 3 or 4 (never 1: that is an unhandled error);
* no traceback reaches the user;
* nothing is left behind in the working directory (the inputs are all invalid, so no command
  may write anything);
* every run finishes within CASE_SECONDS.

A second test points the Hub commands at a fake Hub (bench/_fake_hub.py) whose answers are drawn
from hostile behaviours: slow, endless, compressed, oversized, nested, of the wrong shape.

Runs in-process (`trainfit.cli.main.main`), so several hundred cases take about a minute. The
generators include oversize documents (integers over 4,300 digits, YAML alias bombs), documents
nested past any parser's limit, duplicate keys, names over 255 bytes, a FIFO and /dev/zero as data.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
import struct
import time
from pathlib import Path

import _fake_hub as fh
import pytest
import yaml

from trainfit.cli.main import main
from trainfit.hub import models as hub_models

SEED = 20261123
CASES = 1200
CASE_SECONDS = 20
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

BAD_NUMBERS = ["0", "-1", "-0.5", "nan", "NaN", "inf", "-inf", "1e999", "-1e999", "99999999999999999999999",
               "1e30", "", " ", "abc", "1.5.2", "0x10", "１", "1e", "--", "٣", "2**10", "1/2"]
BAD_WORDS = ["", " ", "../../etc/passwd", "\u202e", "a" * 500, "nul\x01char", "--", "-x", "💥", "%s%n", "None",
             "b" * 300 + ".json", "x/" + "c" * 300]
BAD_MODELS = ["", " ", "shape:", "shape:0", "shape:1e999", "shape:99999999999999999t", "shape:-5m",
              "shape:layers=-1,hidden=64,heads=4", "shape:layers=2,hidden=1000,heads=7",
              "shape:layers=2,hidden=99999999999999,heads=1", "shape:layers=90000,hidden=1000000,heads=1000",
              "shape:layers=2,hidden=64,heads=4,kv_heads=3", "shape:layers=x", "shape:foo=1", "1e999b", "0m",
              "a/b/c/d", "./missing-dir", "owner/", "/", "~nouser/x", "qwen9.9-99b",
              # names over 255 bytes, duplicate and non-ASCII keys, an absurd shape
              "m" * 300, "./" + "m" * 300, "owner/" + "m" * 300, "shape:layers=2,layers=4,hidden=64,heads=4",
              "shape:layers=٢,hidden=64,heads=4", "shape:layers=100000,hidden=1048576,heads=1024",
              "shape:" + "9" * 5000]
BAD_HARDWARE = ["", " ", "-3x rtx-4090", "0x a100-80gb", "99x h100-sxm", "17x h100-sxm", "cpu-0gb", "cpu-999999gb",
                "rtx", "x", "1x", "2x m2-16gb", "nan x h100", "1.5x a100-80gb", "h100-sxm x 2",
                "0 nodes x 8x h100-sxm", "2 nodes x cpu", "99999 nodes x 8x h100-sxm", "2 nodes x",
                "2 nodes x 8x h100-sxm over nope", "2x 2x 2x a100-80gb", "rtx-4090 over ib-ndr", "a.json,b.json",
                "2 nodes x m2-16gb", "h" * 300, "٢x rtx-4090", "cpu-٦٤gb", "2x " + "h" * 300, "h" * 300 + ".json"]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    """Input files that are each wrong in a different way."""
    d = tmp_path_factory.mktemp("fuzz-inputs")
    rng = random.Random(SEED)
    files: dict[str, Path] = {}

    def put(name: str, data: bytes | str) -> None:
        p = d / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        files[name] = p

    put("binary.yaml", bytes(rng.randrange(256) for _ in range(2048)))
    put("nul.yaml", b"version: 1\x00\x00\x00")
    put("latin1.yaml", "name: caf\u00e9".encode("latin-1"))
    put("empty.yaml", "")
    put("list.yaml", "- 1\n- 2\n")
    put("scalar.yaml", "42\n")
    put("broken.yaml", "version: [1\nmethod: {")
    put("deep.yaml", "[" * 5000 + "]" * 5000)
    put("anchors.yaml", "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)))
    put("nan.json", '{"cpu": NaN, "gpus": [1e999]}')
    put("prices.csv", "id,usd_per_hour,gpu,gpu_count\nx,inf,h100-sxm,1e999\n")
    put("prices.yaml", "flavors:\n  - {id: x, usd_per_hour: .nan, gpu: h100-sxm, gpu_count: -3}\n")
    put("profile.json", json.dumps({"schema": 99, "gpus": "many"}))
    (d / "a-directory.yaml").mkdir()
    files["a-directory.yaml"] = d / "a-directory.yaml"
    files["missing.yaml"] = d / "missing.yaml"
    files["proc"] = Path("/proc/version")
    for i in range(3):  # seeded: each run of the test sees the same hostile documents
        put(f"oversize-{i}.yaml", _oversize_document(rng, "yaml"))
        put(f"oversize-{i}.json", _oversize_document(rng, "json"))
        put(f"nested-{i}.json", _nested_document(rng, "json"))
        put(f"nested-{i}.jsonl", _nested_document(rng, "jsonl"))
        put(f"nested-{i}.yaml", _nested_document(rng, "yaml"))
        put(f"duplicate-{i}.yaml", _duplicate_keys_config(rng))
    os.mkfifo(d / "fifo.jsonl")
    files["fifo.jsonl"] = d / "fifo.jsonl"
    files.update(_bad_model_dirs(d))
    files.update(_bad_run_dirs(d))
    return files


def _oversize_document(rng: random.Random, kind: str) -> str:
    """A small file that is huge once read: an integer over Python's 4,300-digit limit, or YAML
    aliases that each repeat the one before ("billion laughs": 9**9 values from 1 KB)."""
    digits = "9" * rng.choice([4301, 5000, 20000])
    if kind == "json":
        return json.dumps({"schema_version": 1, "gpus": []}).replace("[]", f"[{digits}]")
    if rng.random() < 0.5:
        return f"version: 1\nmethod: pretrain\nschedule: {{seed: {digits}}}\n"
    levels = rng.choice([6, 9, 12])
    parts = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    key = rng.choice(["method", "version", "name", "flavors"])
    return f"{key}: [" + ", ".join(parts) + "]\n"


def _nested_document(rng: random.Random, kind: str) -> str:
    """JSON / YAML / JSONL nested past any parser's recursion limit, or past what a real file holds."""
    depth = rng.choice([150, 1000, 5000, 100_000])
    if kind == "jsonl":
        return '{"text": ' + "[" * depth + "]" * depth + "}\n"
    if kind == "json" and rng.random() < 0.5:
        return '{"a": ' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


def _duplicate_keys_config(rng: random.Random) -> str:
    """An example run config with one key written twice (a section, or a key inside one)."""
    example = rng.choice(sorted(EXAMPLES.glob("*.yaml")))
    text = example.read_text()
    if rng.random() < 0.5:
        return text + rng.choice(["schedule:\n  max_steps: 3\n", "method: sft\n", "version: 1\n",
                                  "training:\n  seq_len: 64\n"])
    return text + rng.choice(["extra: {a: 1, a: 2}\n", "data: {paths: [builtin:tiny-corpus], format: text, format: chat}\n"])


def _safetensors(header: dict, data_bytes: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes


def _raw_safetensors(header: str, data_bytes: int) -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes


def _bad_model_dirs(d: Path) -> dict[str, Path]:
    """Model directories whose config.json or safetensors files are wrong."""
    good = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 256}
    configs = {
        "model-heads": {**good, "hidden_size": 1000, "num_attention_heads": 7},
        "model-huge": {**good, "hidden_size": 1 << 20, "num_hidden_layers": 100_000, "vocab_size": 1 << 24},
        "model-types": {**good, "hidden_size": "64", "num_hidden_layers": 2.5},
        "model-remote": {"model_type": "my_arch", "auto_map": {"AutoModel": "x.Y"}},
        "model-experts": {**good, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8},
    }
    out = {}
    for name, cfg in configs.items():
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps(cfg))
        out[name] = d / name
    (d / "model-bigint").mkdir()  # an integer over 4,300 digits in config.json
    (d / "model-bigint" / "config.json").write_text(json.dumps(good).replace('"vocab_size": 256',
                                                                            '"vocab_size": ' + "9" * 5000))
    out["model-bigint"] = d / "model-bigint"
    weights = {
        "model-traversal": None,
        "model-truncated": _safetensors({"w": {"dtype": "F32", "shape": [64, 64], "data_offsets": [0, 16384]}}, 10),
        "model-badshape": _safetensors({"w": {"dtype": "F32", "shape": ["64", -1], "data_offsets": [0, 0]}}, 0),
        "model-badlen": struct.pack("<Q", 1 << 60) + b"{}",
        "model-bigshape": _raw_safetensors('{"w": {"dtype": "F32", "shape": [' + "9" * 5000 + ', 1], '
                                           '"data_offsets": [0, 4]}}', 4),
        "model-deepheader": _raw_safetensors('{"w": ' + "[" * 5000 + "]" * 5000 + "}", 0),
    }
    for name, blob in weights.items():
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps(good))
        if blob is None:
            (d / name / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"w": "../../../../etc/passwd"}}))
        else:
            (d / name / "model.safetensors").write_bytes(blob)
        out[name] = d / name
    return out


def _bad_run_dirs(d: Path) -> dict[str, Path]:
    """Run directories for `report`: broken metrics, an empty one, and a valid one (given only with
    a bad --out, so that nothing is written)."""
    step = json.dumps({"step": 1, "loss": 5.0, "time": 1.7e9})
    metrics = {"run-broken": f"{step}\n{{\"step\": 2, \"loss\": \n{step}\n", "run-types": '{"step": "x"}\n',
               "run-sample": '{"event": "sample", "time": "now", "gpus": 3}\n', "run-valid": f"{step}\n",
               "run-empty": None}
    out = {}
    for name, text in metrics.items():
        (d / name).mkdir()
        if text is not None:
            (d / name / "config.yaml").write_text("version: 1\n")
            (d / name / "metrics.jsonl").write_text(text)
        out[name] = d / name
    return out


def _mutated_config(rng: random.Random, d: Path, n: int) -> Path:
    """An example run config with one number, list or section made invalid."""
    example = rng.choice(sorted(EXAMPLES.glob("*.yaml")))
    cfg = yaml.safe_load(example.read_text())
    section = rng.choice(["training", "schedule", "checkpointing", "logging", "tokenizer", "model", "data", None])
    bad_value = rng.choice([float("nan"), float("inf"), -1, 0, 10**30, -(10**30), "abc", [1, 2], {"x": 1}, None,
                            True, 1e-320])
    if section is None:
        cfg[rng.choice(["version", "method", "model", "data"])] = bad_value if bad_value is not None else []
    elif section == "model":
        cfg["model"] = {"shape": {"layers": bad_value, "hidden": 64, "heads": 4}}
    elif section == "data":
        cfg["data"] = {"paths": rng.choice([[], ["builtin:nope"], ["/proc/missing-file"], [bad_value]])}
    else:
        numeric = {"training": ["micro_batch", "grad_accum", "seq_len", "num_gpus", "zero_stage"],
                   "schedule": ["max_steps", "lr", "warmup_steps", "weight_decay", "max_grad_norm", "seed", "epochs"],
                   "checkpointing": ["every_steps", "keep_last"], "logging": ["every_steps"],
                   "tokenizer": ["vocab_size", "train_max_bytes"]}[section]
        key = rng.choice(numeric)
        # Only values no key of this kind accepts (0 is valid for some, so it is not used here).
        value = rng.choice([float("nan"), float("inf"), -1, 10**30, "abc", [1], {"x": 1}])
        cfg.setdefault(section, {})[key] = value
    path = d / f"mutated-{n}.yaml"
    path.write_text(yaml.safe_dump(cfg))  # NaN and infinity as .nan / .inf, as a user would type them
    return path


def _cases(files: dict[str, Path], d: Path) -> list[list[str]]:
    rng = random.Random(SEED)
    f = {k: str(v) for k, v in files.items()}
    input_files = [f[k] for k in ("binary.yaml", "nul.yaml", "latin1.yaml", "empty.yaml", "list.yaml", "scalar.yaml",
                                  "broken.yaml", "deep.yaml", "anchors.yaml", "nan.json", "a-directory.yaml",
                                  "missing.yaml", "proc", "profile.json")]
    input_files += [v for k, v in f.items() if k.startswith(("oversize-", "nested-", "duplicate-"))
                    and not k.endswith(".jsonl")]
    data_files = [v for k, v in f.items() if k.startswith("nested-")] + [f["fifo.jsonl"], "/dev/zero"]
    model_dirs = [v for k, v in f.items() if k.startswith("model-")]
    out_files = ["", " ", f["a-directory.yaml"], "/proc/version", "/proc/new-file", str(d / "no-such-dir" / "x.json"),
                 "/", f["binary.yaml"] + "/x"]
    out_dirs = ["", " ", f["binary.yaml"], "/proc/new-dir", f["binary.yaml"] + "/sub", "/proc/version"]
    numbers = lambda: rng.choice(BAD_NUMBERS)  # noqa: E731
    frameworks = lambda: rng.choice(["", " ", "trl@", "trl@x", "nope", "transformers<1", "trl@" + "9" * 400,  # noqa: E731
                                     "\u202e", "@0.12", "trl@0.12,<", "litgpt@>=", "TRL@0.12 extra"])
    base = {
        "estimate": ["estimate", "llama-3.2-1b", "--hardware", "rtx-4090"],
        "cloud": ["cloud", "llama-3.2-1b", "--examples", "1000"],
        "plan": ["plan", "llama-3.2-1b", "--hardware", "rtx-4090", "--mode", "balanced"],
        "analyze": ["analyze", "--hardware", "cpu", "--profile-only"],
        "profile": ["profile", "--quick"],
        "models": ["models"],
        "gpus": ["gpus"],
    }
    flags = {
        "estimate": {"--micro-batch": numbers, "--seq-len": numbers, "--grad-accum": numbers, "--lora-r": numbers,
                     "--lora-alpha": numbers, "--lora-dropout": numbers, "--zero": numbers, "--gpus": numbers,
                     "--generate": numbers, "--dataset-tokens": numbers, "--examples": numbers,
                     "--epochs": numbers, "--price-per-kwh": numbers, "--vocab": numbers,
                     "--hardware": lambda: rng.choice(BAD_HARDWARE + input_files),
                     "--method": lambda: rng.choice(BAD_WORDS), "--optimizer": lambda: rng.choice(BAD_WORDS),
                     "--lora-targets": lambda: rng.choice(["", ",", " , ", "\u202e"]),
                     "--image-size": numbers, "--images-per-example": numbers, "--framework": frameworks,
                     "--runtime": lambda: rng.choice(BAD_WORDS + ["=", "fsdp_no_sync=", "model_code=\u202e",
                                                                  "transformers_version=" + "9" * 400,
                                                                  "fsdp_no_sync=nan", "=true"])},
        "cloud": {"--dataset-tokens": numbers, "--examples": numbers, "--seq-len": numbers, "--epochs": numbers,
                  "--budget": numbers, "--max-hours": numbers, "--global-batch": numbers,
                  "--setup-minutes": numbers, "--top": numbers,
                  "--prices": lambda: rng.choice(input_files + [f["prices.csv"], f["prices.yaml"]]),
                  "--flavor": lambda: rng.choice(BAD_WORDS[1:]), "--framework": frameworks},
        "plan": {"--seq-len": numbers, "--target-batch": numbers, "--examples": numbers, "--dataset-tokens": numbers,
                 "--epochs": numbers, "--memory-share": numbers, "--tokens-per-param": numbers, "--vocab": numbers,
                 "--usd-per-hour": numbers, "--budget": numbers, "--price-per-kwh": numbers,
                 "--time-budget": lambda: rng.choice(["0h", "-1h", "nanh", "1e999h", "h", "5 parsecs", "", "9" * 400 + "h"]),
                 "--memory-budget": lambda: rng.choice(["0GiB", "-3GiB", "nanGiB", "1e999TiB", "GiB", "3 apples", "",
                                                        "9" * 400 + "GiB", "9" * 400]),
                 "--hardware": lambda: rng.choice(BAD_HARDWARE + input_files),
                 "--out": lambda: rng.choice(out_dirs), "--method": lambda: rng.choice(BAD_WORDS),
                 "--data": lambda: rng.choice(["", " ", str(d / "no-such-data"), "builtin:nope"] + data_files),
                 "--mode": lambda: rng.choice(BAD_WORDS),
                 "--pipeline": lambda: rng.choice(BAD_WORDS + ["sft+", "dpo+sft", "sft+dpo+sft", "+"]),
                 "--pairs": numbers, "--dataset": lambda: rng.choice(BAD_WORDS + ["a/b/c", "owner/x:", "owner/x:a:b"]),
                 "--flavor": lambda: rng.choice(BAD_WORDS[1:] + ["p4d.24xlarge"]), "--spot": None,
                 "--image-size": numbers, "--images-per-example": numbers,
                 "--probe-seconds": numbers, "--no-probe": None, "--framework": frameworks,
                 "--launcher": lambda: rng.choice(BAD_WORDS + ["slurm", "skypilot", "kubernetes"]),
                 "--for": lambda: rng.choice(BAD_WORDS + ["litgpt", "torchtune"])},
        "analyze": {"--psu-watts": numbers, "--hardware": lambda: rng.choice(BAD_HARDWARE + input_files),
                    "--examples": numbers, "--dataset-tokens": numbers,
                    "--data": lambda: rng.choice(["", " ", str(d / "no-such-data"), "builtin:nope"] + data_files),
                    "--dataset": lambda: rng.choice(BAD_WORDS + ["a/b/c", "owner/x:a:b"])},
        "profile": {"--psu-watts": numbers, "--out": lambda: rng.choice(out_files)},
        "models": {"--family": lambda: rng.choice(BAD_WORDS[1:])},
        "gpus": {"--vendor": lambda: rng.choice(BAD_WORDS), "--sort": lambda: rng.choice(BAD_WORDS)},
    }
    cases: list[list[str]] = []
    n_config = 0
    while len(cases) < CASES:
        roll = rng.random()
        if roll < 0.12:  # a positional model reference
            cmd = rng.choice(["estimate", "cloud", "plan"])
            ref = rng.choice(BAD_MODELS + model_dirs)
            cases.append([cmd, ref] + base[cmd][2:])
        elif roll < 0.17:
            cases.append(["models", "show", rng.choice(BAD_MODELS + model_dirs)])
        elif roll < 0.30:  # run configs: malformed files and configs with one bad key
            cmd = rng.choice(["train", "verify"])
            if rng.random() < 0.4:
                config = rng.choice(input_files)
            else:
                n_config += 1
                config = str(_mutated_config(rng, d, n_config))
            extra = rng.choice([[], ["--json"], ["--max-steps", numbers()] if cmd == "train" else ["--steps", numbers()]])
            cases.append([cmd, config, *extra] + (["--out", str(d / f"run-{len(cases)}")] if cmd == "train" else []))
        elif roll < 0.33:
            cmd = rng.choice(["train", "verify"])
            cases.append([cmd, str(EXAMPLES / "pretrain.yaml")] + (["--max-steps", numbers()] if cmd == "train"
                                                                    else ["--steps", numbers()]))
        elif roll < 0.36:  # report: a bad run directory, or a valid one with a bad --out
            run_dir = rng.choice([f[k] for k in ("run-broken", "run-types", "run-sample", "run-empty", "run-valid",
                                                 "binary.yaml", "missing.yaml", "a-directory.yaml")] + ["", "/proc"])
            out = ["--out", rng.choice(out_dirs)] if run_dir == f["run-valid"] or rng.random() < 0.3 else []
            cases.append(["report", run_dir, *out, *rng.choice([[], ["--json"], ["--force"]])])
        else:
            cmd = rng.choice(list(flags))
            chosen = rng.sample(sorted(flags[cmd]), k=min(len(flags[cmd]), rng.choice([1, 1, 2])))
            argv = list(base[cmd])
            for flag in chosen:
                value = flags[cmd][flag]
                argv += [flag] if value is None else [flag, value()]  # None: a switch
            if rng.random() < 0.3 and cmd not in ("models", "gpus"):
                argv.append("--json")
            cases.append(argv)
    return cases


class _Timeout(Exception):
    pass


def _run_checked(argv: list[str], failures: list[str]) -> tuple[int, str, float] | None:
    """_run, with what may never happen (a hang, an exception out of main(), an exit code outside
    0/2/3/4) added to failures; None when there is no exit code to look at."""
    try:
        code, stderr, seconds = _run(argv)
    except _Timeout:
        failures.append(f"{argv}: still running after {CASE_SECONDS} s")
        return None
    except Exception as exc:  # noqa: BLE001 - the point: nothing may escape main()
        failures.append(f"{argv}: {type(exc).__name__}: {exc}")
        return None
    if code not in (0, 2, 3, 4):
        failures.append(f"{argv}: exit {code}: {stderr[-300:]}")
    return code, stderr, seconds


def _run(argv: list[str]) -> tuple[int, str, float]:
    def on_alarm(signum, frame):
        raise _Timeout()

    err = io.StringIO()
    started = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(CASE_SECONDS)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse errors and --help
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, err.getvalue(), time.perf_counter() - started


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_every_command_refuses_malformed_input_cleanly(bad_files, tmp_path, monkeypatch):
    inputs = bad_files["binary.yaml"].parent
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    # Anything a command would store for the user goes here, not into the real home.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port: never the real Hub
    cases = _cases(bad_files, inputs)
    before_inputs = _listing(inputs)
    failures = []
    for argv in cases:
        ran = _run_checked(argv, failures)
        if ran is None:
            continue
        code, stderr, seconds = ran
        if "Traceback" in stderr:
            failures.append(f"{argv}: traceback in stderr: {stderr[-300:]}")
        left = _listing(work) | (_listing(inputs) - before_inputs)
        if left:
            failures.append(f"{argv}: left behind {sorted(left)[:5]}")
            for name in sorted(left, reverse=True):  # keep later cases independent
                p = work / name if (work / name).exists() else inputs / name
                p.rmdir() if p.is_dir() else p.unlink()
    assert not failures, f"{len(failures)} of {len(cases)} cases broke the contract:\n" + "\n".join(failures[:25])


# -- symlinked output trees ---------------------------------------------------------------------
SYMLINK_CASES = 16
OUT_MODES = ("conservative", "balanced", "extreme")


def _symlinked_tree(rng: random.Random, root: Path, n: int) -> tuple[Path, Path, list[str]]:
    """An output folder with links planted in it (a seeded mix): a mode folder or a file in one
    linked to a folder or file outside, dangling, a chain of links, a link to the output folder's
    own parent. Returns (out, outside, the argv tail that writes into out)."""
    case = root / f"case-{n}"
    out, outside = case / "out", case / "outside"
    outside.mkdir(parents=True)
    (outside / "run.yaml").write_text("the user's run.yaml\n")
    (outside / "victim.txt").write_text("the user's file\n")
    out.mkdir()
    for _ in range(rng.choice([1, 1, 2])):
        mode = rng.choice(OUT_MODES)
        kind = rng.choice(["dir", "file", "dangling-dir", "dangling-file", "chain", "parent", "root", "file-as-dir"])
        folder = out / mode
        if kind in ("file", "dangling-file") and not os.path.lexists(folder):
            folder.mkdir()
        if os.path.lexists(folder) and not folder.is_dir():
            continue
        if kind == "dir":
            folder.symlink_to(outside) if not os.path.lexists(folder) else None
        elif kind == "file":
            name = rng.choice(["run.yaml", "launch.sh", "accelerate.yaml", "training_args.yaml"])
            if folder.is_dir() and not folder.is_symlink() and not os.path.lexists(folder / name):
                (folder / name).symlink_to(outside / "victim.txt")
        elif kind == "dangling-dir" and not os.path.lexists(folder):
            folder.symlink_to(outside / "missing")
        elif kind == "dangling-file" and folder.is_dir() and not folder.is_symlink():
            if not os.path.lexists(folder / "run.yaml"):
                (folder / "run.yaml").symlink_to(outside / "missing.yaml")
        elif kind == "chain" and not os.path.lexists(folder):
            (case / "hop").symlink_to(outside) if not os.path.lexists(case / "hop") else None
            folder.symlink_to(case / "hop")
        elif kind == "parent" and not os.path.lexists(folder):
            folder.symlink_to("..")
        elif kind == "root" and not os.path.lexists(folder):
            folder.symlink_to("/")
        elif kind == "file-as-dir" and not os.path.lexists(folder):
            folder.symlink_to(outside / "victim.txt")
    command = rng.choice([["plan", "shape:125m", "--hardware", "cpu", "--out", str(out)],
                          ["analyze", "--hardware", "cpu", "--generate-configs", str(out)]])
    return out, outside, command + rng.choice([[], ["--force"]])


def _tree(root: Path) -> dict[str, str | bytes]:
    return {str(p.relative_to(root)): (f"-> {os.readlink(p)}" if p.is_symlink() else
                                       "dir" if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def test_symlinked_output_trees_are_never_written_through(tmp_path, monkeypatch):
    """plan --out / analyze --generate-configs into trees with planted links: exit 0 or 2, no
    traceback, nothing outside the output folder changed, and a refusal changes nothing at all."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(SEED + 35)
    failures = []
    for n in range(SYMLINK_CASES):
        out, outside, argv = _symlinked_tree(rng, tmp_path, n)
        case = out.parent
        before_outside, before_case = _tree(outside), _tree(case)
        code, stderr, _ = _run(argv)
        what = f"{argv[0]} with {sorted(k for k, v in before_case.items() if str(v).startswith('->'))}: exit {code}"
        if code not in (0, 2) or "Traceback" in stderr:
            failures.append(f"{what}: {stderr[-300:]}")
        if _tree(outside) != before_outside:
            failures.append(f"{what}: wrote outside the output folder")
        if code == 2 and _tree(case) != before_case:
            failures.append(f"{what}: refused, yet changed {case}")
        if code == 0 and any(str(v).startswith("->") for k, v in _tree(out).items() if "/" not in k):
            failures.append(f"{what}: wrote with a linked mode folder in place")
    assert not failures, "\n".join(failures)


# -- hostile Hub answers --------------------------------------------------------------------------

HUB_CASES = 40
HUB_DEADLINE_SECONDS = 1.0


def _hostile_json(rng: random.Random, honest: bytes, honest_share: float = 0.0) -> object:
    """An answer where a JSON document is expected: honest, or wrong in one of many ways."""
    if rng.random() < honest_share:
        return honest
    return rng.choice([
        lambda: fh.drip(honest, rng.uniform(0.05, 0.3)),
        lambda: fh.drip_headers(rng.uniform(0.05, 0.3)),
        lambda: fh.endless_chunked(),
        lambda: fh.sized(rng.choice([2 << 20, 10**9, 10**12])),
        lambda: fh.gzip_bomb(rng.choice([10**8, 10**10]), honest[:rng.randrange(len(honest))]),
        lambda: fh.nested(rng.randint(65, 20_000)),
        lambda: rng.choice([b"[]", b"null", b"42", b'"x"', b"{", b"", b"\xff\xfe", b'{"a": 1' + b"9" * 5000 + b"}"]),
        lambda: rng.randbytes(rng.randrange(1, 4096)),
        lambda: fh.encoded(honest, rng.choice(["br", "zstd", "gzip, gzip", "compress", "deflate"])),
        lambda: fh.redirect_loop(),
        lambda: fh.sized(rng.choice([0, 10**10]), status=rng.choice([400, 401, 403, 404, 416, 429, 500, 503])),
        lambda: fh.slow(honest, rng.uniform(0.5, 2.0)),
    ])()


def _hostile_info(rng: random.Random, name: str, files: dict) -> object:
    doc = {"id": name, "sha": hashlib.sha1(name.encode()).hexdigest(),  # the fake's commit for `name`
           "siblings": [{"rfilename": f} for f in files]}
    mutated = rng.choice([
        {}, {"siblings": rng.choice([None, {}, [1], [{"rfilename": 5}], "x", [{"rfilename": "../x"}]])},
        {"id": rng.choice([5, None, "a/b/c", "x" * 500])}, {"sha": rng.choice([5, [], "z" * 10_000])},
    ])
    return _hostile_json(rng, json.dumps({**doc, **mutated}).encode(), honest_share=0.3)


def _hostile_weights(rng: random.Random) -> dict:
    """model.safetensors, or an index and its shards, honest or hostile."""
    header = fh.safetensors_header(fh.mistral_tensors())
    if rng.random() < 0.5:
        weights = rng.choice([
            lambda: fh.safetensors_bytes(fh.mistral_tensors()),
            lambda: fh.ignores_range(header, 10**10),
            lambda: fh.gzip_bomb(10**10, rng.choice([header[:8], struct.pack("<Q", 2**63), b""])),
            lambda: fh.slow_ranges(header + bytes(64), rng.uniform(0.3, 2.0)),
            lambda: fh.drip(header, 0.1),
            lambda: struct.pack("<Q", rng.choice([0, 2, 10**6, 2**40, 2**64 - 1])) + rng.randbytes(rng.randrange(64)),
            lambda: fh.safetensors_header({"w": [rng.choice([2**40, 2**20, -1, 0]), 2**40]}),
            lambda: struct.pack("<Q", 20_000) + fh.nested(10_000)[:20_000],
        ])()
        return {"model.safetensors": weights}
    n_shards = rng.choice([2, 3, 5, 1025, 3000])
    shards = {f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors": fh.slow_ranges(header, rng.uniform(0, 0.5))
              for i in range(n_shards)}
    index = json.dumps({"weight_map": {f"w{i}": name for i, name in enumerate(shards)}}).encode()
    return {**shards, "model.safetensors.index.json": _hostile_json(rng, index, honest_share=0.5)}


def _hub_cases(rng: random.Random) -> list[tuple[str, object, dict, list[str]]]:
    cases = []
    for n in range(HUB_CASES):
        name = f"fuzz/case-{n}"
        # Honest answers early on half of the time, so that the later requests are reached too.
        files = {"config.json": _hostile_json(rng, json.dumps(fh.CONFIG).encode(), honest_share=0.6),
                 **_hostile_weights(rng)}
        info = _hostile_info(rng, name, files) if rng.random() < 0.3 else None
        cmd = rng.choice([["estimate", name, "--hardware", "cpu"], ["models", "show", name],
                          ["plan", name, "--hardware", "rtx-4090", "--mode", "balanced"],
                          ["cloud", name, "--examples", "1000"]])
        cases.append((name, info, files, cmd + (["--json"] if rng.random() < 0.3 else [])))
    return cases


def test_hub_commands_survive_hostile_servers(tmp_path, monkeypatch):
    """Every Hub command against a server drawn from hostile behaviours: an answer or a clean
    refusal (exit 0, 2, 3 or 4, one line, no traceback) within the lookup's deadline."""
    import dataclasses

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_DOWNLOAD_TIMEOUT", raising=False)
    monkeypatch.setenv("TRAINFIT_HUB_DEADLINE", str(HUB_DEADLINE_SECONDS))
    # Smaller caps than the defaults, so that every bomb and flood is cut within a few MiB.
    monkeypatch.setattr(hub_models, "LIMITS", dataclasses.replace(
        hub_models.LIMITS, model_info_bytes=1 << 20, index_bytes=1 << 20, header_bytes=1 << 20, total_bytes=4 << 20))
    rng = random.Random(SEED + 35)
    failures = []
    with fh.serve() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        for name, info, files, argv in _hub_cases(rng):
            hub.add(name, files, info=info)
            ran = _run_checked(argv, failures)
            if ran is None:
                continue
            code, stderr, seconds = ran
            if "Traceback" in stderr or (code and len(stderr.strip().splitlines()) != 1):
                failures.append(f"{argv}: not one line on stderr: {stderr[-300:]}")
            if seconds > HUB_DEADLINE_SECONDS + 3:
                failures.append(f"{argv}: {seconds:.1f} s, over the {HUB_DEADLINE_SECONDS:g} s deadline")
    assert not failures, f"{len(failures)} of {HUB_CASES} cases broke the contract:\n" + "\n".join(failures[:25])
