"""Planner quality on this CPU: the plan's choices against an exhaustive *measured* sweep.

The issue's acceptance criterion, with a memory budget imposed (3 GiB) and a small pretraining
model (a Llama-style 6 x 256 shape, ~5.5M parameters, untied; its vocabulary is the size of the BPE
tokenizer trained on builtin:tiny-corpus: asked for 4096 tokens, the trainer stops at 843 on this
small corpus, and build_model sizes the embedding by len(tokenizer), so the spec says 843 too;
seq_len 256, global batch 16):

(a) each mode's plan, trained for real, keeps its measured peak RSS under the mode's share of
    the budget (conservative 50 %, balanced 75 %, extreme 95 %);
(b) the balanced plan's measured tokens/s is at least 95 % of the best configuration that an
    exhaustive measured sweep of the same knobs finds within the same (balanced) budget. The
    knobs are exactly those the planner searches for this tier on this CPU (its own
    `mode_tiers(...)` enumeration, filtered by the device rules): precision fp32 / bf16-mixed,
    gradient checkpointing none / full, attention sdpa / eager, micro-batch 1..16 with the
    accumulation that keeps global batch 16, optimizer adamw.

The planner makes zero trial runs: plan() is timed in-process, and torch is not even imported
while it runs (checked). Every measured configuration is the run config that
`trainfit plan --out` writes (trainfit.export.plan_files.run_config_dict) with the knobs set,
trained by `trainfit.train.runner.run_training` (Transformers' Trainer) in a fresh subprocess,
so the peak RSS is per configuration and no allocator state leaks between configurations.
Only deviation from the plan's file: the BPE tokenizer is trained once (same corpus, same
vocab_size, deterministic) and passed as tokenizer.path instead of being re-trained per run;
its own RSS is recorded. Steps: --warmup untimed, --timed timed (the median gives tokens/s =
global batch x seq_len / median optimizer-step seconds), then one step under the live tensor
counter (trainfit.train.verify._MemoryProbe; not timed). The peak RSS for the verdicts is
ru_maxrss read at the end of the last timed step (before the final checkpoint save).

bf16-mixed: this CPU has no bf16 instructions and torch's bf16 matmul runs at ~1 GFLOP/s here
(fp32: ~170), so a bf16-mixed optimizer step takes ~40x an fp32 one (~40 s); measuring all 20
bf16-mixed settings with 5+ timed steps would take over an hour (--full-bf16 does it). The one the
speed model ranks first is measured fully (--bf16-warmup 1 + --bf16-timed 5 steps, the anchor);
the others run as capped probes: killed --bf16-cap seconds after training began, tokens/s from the
micro-batches that finished (no optimizer update, so it errs high: an upper bound in practice),
or micro_batch x seq_len / elapsed when none finished. That settles that none comes near fp32.

Load: this 2-core VM is shared with test suites. The 1-minute load average is recorded before
every measurement and the start waits for it to fall to 0.7; after that it mostly shows our own
previous run (2 busy cores), so the wait rule between runs uses the CPU that *other* processes
use: busy cores from /proc/stat sampled for 3 s while nothing of ours runs, and, during each run,
machine busy CPU seconds minus the run's own CPU seconds (os.wait4). Above 0.7 foreign cores
before a run: wait (poll every 20 s, up to 5 min). A run during which others used > 0.3 cores on
average is repeated once. The fastest fp32 configurations and the planner's picks are measured a
second time (reverse order) and the better of the two medians kept, since this VM has slow spells.

    .venv/bin/python bench/plan_quality.py            # full sweep, ~20 min; writes bench/results/plan_quality.{md,json}
    .venv/bin/python bench/plan_quality.py --full-bf16  # every bf16-mixed setting fully too (over an hour)
    .venv/bin/python bench/plan_quality.py --quick    # smoke test: the planner's picks + a few others, to /tmp
    .venv/bin/python bench/plan_quality.py --one JSON # (internal) measure one configuration, print JSON
    .venv/bin/python bench/plan_quality.py --probe    # the plan's probe, plain and with a skewed speed model
                                                      # (bench/plan_quality_probe.py; ~15 min quiet)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "bench" / "results"
GIB = 1 << 30
MIB = 1 << 20

SHAPE = "layers=6,hidden=256,heads=4"  # + vocab = the tokenizer's size
TOKENIZER_VOCAB = 4096  # run_config's default tokenizer.vocab_size; the BPE trainer may stop below it
SEQ_LEN = 256
TARGET_BATCH = 16
BUDGET = 3 * GIB
DATASET_TOKENS = 10_000_000  # only for the plan's run figures (hours); no effect on the choice
KNOBS = ("precision", "grad_checkpointing", "attention", "micro_batch", "grad_accum", "optimizer")
LOAD_LIMIT = 0.7
FOREIGN_RETRY = 0.3
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


# ---------------------------------------------------------------------------------------------
# child: one configuration
def measure_one(job: dict) -> dict:
    import resource

    from transformers import TrainerCallback

    from trainfit.config.run_config import parse_run_config
    from trainfit.train.runner import run_training
    from trainfit.train.verify import _MemoryProbe

    import torch

    def maxrss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB

    warmup, timed, count = job["warmup"], job["timed"], job.get("count_tensors", True)
    cfg = parse_run_config(job["config"], base_dir=ROOT, source="plan_quality")
    rss: dict[str, int] = {"after_imports": maxrss()}
    progress = open(job["progress"], "a", encoding="utf-8") if job.get("progress") else None
    micro: list[float] = []  # forward + backward of each micro-batch (no optimizer update)

    def event(**kw) -> None:
        if progress is not None:
            progress.write(json.dumps({"t": time.time(), "rss": maxrss(), **kw}) + "\n")
            progress.flush()

    class RssProbe(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            rss["train_begin"] = maxrss()
            event(event="train_begin")

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == warmup + timed:
                rss["after_timed_steps"] = maxrss()
            event(event="step", step=state.global_step)

    class MicroTimer(TrainerCallback):
        """Micro-batch times, streamed to the progress file (a capped probe is killed mid-run)."""

        def __init__(self) -> None:
            self.t = 0.0

        def _lap(self) -> None:
            now = time.perf_counter()
            micro.append(now - self.t)
            self.t = now
            event(event="micro", seconds=micro[-1])

        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_substep_end(self, args, state, control, **kw):
            self._lap()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self._lap()

    callbacks: list = [RssProbe(), MicroTimer()]
    probe = _MemoryProbe(warmup + timed + 1, "cpu") if count else None
    if probe is not None:
        callbacks.append(probe)
    if job.get("run_dir"):  # inside the parent's temporary directory (removed even when a probe is killed)
        result = run_training(cfg, Path(job["run_dir"]), quiet=True, extra_callbacks=callbacks, write_summary=False)
    else:
        with tempfile.TemporaryDirectory(prefix="trainfit-plan-quality-") as tmp:
            result = run_training(cfg, Path(tmp) / "run", quiet=True, extra_callbacks=callbacks, write_summary=False)
    steps = result.step_seconds
    timed_s = steps[warmup:warmup + timed]
    median = statistics.median(timed_s)
    t = cfg.training
    global_batch = t.micro_batch * t.grad_accum
    ru = resource.getrusage(resource.RUSAGE_SELF)
    summ = result.summary
    return {
        "step_seconds": steps,
        "micro_batch_seconds": micro,
        "timed_step_seconds": timed_s,
        "median_step_seconds": median,
        "tokens_per_second": global_batch * t.seq_len / median,
        "global_batch": global_batch,
        "peak_rss_bytes": rss.get("after_timed_steps", maxrss()),
        "peak_rss_end_bytes": maxrss(),  # incl. the counted step and the final checkpoint / model save
        "rss_after_imports_bytes": rss["after_imports"],
        "rss_train_begin_bytes": rss.get("train_begin"),
        "tensor_peak_bytes": probe.tensor_peak if probe is not None else None,
        "torch_threads": torch.get_num_threads(),
        "params_total": summ.get("params_total"),
        "model": summ.get("model"),
        "final_loss": summ.get("final_loss"),
        "summary_predicted": summ.get("predicted"),
        "cpu_seconds": ru.ru_utime + ru.ru_stime,
    }


def make_tokenizer(job: dict) -> dict:
    """Train the run's BPE tokenizer once, exactly as the runner would (same corpus and size)."""
    import resource

    from trainfit.train.data import load_raw_dataset, text_iterator
    from trainfit.config.run_config import parse_run_config
    from trainfit.train.tokenizer import load_tokenizer, train_bpe_tokenizer

    cfg = parse_run_config(job["config"], base_dir=ROOT, source="plan_quality")
    out = Path(job["out"])
    raw = load_raw_dataset(cfg)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    train_bpe_tokenizer(text_iterator(cfg, raw, cfg.tokenizer.train_max_bytes), cfg.tokenizer.vocab_size, out)
    tok = load_tokenizer(out)
    return {"vocab": len(tok), "rss_before_bytes": before,
            "rss_after_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


# ---------------------------------------------------------------------------------------------
# load
def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat (steal counted as neither)."""
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = parts[:7]
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def busy_cores(seconds: float = 3.0) -> float:
    b0, _ = _cpu_jiffies()
    time.sleep(seconds)
    b1, _ = _cpu_jiffies()
    return (b1 - b0) / os.sysconf("SC_CLK_TCK") / seconds


def wait_for_quiet(use_loadavg: bool, log) -> dict:
    """Record the load; wait (20 s polls, up to 5 min) while it is above LOAD_LIMIT."""
    start = time.perf_counter()
    polls = 0
    while True:
        load = os.getloadavg()
        foreign = busy_cores()
        high = load[0] > LOAD_LIMIT if use_loadavg else foreign > LOAD_LIMIT
        if not high or time.perf_counter() - start > 300:
            return {"loadavg": [round(x, 2) for x in load], "foreign_busy_cores_idle": round(foreign, 2),
                    "waited_seconds": round(time.perf_counter() - start, 1), "gave_up_waiting": high}
        polls += 1
        log(f"  busy machine (load {load[0]:.2f}, other processes use {foreign:.2f} cores): waiting 20 s")
        time.sleep(20)


# ---------------------------------------------------------------------------------------------
# parent
def best_benchmark(profiles):
    """A peak is a best-of figure: the higher rates of two benchmarked profiles (as step_time_accuracy)."""
    best = {}
    for name in ("cpu_fp32_gflops", "cpu_bf16_gflops", "memory_bandwidth_gbps"):
        values = [getattr(p.benchmark, name) for p in profiles if p.benchmark and getattr(p.benchmark, name)]
        best[name] = max(values) if values else None
    p = profiles[0]
    return dataclasses.replace(p, benchmark=dataclasses.replace(p.benchmark, **best)) if p.benchmark else p


def torch_matmul_gflops(n: int = 1024, reps: int = 5) -> dict:
    """torch n x n matmul rate, fp32 and bf16 (best of reps): is bf16 emulated or fast here?"""
    import torch

    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        best = math.inf
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        out[name] = round(2 * n**3 / best / 1e9, 1)
    return out


def knobs(s) -> dict:
    return {k: getattr(s, k) for k in KNOBS}


def label(k: dict) -> str:
    prec = "bf16m" if k["precision"] == "bf16-mixed" else k["precision"]
    ck = "ckpt" if k["grad_checkpointing"] != "none" else "-"
    return f"{prec} {ck} {k['attention']} mb{k['micro_batch']}x{k['grad_accum']}"


def run_child(job: dict, log, cap_seconds: float | None = None) -> dict:
    """Run one configuration in a fresh process. With cap_seconds: kill it that long after its
    training began and estimate from the micro-batches it finished (a capped probe)."""
    env = {**os.environ, **ENV}
    with tempfile.TemporaryDirectory(prefix="trainfit-plan-quality-child-") as tmp:
        progress, out_path, err_path = Path(tmp) / "progress.jsonl", Path(tmp) / "out", Path(tmp) / "err"
        job = {**job, "progress": str(progress), "run_dir": str(Path(tmp) / "run")}
        before = _cpu_jiffies()[0]
        t0 = time.perf_counter()
        with open(out_path, "w") as out_fh, open(err_path, "w") as err_fh:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(job)],
                                    stdout=out_fh, stderr=err_fh, env=env, cwd=str(ROOT))
            capped, began = False, None
            while True:
                pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                if cap_seconds is not None:
                    if began is None and progress.is_file() and '"train_begin"' in progress.read_text():
                        began = time.perf_counter()
                    if began is not None and time.perf_counter() - began > cap_seconds:
                        proc.kill()  # our own child, by its pid
                        capped = True
                        _, status, ru = os.wait4(proc.pid, 0)
                        proc.returncode = os.waitstatus_to_exitcode(status)
                        break
                time.sleep(0.2)
        wall = time.perf_counter() - t0
        busy = (_cpu_jiffies()[0] - before) / os.sysconf("SC_CLK_TCK")
        cpu = ru.ru_utime + ru.ru_stime
        foreign = max(0.0, (busy - cpu) / wall)
        events = [json.loads(x) for x in progress.read_text().splitlines()] if progress.is_file() else []
        stdout, stderr = out_path.read_text(), err_path.read_text()
    if capped:
        micro = [e["seconds"] for e in events if e["event"] == "micro"]
        mb_tokens = job["config"]["training"]["micro_batch"] * job["config"]["training"]["seq_len"]
        if len(micro) >= 2:
            est, how = mb_tokens / statistics.median(micro[1:]), "median micro-batch after the first"
        elif micro:
            est, how = mb_tokens / micro[0], "the one micro-batch that finished"
        else:
            elapsed = (t0 + wall) - (began or t0)  # training ran this long without finishing a micro-batch
            est, how = mb_tokens / elapsed, "no micro-batch finished: upper bound"
        return {"capped": True, "cap_seconds": cap_seconds, "micro_batch_seconds": micro,
                "tokens_per_second": est, "estimate": how, "upper_bound": True,
                "peak_rss_bytes": ru.ru_maxrss * 1024, "peak_rss_partial": True,
                "wall_seconds": wall, "cpu_seconds": cpu, "foreign_busy_cores_during": foreign,
                "stderr_tail": stderr[-500:]}
    if proc.returncode != 0:
        tail = stderr[-3000:]
        log(f"  FAILED rc={proc.returncode}: {tail}")
        return {"error": f"rc={proc.returncode}", "stderr_tail": tail, "wall_seconds": wall}
    out = json.loads(stdout.strip().splitlines()[-1])
    out["wall_seconds"] = wall
    out["child_maxrss_bytes"] = ru.ru_maxrss * 1024
    # CPU used by everything else on the machine while the child ran, in cores on average.
    out["foreign_busy_cores_during"] = foreign
    return out


def measure(job: dict, log, *, first: bool, cap_seconds: float | None = None) -> dict:
    load = wait_for_quiet(use_loadavg=first, log=log)
    res = run_child(job, log, cap_seconds)
    res["load_before"] = load
    res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if "error" not in res and res["foreign_busy_cores_during"] > FOREIGN_RETRY:
        log(f"  other processes used {res['foreign_busy_cores_during']:.2f} cores during the run: repeating once")
        load2 = wait_for_quiet(use_loadavg=False, log=log)
        res2 = run_child(job, log, cap_seconds)
        res2["load_before"] = load2
        res2["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        res2["repeated_because_foreign_load"] = res["foreign_busy_cores_during"]
        if "error" not in res2 and res2["foreign_busy_cores_during"] < res["foreign_busy_cores_during"]:
            res = res2
    return res


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--from", dest="from_json", metavar="JSON",
                    help="re-analyse the runs stored in a previous result (no measurement)")
    ap.add_argument("--make-tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="the planner's picks and 3 other configurations")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timed", type=int, default=6)
    ap.add_argument("--confirm-top", type=int, default=6,
                    help="re-measure this many of the fastest configurations (plus the planner's picks)")
    ap.add_argument("--no-tensor-count", action="store_true", help="skip the counted step (live-tensor peak)")
    ap.add_argument("--full-bf16", action="store_true",
                    help="measure every bf16-mixed configuration fully (emulated bf16 here: over an hour)")
    ap.add_argument("--no-bf16-anchor", dest="bf16_anchor", action="store_false",
                    help="skip the full measurement of the predicted-fastest bf16-mixed configuration (~5 min)")
    ap.add_argument("--bf16-warmup", type=int, default=1)
    ap.add_argument("--bf16-timed", type=int, default=5)
    ap.add_argument("--bf16-cap", type=float, default=10.0,
                    help="seconds of training before a capped probe is stopped")
    ap.add_argument("--out", help="output prefix (default bench/results/plan_quality; --quick: /tmp/plan_quality_quick)")
    ap.add_argument("--probe", action="store_true",
                    help="the plan's probe (trainfit plan on this machine): its picks, plain and with the speed model "
                         "skewed on purpose, against a measured sweep; writes bench/results/plan_quality_probe.{md,json}")
    ap.add_argument("--probe-seconds", type=float, default=30.0, help="with --probe: the probe's time budget")
    ap.add_argument("--many", help=argparse.SUPPRESS)
    ap.add_argument("--phase1-timed", type=int, default=3,
                    help="with --probe: timed steps of the sweep's first look at each kernel class")
    ap.add_argument("--max-wait", type=float, default=300.0,
                    help="with --probe: seconds to wait for a quiet machine before the sweep (0: do not wait)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_one(json.loads(args.one))))
        return 0
    if args.many:
        for job in json.loads(Path(args.many).read_text()):
            try:
                print(json.dumps({"label": job["label"], **measure_one(job)}), flush=True)
            except Exception as exc:  # one failing configuration must not lose the others
                print(json.dumps({"label": job["label"], "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 0
    if args.probe:
        from plan_quality_probe import probe_bench

        return probe_bench(args)
    if args.make_tokenizer:
        print(json.dumps(make_tokenizer(json.loads(args.make_tokenizer))))
        return 0
    if args.from_json:
        stored = json.loads(Path(args.from_json).read_text())
        ctx = {**stored["context"], "analysed_from": args.from_json}
        write_results(ctx, stored["rows"], Path(args.out) if args.out else Path(args.from_json))
        return 0
    if args.timed < 5:
        ap.error("--timed must be at least 5")

    def log(msg: str) -> None:
        print(msg, flush=True)

    started = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    from trainfit.core.memory import estimate_memory
    from trainfit.core.models.shapes import parse_shape
    from trainfit.core.plan.hardware_rules import rules_for, unsupported
    from trainfit.core.plan.modes import targets
    from trainfit.core.plan.planner import PlanRequest, plan
    from trainfit.core.plan.search_space import mode_tiers
    from trainfit.core.speed import predict_step
    from trainfit.export.plan_files import run_config_dict
    from trainfit.hardware.profiler import build_profile
    from trainfit.config.run_config import parse_run_config

    hw = build_profile(quick=True)

    def train_tokenizer(config: dict, out: Path) -> dict:
        job = {"config": config, "out": str(out)}
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--make-tokenizer", json.dumps(job)],
                              capture_output=True, text=True, check=True, env={**os.environ, **ENV}, cwd=str(ROOT))
        return json.loads(proc.stdout.strip().splitlines()[-1])

    # The tokenizer first: the model's vocabulary must be the tokenizer's size, or the prediction
    # describes another model than the one that runs (build_model takes len(tokenizer)).
    probe_cfg = {"version": 1, "method": "pretrain", "model": {"shape": {"layers": 1, "hidden": 64, "heads": 1}},
                 "data": {"paths": ["builtin:tiny-corpus"]}, "tokenizer": {"vocab_size": TOKENIZER_VOCAB},
                 "schedule": {"max_steps": 1}}
    tok_probe_dir = Path(tempfile.mkdtemp(prefix="trainfit-plan-quality-tok0-"))
    tok_probe = train_tokenizer(probe_cfg, tok_probe_dir)
    vocab = tok_probe["vocab"]
    log(f"tokenizer: asked for {TOKENIZER_VOCAB} tokens, the BPE trainer stops at {vocab} on builtin:tiny-corpus")
    spec = parse_shape(f"{SHAPE},vocab={vocab}")
    req = PlanRequest(hardware=hw, method="pretrain", model=spec, seq_len=SEQ_LEN, target_batch=TARGET_BATCH,
                      memory_budget_bytes=BUDGET, dataset_tokens=DATASET_TOKENS,
                      modes=("conservative", "balanced", "extreme"))
    torch_loaded_before = "torch" in sys.modules
    plan_times = []
    for _ in range(21):
        t0 = time.perf_counter()
        result = plan(req)
        plan_times.append(time.perf_counter() - t0)
    torch_loaded_by_plan = "torch" in sys.modules and not torch_loaded_before
    modes = {m.mode: m for m in result.modes}
    for m in result.modes:
        if not m.fits:
            log(f"mode {m.mode} does not fit: {m.warnings}")
            return 1
    rules = rules_for(hw)
    log(f"planning: first call {plan_times[0] * 1e3:.1f} ms, median of {len(plan_times) - 1} more "
        f"{statistics.median(plan_times[1:]) * 1e3:.1f} ms; torch imported by plan(): {torch_loaded_by_plan}")
    for m in result.modes:
        log(f"  {m.mode:12s} {label(knobs(m.setup))}  predicted {m.memory_used_bytes / MIB:.0f} MiB of "
            f"{m.memory_budget_bytes / MIB:.0f} MiB, {m.speed.tokens_per_second:.0f} tokens/s "
            f"({m.candidates_evaluated} candidates)")

    # The balanced tier's search space, exactly as the planner enumerates it.
    t_bal = targets("balanced")
    space = []
    for tier in mode_tiers(req, t_bal, rules, spec, TARGET_BATCH):
        for chain in tier.chains:
            for s in chain:
                if unsupported(rules, s) is None and s not in space:
                    space.append(s)
    # Same question with a benchmarked profile (what `trainfit plan --hardware <profile --benchmark>` sees).
    quiet_for_benchmark = wait_for_quiet(use_loadavg=True, log=log)
    hw_bench = best_benchmark([build_profile(benchmark=True, quick=True) for _ in range(2)])
    matmul = torch_matmul_gflops()
    log(f"benchmarked profile: fp32 {hw_bench.benchmark.cpu_fp32_gflops} GFLOP/s, bf16 "
        f"{hw_bench.benchmark.cpu_bf16_gflops}, {hw_bench.benchmark.memory_bandwidth_gbps} GB/s; torch matmul {matmul}")
    bench_plan = plan(dataclasses.replace(req, hardware=hw_bench, modes=("balanced",))).modes[0]

    rows: list[dict] = []
    for s in space:
        mem = estimate_memory(spec, s, hw).devices[0]
        sp = predict_step(spec, s, hw)
        spb = predict_step(spec, s, hw_bench)
        rows.append({"knobs": knobs(s), "label": label(knobs(s)),
                     "predicted_tokens_per_second": sp.tokens_per_second,
                     "predicted_step_seconds": sp.step_seconds,
                     "predicted_tokens_per_second_benchmarked_profile": spb.tokens_per_second,
                     "predicted_total_bytes": mem.total_bytes, "predicted_tensor_peak_bytes": mem.tensor_peak_bytes,
                     "picked_by": [m.mode for m in result.modes if m.setup == s]
                     + (["balanced (benchmarked profile)"] if bench_plan.setup == s else []),
                     "runs": []})
    picks = [r for r in rows if r["picked_by"]]
    # bf16-mixed is emulated on this CPU (torch's bf16 matmul runs at a few GFLOP/s here, see the
    # machine facts): a step takes ~40x an fp32 step, so measuring all of them fully would take
    # over an hour. The one the speed model ranks first gets a full measurement (the anchor); the
    # others a capped probe, which is enough to show that none comes near the fp32 settings.
    slow = [r for r in rows if r["knobs"]["precision"] != "fp32" and not r["picked_by"] and not args.full_bf16]
    full = [r for r in rows if r not in slow]
    anchor = max(slow, key=lambda r: r["predicted_tokens_per_second"]) if slow and args.bf16_anchor else None
    probes = [r for r in slow if r is not anchor]
    if args.quick:
        others = [r for r in full if not r["picked_by"]]
        full = picks + [o for o in others if o["knobs"]["micro_batch"] == 8][:3]
        anchor, probes = None, [r for r in probes if r["knobs"]["micro_batch"] in (1, 16)][:2]
    for r in full:
        r["kind"] = "full"
    if anchor is not None:
        anchor["kind"] = "full (bf16-mixed anchor)"
    for r in probes:
        r["kind"] = "capped probe"
    chosen = full + ([anchor] if anchor is not None else []) + probes
    log(f"search space: {len(space)} configurations (planner's balanced tier); measuring {len(full)} fully, "
        f"{1 if anchor is not None else 0} bf16-mixed anchor fully, {len(probes)} bf16-mixed as capped probes")

    # One run config per configuration: the balanced plan's file with the knobs set.
    base = run_config_dict(modes["balanced"], req)
    tok_dir = Path(tempfile.mkdtemp(prefix="trainfit-plan-quality-tok-"))
    tok = train_tokenizer(base, tok_dir)  # as the plan's own config would (tokenizer.vocab_size = the spec's)
    tok["asked_first"] = TOKENIZER_VOCAB
    tok["vocab_first"] = vocab
    if tok["vocab"] != spec.vocab_size:
        log(f"tokenizer has {tok['vocab']} tokens, the spec {spec.vocab_size}: the prediction would not describe the run")
        return 1
    log(f"tokenizer: {tok['vocab']} tokens in {tok_dir} (training it took the RSS from "
        f"{tok['rss_before_bytes'] / MIB:.0f} to {tok['rss_after_bytes'] / MIB:.0f} MiB)")

    def job_for(r: dict, warmup: int, timed: int, count: bool) -> dict:
        raw = json.loads(json.dumps(base))
        raw["training"].update(r["knobs"])
        raw["tokenizer"] = {"path": str(tok_dir)}
        raw["schedule"]["max_steps"] = warmup + timed + (1 if count else 0)
        raw["schedule"]["warmup_steps"] = 1
        raw["checkpointing"] = {"every_steps": 10**6, "keep_last": 1}
        raw["logging"] = {"every_steps": 1, "progress": "lines"}
        parse_run_config(raw, base_dir=ROOT, source=r["label"])  # validate here, before the sweep
        return {"config": raw, "warmup": warmup, "timed": timed, "count_tensors": count}

    def job(r: dict) -> dict:
        if r["kind"].startswith("full (bf16"):
            return job_for(r, args.bf16_warmup, args.bf16_timed, False)
        return job_for(r, args.warmup, args.timed, not args.no_tensor_count)

    def show(r: dict, res: dict) -> None:
        if "error" in res:
            return
        if res.get("capped"):
            log(f"  capped after {res['cap_seconds']:.0f} s of training: {len(res['micro_batch_seconds'])} micro-batches "
                f"done, <= {res['tokens_per_second']:.0f} tokens/s ({res['estimate']}; predicted "
                f"{r['predicted_tokens_per_second']:.0f}), others {res['foreign_busy_cores_during']:.2f} cores, "
                f"{res['wall_seconds']:.0f} s")
            return
        log(f"  {res['tokens_per_second']:.0f} tokens/s (predicted {r['predicted_tokens_per_second']:.0f}), "
            f"peak RSS {res['peak_rss_bytes'] / MIB:.0f} MiB (predicted {r['predicted_total_bytes'] / MIB:.0f}), "
            f"load {res['load_before']['loadavg'][0]:.2f}, others {res['foreign_busy_cores_during']:.2f} cores, "
            f"{res['wall_seconds']:.0f} s")

    first = False  # the load-average rule ran before the benchmark; from here on our own work shows in it
    for i, r in enumerate(chosen):
        log(f"[{i + 1}/{len(chosen)}] {r['label']}  ({r['kind']})")
        res = measure(job(r), log, first=first, cap_seconds=args.bf16_cap if r["kind"] == "capped probe" else None)
        first = False
        res["round"] = 1
        r["runs"].append(res)
        show(r, res)
    ok = [r for r in full if r["runs"] and "error" not in r["runs"][0]]
    top = sorted(ok, key=lambda r: -r["runs"][0]["tokens_per_second"])[:args.confirm_top]
    confirm = top + [r for r in picks if r not in top]
    for i, r in enumerate(reversed(confirm)):
        log(f"[confirm {i + 1}/{len(confirm)}] {r['label']}  (round 2)")
        res = measure(job(r), log, first=False)
        res["round"] = 2
        r["runs"].append(res)
        show(r, res)

    import torch
    import transformers

    mem = hw.memory
    ctx = {
        "command": "python " + " ".join(["bench/plan_quality.py", *sys.argv[1:]]),
        "quick": args.quick,
        "machine": {"cpu": hw.cpu.model, "physical_cores": hw.cpu.physical_cores, "logical_cores": hw.cpu.logical_cores,
                    "usable_cores": hw.cpu.usable_cores, "ram_bytes": getattr(mem, "total_bytes", None),
                    "cpu_flags": {k: v for k, v in hw.cpu.flags.items() if v}, "rules": rules.label,
                    "benchmarked_profile": dataclasses.asdict(hw_bench.benchmark) if hw_bench.benchmark else None,
                    "load_before_benchmark": quiet_for_benchmark, "torch_matmul_gflops_1024": matmul,
                    "python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__},
        "model": dataclasses.asdict(spec), "params_total": modes["balanced"].params_total,
        "seq_len": SEQ_LEN, "target_batch": TARGET_BATCH, "memory_budget_bytes": BUDGET,
        "warmup_steps": args.warmup, "timed_steps": args.timed,
        "planning_seconds_all": plan_times,
        "planning_seconds_first": plan_times[0], "planning_seconds_median": statistics.median(plan_times[1:]),
        "torch_imported_by_plan": torch_loaded_by_plan, "trial_runs_by_planner": 0,
        "modes": [{"mode": m.mode, "setup": label(knobs(m.setup)), "knobs": knobs(m.setup),
                   "memory_budget_bytes": m.memory_budget_bytes, "predicted_total_bytes": m.memory_used_bytes,
                   "predicted_tokens_per_second": m.speed.tokens_per_second,
                   "candidates_evaluated": m.candidates_evaluated, "reasons": m.reasons} for m in result.modes],
        "balanced_with_benchmarked_profile": {"setup": label(knobs(bench_plan.setup)), "knobs": knobs(bench_plan.setup),
                                              "predicted_tokens_per_second": bench_plan.speed.tokens_per_second},
        "tokenizer": tok,
        "bf16": {"anchor_warmup": args.bf16_warmup, "anchor_timed": args.bf16_timed, "probe_cap_seconds": args.bf16_cap,
                 "full": args.full_bf16},
        "load_at_start": load_at_start, "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": time.perf_counter() - started,
    }
    for d in (tok_probe_dir, tok_dir):
        shutil.rmtree(d, ignore_errors=True)
    write_results(ctx, rows, Path(args.out) if args.out else
                  (Path("/tmp/plan_quality_quick") if args.quick else RESULTS / "plan_quality"))
    return 0


def analyze(ctx: dict, rows: list[dict]) -> tuple[dict, list[dict]]:
    """Verdicts and tables from the raw runs (also from a stored JSON: --from)."""
    by_label = {r["label"]: r for r in rows}
    modes = {m["mode"]: m for m in ctx["modes"]}
    for r in rows:  # derived fields of an earlier analysis (--from)
        for key in ("measured", "measured_rank", "predicted_rank", "within_balanced_budget"):
            r.pop(key, None)
    chosen = [r for r in rows if r["runs"]]
    # Per configuration: the better round's tokens/s, the worst round's peak RSS.
    for r in chosen:
        good = [x for x in r["runs"] if "error" not in x]
        if not good:
            r["measured"] = None
            continue
        best = max(good, key=lambda x: x["tokens_per_second"])
        capped = bool(best.get("capped"))
        r["measured"] = {
            "tokens_per_second": best["tokens_per_second"],
            "upper_bound": capped,
            "median_step_seconds": best.get("median_step_seconds"),
            "tokens_per_second_rounds": [round(x["tokens_per_second"], 1) for x in good],
            "peak_rss_bytes": max(x["peak_rss_bytes"] for x in good),
            "peak_rss_partial": capped,
            "peak_rss_end_bytes": max(x.get("peak_rss_end_bytes") or x["peak_rss_bytes"] for x in good),
            "tensor_peak_bytes": max((x.get("tensor_peak_bytes") or 0) for x in good) or None,
            "foreign_busy_cores_during": max(x["foreign_busy_cores_during"] for x in good),
        }
    measured = [r for r in chosen if r.get("measured")]

    # (a) every mode's measured peak within its share of the budget
    verdict_a = []
    for m in ctx["modes"]:
        r = by_label[m["setup"]]
        peak = r["measured"]["peak_rss_bytes"] if r.get("measured") else None
        verdict_a.append({"mode": m["mode"], "setup": r["label"], "budget_bytes": m["memory_budget_bytes"],
                          "predicted_total_bytes": m["predicted_total_bytes"], "measured_peak_rss_bytes": peak,
                          "measured_peak_rss_end_bytes": r["measured"]["peak_rss_end_bytes"] if peak else None,
                          "measured_tensor_peak_bytes": r["measured"]["tensor_peak_bytes"] if peak else None,
                          "predicted_tensor_peak_bytes": r["predicted_tensor_peak_bytes"],
                          "pass": peak is not None and peak <= m["memory_budget_bytes"]})
    # (b) balanced plan vs the best measured configuration within the balanced budget
    bal_budget = modes["balanced"]["memory_budget_bytes"]
    for r in measured:
        r["within_balanced_budget"] = r["measured"]["peak_rss_bytes"] <= bal_budget
    fitting = sorted([r for r in measured if r["within_balanced_budget"]],
                     key=lambda r: -r["measured"]["tokens_per_second"])
    for i, r in enumerate(fitting):
        r["measured_rank"] = i + 1
    bal_row = by_label[modes["balanced"]["setup"]]
    bench_row = by_label[ctx["balanced_with_benchmarked_profile"]["setup"]]
    fitting_full = [r for r in fitting if not r["measured"]["upper_bound"]]
    best_row = fitting_full[0] if fitting_full else None
    # A capped probe gives an estimate that errs high (no optimizer update, or an upper bound):
    # if one reached the best full measurement, the sweep could not tell, and says so.
    probe_contenders = [r["label"] for r in fitting if r["measured"]["upper_bound"] and best_row
                        and r["measured"]["tokens_per_second"] >= 0.95 * best_row["measured"]["tokens_per_second"]]
    ratio = (bal_row["measured"]["tokens_per_second"] / best_row["measured"]["tokens_per_second"]
             if best_row and bal_row.get("measured") else None)
    bench_ratio = (bench_row["measured"]["tokens_per_second"] / best_row["measured"]["tokens_per_second"]
                   if best_row and bench_row.get("measured") else None)
    pred_sorted = sorted(measured, key=lambda r: -r["predicted_tokens_per_second"])
    for i, r in enumerate(pred_sorted):
        r["predicted_rank"] = i + 1
    full_measured = [r for r in measured if not r["measured"]["upper_bound"]]
    fp32_measured = [r for r in full_measured if r["knobs"]["precision"] == "fp32"]

    def rank_corr(group: list[dict], key: str) -> float | None:
        return spearman([r[key] for r in group], [r["measured"]["tokens_per_second"] for r in group]) \
            if len(group) > 2 else None

    rho = {"all_measured": rank_corr(measured, "predicted_tokens_per_second"),
           "fully_measured": rank_corr(full_measured, "predicted_tokens_per_second"),
           "fp32_only": rank_corr(fp32_measured, "predicted_tokens_per_second")}
    rho_bench = {"all_measured": rank_corr(measured, "predicted_tokens_per_second_benchmarked_profile"),
                 "fully_measured": rank_corr(full_measured, "predicted_tokens_per_second_benchmarked_profile"),
                 "fp32_only": rank_corr(fp32_measured, "predicted_tokens_per_second_benchmarked_profile")}

    # Knob effects: pairs that differ in one knob only (measured vs predicted tokens/s ratio).
    def pair_effects(knob: str, a, b, *, full_only: bool) -> dict | None:
        ratios_m, ratios_p, ratios_pb = [], [], []
        for r in (full_measured if full_only else measured):
            if r["knobs"][knob] != a:
                continue
            other = {**r["knobs"], knob: b}
            o = by_label.get(label(other))
            if o is None or not o.get("measured") or (full_only and o["measured"]["upper_bound"]):
                continue
            ratios_m.append(o["measured"]["tokens_per_second"] / r["measured"]["tokens_per_second"])
            ratios_p.append(o["predicted_tokens_per_second"] / r["predicted_tokens_per_second"])
            ratios_pb.append(o["predicted_tokens_per_second_benchmarked_profile"]
                             / r["predicted_tokens_per_second_benchmarked_profile"])
        if not ratios_m:
            return None
        return {"knob": knob, "change": f"{a} -> {b}", "pairs": len(ratios_m), "fully_measured_pairs": full_only,
                "measured_speedup_median": statistics.median(ratios_m), "measured_min": min(ratios_m),
                "measured_max": max(ratios_m), "predicted_speedup_median": statistics.median(ratios_p),
                "predicted_speedup_median_benchmarked_profile": statistics.median(ratios_pb)}

    effects = [e for e in (pair_effects("precision", "fp32", "bf16-mixed", full_only=False),
                           pair_effects("grad_checkpointing", "none", "full", full_only=True),
                           pair_effects("attention", "sdpa", "eager", full_only=True)) if e]
    mb_effect = []  # fp32, fully measured: the micro-batch axis
    for mb in sorted({r["knobs"]["micro_batch"] for r in fp32_measured}):
        group = [r for r in fp32_measured if r["knobs"]["micro_batch"] == mb]
        mb_effect.append({"micro_batch": mb, "configs": len(group),
                          "measured_tokens_per_second_median": statistics.median(
                              r["measured"]["tokens_per_second"] for r in group),
                          "predicted_tokens_per_second_median": statistics.median(
                              r["predicted_tokens_per_second"] for r in group)})
    best_mb = []  # per fp32 base (checkpointing x attention): the best micro-batch, measured vs predicted
    for ck in ("none", "full"):
        for att in ("sdpa", "eager"):
            group = [r for r in fp32_measured if r["knobs"]["grad_checkpointing"] == ck and r["knobs"]["attention"] == att]
            if len(group) < 2:
                continue
            bm = max(group, key=lambda r: r["measured"]["tokens_per_second"])
            bp = max(group, key=lambda r: r["predicted_tokens_per_second"])
            best_mb.append({"grad_checkpointing": ck, "attention": att,
                            "measured_best_micro_batch": bm["knobs"]["micro_batch"],
                            "predicted_best_micro_batch": bp["knobs"]["micro_batch"],
                            "predicted_best_measured_share": bp["measured"]["tokens_per_second"]
                            / bm["measured"]["tokens_per_second"]})

    threads = sorted({x["torch_threads"] for r in measured for x in r["runs"] if x.get("torch_threads")})
    # Noise: configurations measured in two rounds (same process recipe, minutes apart).
    spread = sorted(max(x) / min(x) - 1 for x in (r["measured"]["tokens_per_second_rounds"] for r in full_measured)
                    if len(x) >= 2)
    near_best = [r["label"] for r in fitting_full if best_row
                 and r["measured"]["tokens_per_second"] >= 0.95 * best_row["measured"]["tokens_per_second"]]
    rss_ratio = sorted((r["measured"]["peak_rss_bytes"] / r["predicted_total_bytes"], r["label"]) for r in full_measured)
    tensor_ratio = sorted((r["measured"]["tensor_peak_bytes"] / r["predicted_tensor_peak_bytes"], r["label"])
                          for r in full_measured if r["measured"]["tensor_peak_bytes"])
    summary = {
        **ctx, "torch_threads": threads,
        "verdict_a": verdict_a, "verdict_a_pass": all(v["pass"] for v in verdict_a),
        "verdict_b": {"balanced_setup": bal_row["label"],
                      "balanced_measured_tokens_per_second": bal_row["measured"]["tokens_per_second"]
                      if bal_row.get("measured") else None,
                      "balanced_predicted_tokens_per_second": bal_row["predicted_tokens_per_second"],
                      "balanced_predicted_tokens_per_second_benchmarked_profile":
                          bal_row["predicted_tokens_per_second_benchmarked_profile"],
                      "best_setup": best_row["label"] if best_row else None,
                      "best_measured_tokens_per_second": best_row["measured"]["tokens_per_second"] if best_row else None,
                      "ratio": ratio, "pass": ratio is not None and ratio >= 0.95,
                      "balanced_rank": bal_row.get("measured_rank"), "fitting_configs": len(fitting),
                      "balanced_budget_bytes": bal_budget,
                      "benchmarked_profile_setup": bench_row["label"],
                      "benchmarked_profile_ratio": bench_ratio,
                      "benchmarked_profile_rank": bench_row.get("measured_rank")},
        "spearman_predicted_vs_measured": rho, "spearman_benchmarked_profile": rho_bench,
        "knob_effects": effects, "micro_batch_effect": mb_effect, "best_micro_batch_per_base": best_mb,
        "probe_contenders": probe_contenders,
        "round_to_round_spread": {"configs": len(spread), "median": statistics.median(spread) if spread else None,
                                  "max": spread[-1] if spread else None},
        "within_5pct_of_best": near_best,
        "peak_rss_over_predicted_total": {
            "median": statistics.median(x for x, _ in rss_ratio) if rss_ratio else None,
            "min": rss_ratio[0] if rss_ratio else None, "max": rss_ratio[-1] if rss_ratio else None},
        "tensor_peak_over_predicted": {"configs": len(tensor_ratio), "min": tensor_ratio[0] if tensor_ratio else None,
                                       "max": tensor_ratio[-1] if tensor_ratio else None},
        "measured_counts": {"full": sum(1 for r in measured if r["kind"] == "full"),
                            "bf16_anchor": sum(1 for r in measured if r["kind"].startswith("full (bf16")),
                            "capped_probes": sum(1 for r in measured if r["kind"] == "capped probe"),
                            "space": len(rows)},
        "max_foreign_busy_cores_during": max((r["measured"]["foreign_busy_cores_during"] for r in measured), default=None),
    }
    return summary, measured


def write_results(ctx: dict, rows: list[dict], out: Path) -> None:
    summary, measured = analyze(ctx, rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"context": ctx, "summary": summary, "rows": rows}, indent=2,
                                                   default=str) + "\n")
    md = render(summary, rows, measured)
    out.with_suffix(".md").write_text(md)
    print(md)


def _tps(me: dict) -> str:
    return ("<= " if me["upper_bound"] else "") + f"{me['tokens_per_second']:.0f}"


def render(s: dict, rows: list[dict], measured: list[dict]) -> str:
    m = s["machine"]
    vb = s["verdict_b"]
    counts = s["measured_counts"]
    ram = f"{m['ram_bytes'] / GIB:.1f} GiB RAM" if m["ram_bytes"] else "RAM unknown"
    bp = m["benchmarked_profile"] or {}
    mm = m["torch_matmul_gflops_1024"]
    bf = s["bf16"]
    lines = [
        "# Planner quality on CPU: plan vs an exhaustive measured sweep",
        "",
        f"Command: `.venv/bin/python {s['command'].removeprefix('python ')}` (about 20 min when the machine is quiet; "
        "`--quick` for a smoke test)"
        + (f"; tables re-analysed from the stored runs with `--from {s['analysed_from']}` (no new measurement)"
           if s.get("analysed_from") else "") + "  ",
        f"Machine (build_profile): {m['cpu']}, {m['physical_cores']} physical / {m['logical_cores']} logical cores, "
        f"{ram}; device rules: {m['rules']}; torch {m['torch']}, transformers {m['transformers']}, "
        f"torch threads {', '.join(str(t) for t in s['torch_threads'])} (the runner leaves torch's default).  ",
        f"torch 1024x1024 matmul here: fp32 {mm['fp32']:.0f} GFLOP/s, bf16 {mm['bf16']:.1f} GFLOP/s (no bf16 "
        "instructions: bf16 is emulated).  ",
        f"Benchmarked profile (best of two `build_profile(benchmark=True)`, for the comparison row only): fp32 "
        f"{bp.get('cpu_fp32_gflops') or 0:.0f} GFLOP/s, bf16 "
        + (f"{bp['cpu_bf16_gflops']:.0f} GFLOP/s" if bp.get("cpu_bf16_gflops") else
           f"not measured ({(bp.get('unavailable') or {}).get('cpu_bf16_gflops', '?')})")
        + f", {bp.get('memory_bandwidth_gbps') or 0:.1f} GB/s.  ",
        f"Model: Llama-style `{SHAPE},vocab={s['tokenizer']['vocab']}` ({s['params_total'] / 1e6:.2f}M parameters, "
        f"untied), method pretrain, seq_len {s['seq_len']}, global batch {s['target_batch']}, `--memory-budget 3GiB`. "
        f"Vocabulary: the byte-level BPE trained on builtin:tiny-corpus, asked for {s['tokenizer']['asked_first']} "
        f"tokens, stops at {s['tokenizer']['vocab_first']} (the corpus is small and repetitive); the run sizes its "
        "embeddings by len(tokenizer), so the spec says the same.  ",
        f"Each configuration: the plan's run config (run_config_dict) with the knobs set, trained by run_training in a "
        f"fresh process; {s['warmup_steps']} warm-up + {s['timed_steps']} timed optimizer steps (tokens/s = 16 x 256 / "
        "median step) + 1 step under the live-tensor counter; peak RSS = ru_maxrss at the end of the last timed step. "
        f"The {s['measured_counts']['full']} fp32 configurations (and the planner's picks) were measured fully; the "
        "fastest of them and the picks twice (better median kept, worse peak kept). bf16-mixed: the one the speed model "
        f"ranks first fully ({bf['anchor_warmup']} warm-up + {bf['anchor_timed']} timed steps), the other "
        f"{counts['capped_probes']} as capped probes ({bf['probe_cap_seconds']:.0f} s of training, then killed; "
        "tokens/s from the finished micro-batches, optimizer update left out, so it errs high; `<=` marks it; their "
        "peak RSS is the partial peak). Measuring all bf16-mixed settings fully would take over an hour "
        "(`--full-bf16`).  ",
        f"Load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in s['load_at_start'])}, at end "
        f"{'/'.join(f'{x:.2f}' for x in s['load_at_end'])}; per run in the table: the 1-min average before the run "
        "(it includes our own previous run, so the wait rule uses the cores other processes used, sampled for 3 s "
        "before the run) and the cores other processes used during the run (max "
        f"{s['max_foreign_busy_cores_during']:.2f}). Wall time {s['wall_seconds'] / 60:.1f} min.",
        "",
        f"**Planning**: {s['planning_seconds_first'] * 1e3:.1f} ms for the first plan() call (three modes), median "
        f"{s['planning_seconds_median'] * 1e3:.1f} ms for the next 20; zero trial runs (plan() never trains: torch "
        f"{'was' if s['torch_imported_by_plan'] else 'was not even'} imported while it ran).",
        "",
        "## (a) Each mode's measured peak within its share of the budget: "
        + ("**PASS**" if s["verdict_a_pass"] else "**FAIL**"),
        "",
        "| mode | plan | budget (share of 3 GiB) | predicted total | measured peak RSS | headroom | "
        "peak RSS incl. counted step + save | live tensors measured / predicted | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in s["verdict_a"]:
        peak = v["measured_peak_rss_bytes"]
        tp = v["measured_tensor_peak_bytes"]
        lines.append(
            f"| {v['mode']} | {v['setup']} | {v['budget_bytes'] / MIB:.0f} MiB | {v['predicted_total_bytes'] / MIB:.0f} MiB | "
            f"{peak / MIB:.0f} MiB | {(1 - peak / v['budget_bytes']):.0%} | {v['measured_peak_rss_end_bytes'] / MIB:.0f} MiB | "
            f"{(tp or 0) / MIB:.0f} / {v['predicted_tensor_peak_bytes'] / MIB:.0f} MiB | "
            f"{'pass' if v['pass'] else 'FAIL'} |")
    rr = s["peak_rss_over_predicted_total"]
    if rr["median"] is not None and s["tensor_peak_over_predicted"]["configs"]:
        lines += ["", f"Memory model over all {s['measured_counts']['full'] + s['measured_counts']['bf16_anchor']} fully "
                  f"measured configurations: measured peak RSS / predicted total median {rr['median']:.2f}, from "
                  f"{rr['min'][0]:.2f} (`{rr['min'][1]}`) to {rr['max'][0]:.2f} (`{rr['max'][1]}`). Live-tensor peak "
                  f"(counted) / predicted tensor peak over {s['tensor_peak_over_predicted']['configs']} configurations: "
                  f"from {s['tensor_peak_over_predicted']['min'][0]:.3f} to {s['tensor_peak_over_predicted']['max'][0]:.3f} "
                  f"(`{s['tensor_peak_over_predicted']['max'][1]}`), so the gap between RSS and prediction is mostly in the "
                  "margin the memory model adds for the allocator and runtime, not in the tensors."]
    ratio = vb["ratio"]
    rho, rhob = s["spearman_predicted_vs_measured"], s["spearman_benchmarked_profile"]

    def f2(x):
        return "n/a" if x is None else f"{x:.2f}"

    lines += [
        "",
        f"## (b) Balanced plan vs the best measured configuration: **{ratio:.1%}** "
        + ("(**PASS**, >= 95 %)" if vb["pass"] else "(**FAIL**, < 95 %)"),
        "",
        f"Balanced plan `{vb['balanced_setup']}`: {vb['balanced_measured_tokens_per_second']:.0f} tokens/s measured, "
        f"rank {vb['balanced_rank']} of {vb['fitting_configs']} configurations whose measured peak is within the balanced "
        f"budget ({vb['balanced_budget_bytes'] / MIB:.0f} MiB). Best measured: `{vb['best_setup']}` "
        f"{vb['best_measured_tokens_per_second']:.0f} tokens/s. "
        + ("No capped probe came within 95 % of it." if not s["probe_contenders"] else
           f"Capped probes that might reach it (not settled): {', '.join(s['probe_contenders'])}.") + "  ",
        f"Noise: {len(s['within_5pct_of_best'])} fully measured configurations are within 5 % of the best "
        f"({', '.join(f'`{x}`' for x in s['within_5pct_of_best'])}); the {s['round_to_round_spread']['configs']} "
        "configurations measured in two rounds differ between rounds by "
        + (f"{s['round_to_round_spread']['median']:.0%} (median), {s['round_to_round_spread']['max']:.0%} (max)"
           if s["round_to_round_spread"]["configs"] else "n/a")
        + ", so the order near the top is within this VM's noise; the verdict is about the planner's pick staying "
        "there.  ",
        f"Same request with a benchmarked profile (`trainfit profile --benchmark --json` passed as `--hardware`): "
        f"`{vb['benchmarked_profile_setup']}`, {vb['benchmarked_profile_ratio']:.1%} of the best "
        f"(rank {vb['benchmarked_profile_rank']}).  ",
        f"Absolute speed of the balanced plan: measured {vb['balanced_measured_tokens_per_second']:.0f} tokens/s, "
        f"predicted {vb['balanced_predicted_tokens_per_second']:.0f} with the quick profile the planner uses "
        f"(measured/predicted {vb['balanced_measured_tokens_per_second'] / vb['balanced_predicted_tokens_per_second']:.2f}"
        f"), {vb['balanced_predicted_tokens_per_second_benchmarked_profile']:.0f} with the benchmarked one "
        f"({vb['balanced_measured_tokens_per_second'] / vb['balanced_predicted_tokens_per_second_benchmarked_profile']:.2f})."
        "  ",
        f"Rank correlation (Spearman) of predicted vs measured tokens/s: all {len(measured)} configurations "
        f"{f2(rho['all_measured'])} (benchmarked profile {f2(rhob['all_measured'])}); fully measured "
        f"{f2(rho['fully_measured'])} ({f2(rhob['fully_measured'])}); fp32 only {f2(rho['fp32_only'])} "
        f"({f2(rhob['fp32_only'])}).",
        "",
        "Knob effects (pairs of configurations that differ in that knob only; tokens/s ratio new / old; the precision "
        "pairs use the probes' estimates for bf16-mixed, the other knobs only pairs measured fully):",
        "",
        "| knob | change | pairs | measured median (min-max) | predicted median (quick profile) | "
        "predicted median (benchmarked profile) |",
        "|---|---|---|---|---|---|",
    ]
    for e in s["knob_effects"]:
        lines.append(f"| {e['knob']} | {e['change']} | {e['pairs']} | {e['measured_speedup_median']:.3g}x "
                     f"({e['measured_min']:.3g}-{e['measured_max']:.3g}) | {e['predicted_speedup_median']:.2f}x | "
                     f"{e['predicted_speedup_median_benchmarked_profile']:.2f}x |")
    lines += ["", "Micro-batch (fp32, fully measured):", "",
              "| micro-batch | configurations | measured tokens/s (median) | predicted tokens/s (median) |",
              "|---|---|---|---|"]
    for e in s["micro_batch_effect"]:
        lines.append(f"| {e['micro_batch']} | {e['configs']} | {e['measured_tokens_per_second_median']:.0f} | "
                     f"{e['predicted_tokens_per_second_median']:.0f} |")
    if s["best_micro_batch_per_base"]:
        lines += ["", "| fp32 base | best micro-batch measured | predicted best | its measured share of the best |",
                  "|---|---|---|---|"]
        for e in s["best_micro_batch_per_base"]:
            base = ("ckpt" if e["grad_checkpointing"] != "none" else "no ckpt") + f" {e['attention']}"
            lines.append(f"| {base} | {e['measured_best_micro_batch']} | {e['predicted_best_micro_batch']} | "
                         f"{e['predicted_best_measured_share']:.1%} |")
    lines += [
        "",
        "## Full table (ordered by measured tokens/s)",
        "",
        "bf16m = bf16-mixed autocast, ckpt = full gradient checkpointing, mbAxB = micro-batch A x accumulation B; "
        "optimizer adamw everywhere. Rank: measured, among configurations within the balanced budget / predicted, among "
        "all measured. Rounds: every measured round (the best is used).",
        "",
        "| setup | picked by | measured how | predicted tokens/s | measured tokens/s | rounds | rank (measured / predicted) | "
        "predicted total | measured peak RSS | live tensors | within balanced budget | load 1-min / others' cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(measured, key=lambda r: -r["measured"]["tokens_per_second"]):
        me = r["measured"]
        first = next(x for x in r["runs"] if "error" not in x)
        peak = f"{me['peak_rss_bytes'] / MIB:.0f} MiB" + (" (partial)" if me["peak_rss_partial"] else "")
        lines.append(
            f"| {r['label']} | {', '.join(r['picked_by']) or ''} | {r['kind']} | {r['predicted_tokens_per_second']:.0f} | "
            f"{_tps(me)} | {' / '.join(f'{x:.0f}' for x in me['tokens_per_second_rounds'])} | "
            f"{r.get('measured_rank', '-')} / {r['predicted_rank']} | {r['predicted_total_bytes'] / MIB:.0f} MiB | "
            f"{peak} | {(me['tensor_peak_bytes'] or 0) / MIB:.0f} MiB | "
            f"{'yes' if r['within_balanced_budget'] else 'NO'} | {first['load_before']['loadavg'][0]:.2f} / "
            f"{me['foreign_busy_cores_during']:.2f} |")
    failed = [r for r in rows if r["runs"] and not r.get("measured")]
    if failed:
        lines += ["", "Failed runs: " + ", ".join(r["label"] for r in failed)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
