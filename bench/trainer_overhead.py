"""Overhead of `trainfit train` over the same training written directly against Transformers' Trainer.

Same model (a Llama-style shape, random init with the same seed), same tokenizer and packed data,
same TrainingArguments (batch, lr, schedule, seed), same number of steps. Both variants are timed
by the same per-step callback; the figure is the median optimizer-step time after warm-up.
Variants run interleaved (A B A B ...) in one process so that background load hits both alike.

    .venv/bin/python bench/trainer_overhead.py [--rounds 3] [--steps 30]

Writes bench/results/trainer_overhead.json and .md. Re-run on a quiet machine for the figure
that counts: the load average seen during the run is recorded next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARMUP = 5

CONFIG = {
    "version": 1, "name": "overhead", "method": "pretrain",
    "model": {"shape": {"layers": 4, "hidden": 192, "heads": 6}, "weights": "random"},
    "tokenizer": {"vocab_size": 2048},
    "data": {"paths": ["builtin:tiny-corpus"], "format": "text"},
    "training": {"precision": "fp32", "micro_batch": 16, "seq_len": 128},
    "schedule": {"max_steps": 30, "lr": 2.0e-3, "warmup_steps": 5, "scheduler": "cosine", "seed": 42},
    "checkpointing": {"every_steps": 1_000_000, "keep_last": 1},  # checkpoint cost is not the question
    "logging": {"every_steps": 5, "progress": "lines"},
}


def run_trainfit(cfg, work: Path, tag: str) -> list[float]:
    from trainfit.train.runner import run_training

    result = run_training(cfg, work / f"trainfit-{tag}", quiet=True)
    return result.step_seconds


def run_plain(cfg, tokenizer_dir: Path, work: Path, tag: str) -> list[float]:
    """The same training written the way a user would with Transformers alone."""
    import datasets
    import torch
    from transformers import (AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback,
                              TrainingArguments, default_data_collator)

    from trainfit.train.hf_config import build_hf_config
    from trainfit.config.run_config import shape_spec

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    seq = cfg.training.seq_len
    raw = datasets.load_dataset("text", data_files=_corpus(), split="train")

    def tokenize(b):
        return {"input_ids": [x + [tok.eos_token_id] for x in tok(b["text"], add_special_tokens=False)["input_ids"]]}

    def group(b):
        flat = [t for ids in b["input_ids"] for t in ids]
        n = len(flat) // seq * seq
        blocks = [flat[i:i + seq] for i in range(0, n, seq)]
        return {"input_ids": blocks, "labels": [list(x) for x in blocks]}

    data = raw.map(tokenize, batched=True, remove_columns=["text"]).map(group, batched=True, batch_size=1000)
    torch.manual_seed(cfg.schedule.seed)
    model = AutoModelForCausalLM.from_config(build_hf_config(shape_spec(cfg.model.shape, len(tok))),
                                             attn_implementation="sdpa")
    s = cfg.schedule
    args = TrainingArguments(
        output_dir=str(work / f"plain-{tag}"), per_device_train_batch_size=cfg.training.micro_batch,
        gradient_accumulation_steps=cfg.training.grad_accum, learning_rate=s.lr, lr_scheduler_type=s.scheduler,
        warmup_steps=s.warmup_steps, max_steps=s.max_steps, seed=s.seed, data_seed=s.seed, optim="adamw_torch",
        save_strategy="no", logging_steps=cfg.logging.every_steps, report_to="none", disable_tqdm=True,
        use_cpu=True, max_grad_norm=s.max_grad_norm, dataloader_num_workers=0,
    )
    timer = Timer()
    Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
            processing_class=tok, callbacks=[timer]).train()
    return timer.times


def _corpus() -> str:
    from trainfit.config.run_config import corpora_dir

    return str(corpora_dir() / "tiny-corpus.txt")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from trainfit.config.run_config import parse_run_config

    raw = dict(CONFIG, schedule=dict(CONFIG["schedule"], max_steps=a.steps))
    cfg = parse_run_config(raw, source="bench")
    transformers.logging.set_verbosity_error()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainfit-overhead-") as tmp:
        work = Path(tmp)
        run_trainfit(cfg, work, "warm")  # trains the tokenizer once and warms caches; not counted
        tok_dir = work / "trainfit-warm" / "tokenizer"
        for r in range(a.rounds):
            for variant in ("trainfit", "plain"):
                t0 = time.perf_counter()
                times = run_trainfit(cfg, work, str(r)) if variant == "trainfit" else \
                    run_plain(cfg, tok_dir, work, str(r))
                med = statistics.median(times[WARMUP:])
                rows.append({"round": r, "variant": variant, "median_step_seconds": med,
                             "wall_seconds": time.perf_counter() - t0, "load_1m": os.getloadavg()[0]})
                print(f"round {r} {variant:8s} median step {med * 1000:.1f} ms", file=sys.stderr)
    tf = statistics.median(x["median_step_seconds"] for x in rows if x["variant"] == "trainfit")
    pl = statistics.median(x["median_step_seconds"] for x in rows if x["variant"] == "plain")
    result = {
        "what": "median optimizer-step seconds after warm-up: trainfit train vs plain transformers.Trainer",
        "command": "python bench/trainer_overhead.py " + " ".join(sys.argv[1:]),
        "config": raw, "steps": a.steps, "warmup_steps_excluded": WARMUP, "rounds": a.rounds,
        "trainfit_median_step_seconds": tf, "plain_median_step_seconds": pl,
        "overhead_fraction": tf / pl - 1.0, "target_overhead_fraction": 0.03,
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        "rows": rows,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trainer_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# trainfit train overhead vs plain Transformers Trainer", "",
        f"Command: `{result['command'].strip()}` ({a.rounds} rounds, A/B interleaved, {a.steps} steps each, "
        f"first {WARMUP} steps excluded).", "",
        "| variant | median step (ms) |", "|---|---|",
        f"| trainfit train | {tf * 1000:.2f} |", f"| plain Trainer | {pl * 1000:.2f} |", "",
        f"Overhead: **{(tf / pl - 1) * 100:+.2f} %** (target <= 3 %).", "",
        f"Load average (1 min) before: {load_before[0]:.2f}, after: {result['load_average_after'][0]:.2f} "
        f"on {os.cpu_count()} CPUs ({_load_note(load_before[0])}).", "",
        "| round | variant | median step (ms) | load 1m |", "|---|---|---|---|",
    ] + [f"| {x['round']} | {x['variant']} | {x['median_step_seconds'] * 1000:.2f} | {x['load_1m']:.2f} |"
         for x in rows]
    (out / "trainer_overhead.md").write_text("\n".join(md) + "\n")
    print(f"overhead {(tf / pl - 1) * 100:+.2f} %", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _load_note(load_1m: float) -> str:
    """Above ~0.5 on this 2-core machine, other jobs were running and step times are noisy."""
    if load_1m > 0.5:
        return "other jobs shared the cores: re-run on a quiet machine for the definitive figure"
    return "quiet machine; the run itself raises the load"
