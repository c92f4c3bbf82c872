"""The Hub client against hostile servers: wall time and peak memory of the real CLI.

Run:  .venv/bin/python bench/hub_hostile.py [--deadline SECONDS] [--only NAME ...] [--out DIR]
Writes bench/results/hub_hostile.md and .json. About four minutes with the default 60 s deadline
(three cases run into it); `--deadline 5` for a quick look (then written under /tmp unless --out).

Targets (issue "Nothing written outside the target ... a Hub that cannot hang or flood us"): every
Hub command finishes within its stated deadline (TRAINFIT_HUB_DEADLINE, default 60 s, plus the
process's start and the estimate itself) with a peak RSS under 300 MB, whatever the server does,
and ends with the exit code of the README's contract (0 answered, 2 refused model or bad setting,
4 Hub unusable) and one line on stderr.

Each case starts a fake Hub on 127.0.0.1 (bench/_fake_hub.py) with one hostile behaviour, runs
`python -m trainfit estimate acme/<case> --hardware cpu --json` as a subprocess with HF_ENDPOINT
pointing at it and an empty cache (through `python -c` running trainfit's __main__ exactly as `-m`
does, plus an atexit hook that records the process's VmHWM: its own peak RSS). The server runs in
this process, so what it spends compressing bombs or generating gigabytes is not counted against
the client.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _fake_hub as fh
from _results import write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DEFAULT_DEADLINE_S = 60.0  # trainfit.hub.models.LIMITS.deadline_seconds
PEAK_RSS_TARGET_MB = 300.0
# A process's start and the estimate after the lookup: what the command may take beyond the deadline.
STARTUP_ALLOWANCE_S = 5.0


# `python -m trainfit ARGS` that, as it exits, writes its peak RSS: VmHWM, the high-water mark of the
# process's own memory since exec. (ru_maxrss from wait4 is not the child's alone on Linux: exec
# records the forking parent's RSS into it, and this process holds the fake Hub's data.)
_PEAK_THEN_CLI = """
import atexit, os, runpy, sys

def _write_peak():
    with open('/proc/self/status') as f:
        kb = next(line.split()[1] for line in f if line.startswith('VmHWM:'))
    with open(os.environ['HUB_BENCH_VMHWM_FILE'], 'w') as f:
        f.write(kb)

atexit.register(_write_peak)
sys.argv[0] = 'trainfit'
runpy.run_module('trainfit', run_name='__main__', alter_sys=True)
"""


def _config() -> bytes:
    return json.dumps(fh.CONFIG).encode()


def _many_tensors_header(target_bytes: int) -> bytes:
    """A safetensors header of about target_bytes made of the smallest valid tensor entries: the
    most Python objects per byte a header that passes every check can hold (memory's worst case)."""
    entry = b'"t%07d":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},'
    count = target_bytes // (len(entry % 0) + 1)
    raw = b"{" + b"".join(entry % i for i in range(count))[:-1] + b"}"
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _sharded(shards: dict[str, bytes | object]) -> dict:
    weight_map = {f"w{i}": name for i, name in enumerate(shards)}
    return {"config.json": _config(), "model.safetensors.index.json": json.dumps({"weight_map": weight_map}).encode(),
            **shards}


def cases() -> list[dict]:
    """(name, what the server does, files, model info override, extra env, expected exit code)."""
    single = fh.single_file_repo()
    header = fh.safetensors_header(fh.mistral_tensors())
    slow_shard = fh.slow_ranges(fh.safetensors_bytes({"w": [4, 4]}), 2.0)
    big_header = _many_tensors_header(int(7.5 * (1 << 20)))
    return [
        dict(name="honest", what="a correct single-file repository (the baseline)", files=single, expect=0),
        dict(name="refused-then-offline", what="headers claiming 1.21e24 parameters; then HF_HUB_OFFLINE=1 "
             "(must not be served from the cache)",
             files={**single, "model.safetensors": fh.safetensors_header({"w": [2**40, 2**40]})}, expect=2,
             then_offline=4),
        dict(name="drip-config", what="config.json at one byte every 2 s", files={
            **single, "config.json": fh.drip(_config(), 2.0)}, expect=4, deadline_bound=True),
        dict(name="drip-headers", what="model info's status line and headers at one byte every 2 s, never ending",
             files=single, info=fh.drip_headers(2.0), expect=4, deadline_bound=True),
        dict(name="3000-slow-shards", what="an index of 3,000 shards, each answered after 2 s",
             files=_sharded({f"model-{i:05d}-of-03000.safetensors": slow_shard for i in range(3000)}), expect=2),
        dict(name="1000-slow-shards", what="an index of 1,000 shards (under the cap), each answered after 2 s",
             files=_sharded({f"model-{i:05d}-of-01000.safetensors": slow_shard for i in range(1000)}), expect=4,
             deadline_bound=True),
        dict(name="endless-chunked-config", what="config.json chunked and never ending",
             files={**single, "config.json": fh.endless_chunked()}, expect=2),
        dict(name="ignores-range-3GB", what="a valid header, then 3 GB: the server ignores Range",
             files={**single, "model.safetensors": fh.ignores_range(header, 3 * 10**9)}, expect=0),
        dict(name="gzip-bomb-config", what="config.json: 10 GB of zeros gzipped",
             files={**single, "config.json": fh.gzip_bomb(10**10, b'{"a": "')}, expect=2),
        dict(name="gzip-bomb-model-info", what="model info: 10 GB of zeros gzipped", files=single,
             info=fh.gzip_bomb(10**10, b'{"id": "'), expect=4),
        dict(name="gzip-bomb-header", what="model.safetensors: an 8-byte length of 50 MB then 10 GB of zeros, "
             "gzipped", files={**single, "model.safetensors": fh.gzip_bomb(10**10, (5 * 10**7).to_bytes(8, "little"))},
             expect=2),
        dict(name="500MB-config", what="config.json of 500 MB (Content-Length)",
             files={**single, "config.json": fh.sized(500 * 10**6)}, expect=2),
        dict(name="model-info-list", what="model info that is a JSON list", files=single, info=b"[1, 2, 3]",
             expect=4),
        dict(name="model-info-nested", what="model info nested 100,000 deep", files=single, info=fh.nested(100_000),
             expect=4),
        dict(name="timeout-nan", what="HF_HUB_DOWNLOAD_TIMEOUT=nan", files=single,
             env={"HF_HUB_DOWNLOAD_TIMEOUT": "nan"}, expect=2),
        dict(name="timeout-abc", what="HF_HUB_DOWNLOAD_TIMEOUT=abc", files=single,
             env={"HF_HUB_DOWNLOAD_TIMEOUT": "abc"}, expect=2),
        dict(name="timeout-negative", what="HF_HUB_DOWNLOAD_TIMEOUT=-1", files=single,
             env={"HF_HUB_DOWNLOAD_TIMEOUT": "-1"}, expect=2),
        dict(name="redirect-loop", what="config.json redirects to itself", files={
            **single, "config.json": fh.redirect_loop()}, expect=4),
        dict(name="error-10GB-body", what="HTTP 500 with a 10 GB body", files={
            **single, "config.json": fh.sized(10**10, status=500)}, expect=4),
        dict(name="largest-accepted-headers", what="four shards of 7.5 MiB headers made of the smallest valid "
             "tensor entries (~125k each): every check passes, the most memory an accepted lookup takes",
             files=_sharded({f"model-0000{i}-of-00004.safetensors": big_header for i in (1, 2, 3, 4)}), expect=0),
        dict(name="largest-accepted-index", what="an index of 16 MB: 600k tensor names, the most JSON items "
             "accepted, all in one shard", files={
                 "config.json": _config(), "m.safetensors": fh.safetensors_bytes({"w": [4, 4]}),
                 "model.safetensors.index.json": json.dumps(
                     {"weight_map": {f"t{i:07d}": "m.safetensors" for i in range(600_000)}},
                     separators=(",", ":")).encode()}, expect=0),
        dict(name="header-over-cap", what="one safetensors header of 9 MiB of the smallest valid tensor entries",
             files={**single, "model.safetensors": _many_tensors_header(9 << 20)}, expect=2),
    ]


def run_case(case: dict, endpoint: str, deadline_s: float | None, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRAINFIT_"))}
    env.update({"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(cache / "hf"),
                "TRAINFIT_CACHE_DIR": str(cache / "trainfit"), "PYTHONPATH": str(ROOT / "src"),
                **case.get("env", {})})
    if deadline_s is not None:
        env["TRAINFIT_HUB_DEADLINE"] = f"{deadline_s:g}"
    hwm_file = cache / f"vmhwm-{time.monotonic_ns()}"
    env["HUB_BENCH_VMHWM_FILE"] = str(hwm_file)
    argv = [sys.executable, "-c", _PEAK_THEN_CLI, "estimate", f"acme/{case['name']}", "--hardware", "cpu", "--json"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cache)
        proc.wait()
        wall_s = time.monotonic() - start
        err.seek(0)
        stderr = err.read().decode(errors="replace").strip()
    peak_kb = int(hwm_file.read_text()) if hwm_file.exists() else float("nan")
    return {"exit_code": proc.returncode, "wall_seconds": round(wall_s, 2), "peak_rss_mb": round(peak_kb / 1024, 1),
            "stderr_lines": len(stderr.splitlines()), "traceback": "Traceback" in stderr,
            "message": stderr.splitlines()[0][:300] if stderr else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deadline", type=float, default=None,
                    help=f"TRAINFIT_HUB_DEADLINE for the runs (default: unset, the CLI's {DEFAULT_DEADLINE_S:g} s)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these cases")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default bench/results, or /tmp with "
                    "--deadline/--only)")
    opts = ap.parse_args()
    out_dir = opts.out or (RESULTS if opts.deadline is None and not opts.only else Path(tempfile.gettempdir()))
    deadline_s = opts.deadline or DEFAULT_DEADLINE_S
    rows = []
    for case in cases():
        if opts.only and case["name"] not in opts.only:
            continue
        with fh.serve() as hub, tempfile.TemporaryDirectory(prefix="hub-hostile-") as tmp:
            hub.add(f"acme/{case['name']}", case["files"], info=case.get("info"))
            result = run_case(case, hub.endpoint, opts.deadline, Path(tmp))
            if "then_offline" in case:
                offline = run_case({**case, "env": {**case.get("env", {}), "HF_HUB_OFFLINE": "1"}}, hub.endpoint,
                                   opts.deadline, Path(tmp))
                result["offline_exit_code"] = offline["exit_code"]
                result["offline_message"] = offline["message"]
            result["requests"] = len(hub.requests())
        expect = case["expect"] if isinstance(case["expect"], tuple) else (case["expect"],)
        ok_exit = result["exit_code"] in expect and result.get("offline_exit_code", case.get("then_offline")) == \
            case.get("then_offline")
        row = {"case": case["name"], "server": case["what"], "expected_exit": list(expect), **result,
               "within_deadline": result["wall_seconds"] <= deadline_s + STARTUP_ALLOWANCE_S,
               "under_300_mb": result["peak_rss_mb"] < PEAK_RSS_TARGET_MB,
               "clean": ok_exit and result["stderr_lines"] <= 1 and not result["traceback"]}
        rows.append(row)
        print(f"{row['case']:26s} exit {row['exit_code']} {row['wall_seconds']:6.2f} s {row['peak_rss_mb']:6.1f} MB "
              f"{'ok' if row['clean'] and row['within_deadline'] and row['under_300_mb'] else 'FAIL'}  "
              f"{row['message'][:110]}", flush=True)
    import huggingface_hub

    doc = {"deadline_seconds": deadline_s, "deadline_from": "TRAINFIT_HUB_DEADLINE" if opts.deadline else "default",
           "startup_allowance_seconds": STARTUP_ALLOWANCE_S, "peak_rss_target_mb": PEAK_RSS_TARGET_MB,
           "python": platform.python_version(), "huggingface_hub": huggingface_hub.__version__,
           "machine": platform.machine(), "cpus": os.cpu_count(), "cases": rows,
           "all_pass": all(r["clean"] and r["within_deadline"] and r["under_300_mb"] for r in rows)}
    write_results(out_dir, "hub_hostile", doc, _markdown(doc))
    print(f"wrote {out_dir}/hub_hostile.{{json,md}}; all pass: {doc['all_pass']}")


def _markdown(doc: dict) -> str:
    lines = [
        "# The Hub client against hostile servers",
        "",
        f"`python -m trainfit estimate acme/<case> --hardware cpu --json` against a fake Hub on 127.0.0.1 "
        f"(bench/_fake_hub.py), deadline {doc['deadline_seconds']:g} s ({doc['deadline_from']}), empty cache. "
        f"Wall time includes the process's start; peak RSS is the child's own VmHWM. Target: within the "
        f"deadline (+{doc['startup_allowance_seconds']:g} s for start-up and the estimate), under "
        f"{doc['peak_rss_target_mb']:g} MB, the contract's exit code and one line on stderr. "
        f"Python {doc['python']}, huggingface_hub {doc['huggingface_hub']}, {doc['cpus']} CPUs.",
        "",
        "| case | server | exit (expected) | wall s | peak RSS MB | requests | message |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in doc["cases"]:
        exit_text = f"{r['exit_code']} ({'/'.join(map(str, r['expected_exit']))})"
        if "offline_exit_code" in r:
            exit_text += f", offline {r['offline_exit_code']}"
        verdict = "" if r["clean"] and r["within_deadline"] and r["under_300_mb"] else " **FAIL**"
        message = r["message"].replace("|", "\\|")[:160]
        lines.append(f"| {r['case']}{verdict} | {r['server']} | {exit_text} | {r['wall_seconds']:.2f} | "
                     f"{r['peak_rss_mb']:.1f} | {r['requests']} | {message} |")
    lines += ["", f"All within the deadline, under {doc['peak_rss_target_mb']:g} MB and clean: "
              f"**{'yes' if doc['all_pass'] else 'no'}**.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
