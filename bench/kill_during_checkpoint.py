"""kill -9 in the middle of a checkpoint write, then `trainfit train --resume`: 20 runs.

Each run starts `trainfit train` on a tiny CPU pretraining (16 steps, a checkpoint every 4,
keep_last 2) in a subprocess whose checkpoint write is held at one point by a fault hook (the
process signals readiness through a file and sleeps there) or, for the "random" runs, is killed
after a random delay from the start of the write; then:

1. the process is killed with SIGKILL (nothing of trainfit runs after it);
2. the newest complete checkpoint is found (trainfit.train.recovery.checkpoints.latest_complete) and read
   the way resuming reads it (check_loadable);
3. `trainfit train --resume` (a subprocess, the real command) runs to the end: its exit code, and
   its losses against an uninterrupted run of the same config, must match exactly (CPU, fp32);
4. no leftover (`.staging-*`, `.checkpoint-*.trash-*`) is in checkpoints/ afterwards.

Hook points, in the order a checkpoint is written (trainer_ext._save_checkpoint):
model (before the weights), optimizer_torn (optimizer.pt half written), rng (weights, optimizer and
scheduler written, before rng_state / trainer_state), manifest (every file written, the manifest's
temporary file torn), sealed (manifest complete, before the rename that publishes it), published
(renamed, the empty staging root not yet removed), rotation (the oldest checkpoint renamed to its
trash name and half deleted), random (SIGKILL at a uniform time after the 3rd write began, within
the duration of the 2nd; a write that ends first holds there, so the kill never lands later).

    .venv/bin/python bench/kill_during_checkpoint.py [--runs 20] [--seed 0]

Writes bench/results/kill_during_checkpoint.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CONFIG = {
    "version": 1, "name": "kill", "method": "pretrain",
    "model": {"shape": {"layers": 1, "hidden": 64, "heads": 4}, "weights": "random"},
    "tokenizer": {"vocab_size": 512, "train_max_bytes": 150_000},
    "data": {"paths": ["builtin:tiny-corpus"], "max_samples": 600},
    "training": {"precision": "fp32", "micro_batch": 4, "seq_len": 64, "device": "cpu"},
    "schedule": {"max_steps": 16, "lr": 3.0e-3, "warmup_steps": 2, "seed": 7},
    "checkpointing": {"every_steps": 4, "keep_last": 2},
    "logging": {"every_steps": 1, "progress": "lines"},
}
# (hook point, which checkpoint write of the run it holds: 2nd = step 8, 3rd = step 12)
PLAN = [(p, n) for n in (2, 3) for p in ("model", "optimizer_torn", "rng", "manifest", "sealed", "published")]
PLAN += [("rotation", 3), ("rotation", 3)] + [("random", 3)] * 6

ENTRY = textwrap.dedent('''
    # `trainfit train` with a fault hook inside one checkpoint write (bench/kill_during_checkpoint.py)
    import io, os, sys, time
    from pathlib import Path

    phase, target, ready, argv = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    import torch
    import transformers
    from trainfit import files
    from trainfit.cli.main import main
    from trainfit.train import trainer_ext
    from trainfit.train.recovery import checkpoints as ck

    count = [0]

    def active():
        return count[0] == target

    def hold():
        ready.write_text(phase)
        time.sleep(600)

    real_with = trainer_ext.with_trainfit

    def with_count(base, **kw):
        cls = real_with(base, **kw)
        inner = cls._save_checkpoint

        def _save_checkpoint(self, model, trial):
            count[0] += 1
            if phase == "random" and active():
                ready.write_text("saving")
            t0 = time.perf_counter()
            out = inner(self, model, trial)
            with open(str(ready) + ".durations", "a") as fh:  # how long the earlier writes took
                fh.write(f"{time.perf_counter() - t0}\\n")
            if phase == "random" and active():  # the kill came later than this write: no later one
                Path(str(ready) + ".after").write_text("")
                hold()
            return out

        cls._save_checkpoint = _save_checkpoint
        return cls

    trainer_ext.with_trainfit = with_count

    if phase == "model":
        real_save_model = transformers.Trainer.save_model

        def save_model(self, output_dir=None, _internal_call=False):
            if _internal_call and active():
                hold()
            return real_save_model(self, output_dir, _internal_call)

        transformers.Trainer.save_model = save_model
    elif phase == "optimizer_torn":
        real_torch_save = torch.save

        def torn_save(obj, f, *a, **kw):
            if isinstance(f, (str, os.PathLike)) and str(f).endswith("optimizer.pt") and active():
                buf = io.BytesIO()
                real_torch_save(obj, buf, *a, **kw)
                with open(f, "wb") as fh:
                    fh.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                    fh.flush()
                    os.fsync(fh.fileno())
                hold()
            return real_torch_save(obj, f, *a, **kw)

        torch.save = torn_save
    elif phase == "rng":
        real_rng = transformers.Trainer._save_rng_state

        def save_rng(self, output_dir):
            if active():
                hold()
            return real_rng(self, output_dir)

        transformers.Trainer._save_rng_state = save_rng
    elif phase == "manifest":
        real_seal = ck.seal

        def seal(staging):
            if active():
                (staging / (ck.MANIFEST + ".tmp")).write_text('{"version": 1, "files": [{"file": "con')
                hold()
            return real_seal(staging)

        ck.seal = seal
    elif phase in ("sealed", "published"):
        real_publish = ck.publish

        def publish(staging, final, log=print):
            if phase == "sealed" and active():
                hold()
            out = real_publish(staging, final, log=log)
            if phase == "published" and active():
                hold()
            return out

        ck.publish = publish
    elif phase == "rotation":
        real_rmtree = files.shutil.rmtree

        def rmtree(path, *a, **kw):
            path = Path(path)
            if ".trash-" in path.name and active():
                for f in sorted(path.iterdir())[::2]:
                    f.unlink()
                hold()
            return real_rmtree(path, *a, **kw)

        files.shutil.rmtree = rmtree
    sys.exit(main(argv))
''')


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss, read by `trainfit report`'s reader of metrics.jsonl."""
    from trainfit.report.run_data import load_run

    steps = load_run(run_dir).steps
    return {step: loss for step, loss in zip(steps["step"], steps["loss"]) if loss is not None}


def leftovers(ckpt_dir: Path) -> list[str]:
    return sorted(p.name for p in ckpt_dir.iterdir() if p.name.startswith("."))


def one_run(i: int, phase: str, target: int, work: Path, config: Path, entry: Path, reference: dict,
            rng: random.Random) -> dict:
    from trainfit.train.recovery import checkpoints as ck

    run_dir, ready = work / f"run{i:02d}", work / f"ready{i:02d}"
    cmd = [sys.executable, str(entry), phase, str(target), str(ready), "train", str(config), "--out", str(run_dir),
           "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    delay = None
    while not ready.exists() and proc.poll() is None and time.perf_counter() - t0 < 300:
        time.sleep(0.001)
    if not ready.exists():
        err = proc.communicate()[1]
        return {"run": i, "phase": phase, "ok": False, "problem": f"never reached the hook (exit {proc.returncode})",
                "stderr_tail": err[-1500:]}
    write_seconds = None
    if phase == "random":  # a uniform time within the duration of the run's previous write
        durations = Path(str(ready) + ".durations")
        write_seconds = float(durations.read_text().split()[-1]) if durations.is_file() else 0.1
        delay = rng.uniform(0.0, write_seconds)
        time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    after_write = Path(str(ready) + ".after").exists()  # random: the write had ended before the kill
    ckpt_dir = run_dir / "checkpoints"
    left_after_kill = leftovers(ckpt_dir)
    names_after_kill = sorted(p.name for p in ckpt_dir.iterdir() if not p.name.startswith("."))
    best = ck.latest_complete(ckpt_dir, log=lambda m: None)
    loadable = best is not None and ck.check_loadable(best.path) is None
    resume = subprocess.run([sys.executable, "-m", "trainfit.cli.main", "train", str(config), "--out", str(run_dir),
                             "--resume", "--quiet"], cwd=str(REPO), capture_output=True, text=True, timeout=600)
    got = losses(run_dir) if resume.returncode == 0 else {}
    left_after_resume = leftovers(ckpt_dir)
    row = {"run": i, "phase": phase, "killed_in_write": target, "random_delay_seconds": delay,
           "previous_write_seconds": write_seconds, "write_had_ended": after_write if phase == "random" else None,
           "exit_after_kill": proc.returncode, "leftovers_after_kill": left_after_kill,
           "checkpoints_after_kill": names_after_kill, "resumed_from": best.path.name if best else None,
           "resume_checkpoint_loads": loadable, "resume_exit": resume.returncode,
           "losses_equal_uninterrupted": got == reference, "steps_compared": len(got),
           "leftovers_after_resume": left_after_resume,
           "final_checkpoints": sorted(p.name for p in ckpt_dir.iterdir()),
           "seconds": time.perf_counter() - t0}
    row["ok"] = (loadable and resume.returncode == 0 and got == reference and not left_after_resume
                 and proc.returncode == -signal.SIGKILL)
    if resume.returncode != 0:
        row["stderr_tail"] = resume.stderr[-1500:]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=len(PLAN))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results"))
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import yaml

    rng = random.Random(a.seed)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainfit-kill-") as tmp:
        work = Path(tmp)
        config = work / "kill.yaml"
        config.write_text(yaml.safe_dump(CONFIG))
        entry = work / "entry.py"
        entry.write_text(ENTRY)
        ref = subprocess.run([sys.executable, "-m", "trainfit.cli.main", "train", str(config), "--out",
                              str(work / "reference"), "--quiet"], cwd=str(REPO), capture_output=True, text=True)
        if ref.returncode != 0:
            print(ref.stderr[-3000:], file=sys.stderr)
            return 1
        reference = losses(work / "reference")
        for i in range(a.runs):
            phase, target = PLAN[i % len(PLAN)]
            row = one_run(i, phase, target, work, config, entry, reference, rng)
            rows.append(row)
            print(f"run {i:2d} {phase:14s} write {target}: {'ok' if row['ok'] else 'FAILED'}; left "
                  f"{row.get('leftovers_after_kill')}, resumed from {row.get('resumed_from')}", file=sys.stderr)
            shutil.rmtree(work / f"run{i:02d}", ignore_errors=True)
    passed = sum(r["ok"] for r in rows)
    result = {
        "what": "kill -9 inside a checkpoint write, then trainfit train --resume: loadable, exact, clean",
        "command": "python bench/kill_during_checkpoint.py " + " ".join(sys.argv[1:]),
        "config": CONFIG, "runs": len(rows), "passed": passed, "reference_steps": len(reference),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        "rows": rows,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kill_during_checkpoint.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [
        "# kill -9 during a checkpoint write, then --resume", "",
        f"Command: `{result['command'].strip()}`. A 16-step CPU pretraining (checkpoint every 4 steps, "
        "keep_last 2) killed with SIGKILL while its 2nd (step 8) or 3rd (step 12) checkpoint is being written, "
        "at the hook point named (see the script's docstring), or at a random time within the duration of the "
        "run's previous write (random; \"ended\": the write was complete before the kill); "
        "then `trainfit train --resume`. A run passes when the newest complete checkpoint loads, the resume "
        "exits 0, its losses equal an uninterrupted run's at every step (exact float equality), and no "
        "`.staging-*` / `.trash-*` is left.", "",
        f"**{passed} / {len(rows)} passed.**", "",
        "| run | killed at | write | left by the kill | resumed from | losses equal | left after resume |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        where = r["phase"]
        if r.get("random_delay_seconds") is not None:
            where += (f" (+{r['random_delay_seconds'] * 1000:.0f} of {r['previous_write_seconds'] * 1000:.0f} ms"
                      + ("; ended" if r.get("write_had_ended") else "") + ")")
        md.append(f"| {r['run']} | {where} | {r.get('killed_in_write')} | "
                  f"{', '.join(_short(n) for n in r.get('leftovers_after_kill', [])) or '-'} | "
                  f"{r.get('resumed_from')} | {'yes' if r.get('losses_equal_uninterrupted') else 'NO'} | "
                  f"{', '.join(r.get('leftovers_after_resume', [])) or '-'} |")
    md += ["", f"Load average (1 min) before: {load_before[0]:.2f}, after: {result['load_average_after'][0]:.2f} "
               f"on {os.cpu_count()} CPUs (timing does not change the outcome here: every kill is placed by a "
               "hook, or by a delay measured from the start of the write)."]
    (out / "kill_during_checkpoint.md").write_text("\n".join(md) + "\n")
    return 0 if passed == len(rows) else 1


def _short(name: str) -> str:
    """`.staging-checkpoint-8-1a2b3c4d` -> `.staging-checkpoint-8-*` (the random part left out)."""
    if ".trash-" in name:
        return name.split(".trash-")[0] + ".trash-*"
    if name.startswith(".staging-"):
        return name.rsplit("-", 1)[0] + "-*"
    return name


if __name__ == "__main__":
    raise SystemExit(main())
