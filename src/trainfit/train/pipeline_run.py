"""Run a pipeline meta-config (docs/pipeline.md): its phases in order, each a normal run of
trainfit.train.runner in OUT/<phase>/, joined by their hand-offs, resumable at the phase and
step where it stopped.

    OUT/pipeline_state.json   where the pipeline stands (written atomically after every change)
    OUT/summary.json          every phase's summary (when the last phase finished)
    OUT/<phase>/              a normal run directory (checkpoints/, final/, metrics.jsonl, ...)
    OUT/<phase>/merged/       (a LoRA phase followed by another) its adapter merged into its base

The hand-off: a phase with `start_from: A` trains the model phase A left: A's final/ when A
trained full weights, else A's adapter merged into A's base (peft merge_and_unload, saved with the
tokenizer into A/merged/ through trainfit.files.atomic_dir: complete or absent, made once). The
phase's run config is its own with `model:` replaced by that directory (weights: local).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

from trainfit.config.pipeline import STATE_FILE, SUMMARY_FILE, Phase, PipelineConfig, load_pipeline
from trainfit.config.run_config import ModelConfig, RunConfig
from trainfit.errors import BadInputError, TrainfitError

STATE_VERSION = 1
MERGED_DIR = "merged"

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# state
def _state_path(out: Path) -> Path:
    return out / STATE_FILE


def read_state(out: Path) -> dict | None:
    path = _state_path(out)
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if state.get("version") != STATE_VERSION or not isinstance(state.get("phases"), list):
            raise ValueError("unknown layout")
        return state
    except (OSError, ValueError, AttributeError) as exc:
        raise BadInputError(f"--resume: {path} cannot be read ({exc}); nothing was changed",
                            hint="start again with another --out") from None


def write_state(out: Path, state: dict) -> None:
    from trainfit.files import write_atomic

    state["updated_time"] = time.time()
    write_atomic(_state_path(out), json.dumps(state, indent=2) + "\n")


def new_state(p: PipelineConfig) -> dict:
    return {"version": STATE_VERSION, "pipeline": p.pipeline, "name": p.name, "config_digest": p.digest(),
            "current": p.phases[0].name, "finished": False,
            "phases": [{"name": ph.name, "status": "pending", "start_from": ph.start_from, "start_model": None,
                        "global_step": 0, "max_steps": None} for ph in p.phases]}


# ---------------------------------------------------------------------------------------------
# hand-off
def start_model_dir(prev: Phase, prev_dir: Path, log: Log) -> Path:
    """The directory the next phase loads: prev's final/ (full weights) or its adapter merged into
    its base (prev/merged/, made once, atomically)."""
    from trainfit.export.peft_config import uses_lora
    from trainfit.train.trainer_setup import is_complete_model_dir

    final = prev_dir / "final"
    if not uses_lora(prev.config):
        if not is_complete_model_dir(final):
            raise TrainfitError(f"phase {prev.name} has no complete model in {final}",
                                hint=f"resume the pipeline (--resume) to finish phase {prev.name}")
        return final
    if not (final / "adapter_config.json").is_file():
        raise TrainfitError(f"phase {prev.name} has no LoRA adapter in {final}",
                            hint=f"resume the pipeline (--resume) to finish phase {prev.name}")
    merged = prev_dir / MERGED_DIR
    if is_complete_model_dir(merged):
        return merged  # the hand-off is done once
    from trainfit.files import atomic_dir, clean_stale_dirs

    clean_stale_dirs(prev_dir, (MERGED_DIR,))  # what an interrupted merge left
    log(f"hand-off: merging phase {prev.name}'s LoRA adapter into its base ({merged})")
    with atomic_dir(merged, replace=merged.exists()) as tmp:
        merge_adapter(prev.config, final, tmp)
    return merged


def merge_adapter(cfg: RunConfig, adapter_dir: Path, dest: Path) -> None:
    """cfg's base model (built as the run built it: same weights source and seed, not quantized:
    a 4-bit base is merged in 16 bits) plus the adapter in adapter_dir, merged and saved with the
    tokenizer into dest. Runs on the CPU, the merge is elementwise."""
    import torch
    from peft import PeftModel

    from trainfit.train.model_build import build_model
    from trainfit.train.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(adapter_dir, key="the phase's final tokenizer")
    base = build_model(cfg, tokenizer).model
    if cfg.training.precision in ("bf16", "fp16"):  # what the run trained against (trainer_setup.make_model)
        base = base.to(torch.bfloat16 if cfg.training.precision == "bf16" else torch.float16)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))


def with_start_model(cfg: RunConfig, model_dir: Path) -> RunConfig:
    """The phase's run config loading model_dir (weights and tokenizer) instead of its own model."""
    return dataclasses.replace(cfg, model=ModelConfig(path=str(model_dir), weights="local"),
                               tokenizer=dataclasses.replace(cfg.tokenizer, path=None))


# ---------------------------------------------------------------------------------------------
def run_pipeline(p: PipelineConfig, out: str | Path, *, resume: bool = False, stop_after: int | None = None,
                 quiet: bool = False, log: Log | None = None) -> dict[str, Any]:
    """Run the phases in order; the Python twin of `trainfit train META.yaml`. `stop_after` stops
    the phase being run at that optimizer step (with a checkpoint), as for one run; a phase whose
    schedule ends first finishes and the next one starts. Returns the pipeline summary."""
    from trainfit.train.environment import world
    from trainfit.train.runner import run_training

    log = log or (lambda m: None)
    rank, _ = world()
    say = log if rank == 0 else (lambda m: None)
    out = Path(out).resolve()
    state = _start_state(p, out, resume, say)
    phase_by_name = {ph.name: ph for ph in p.phases}
    summaries: dict[str, dict] = {}
    stopped_in = None
    for ph, st in zip(p.phases, state["phases"]):
        run_dir = out / ph.name
        if st["status"] == "done" and (run_dir / SUMMARY_FILE).is_file():
            summaries[ph.name] = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
            say(f"phase {ph.name}: finished earlier (step {st['global_step']} of {st['max_steps']}); not run again")
            continue
        cfg = ph.config
        if ph.start_from is not None:
            model_dir = _hand_off(phase_by_name[ph.start_from], out, rank, say)
            cfg = with_start_model(cfg, model_dir)
            st["start_model"] = str(model_dir.relative_to(out))
        st["status"] = "running"
        state["current"] = ph.name
        if rank == 0:
            write_state(out, state)
        say(f"phase {ph.name} ({cfg.method}" + (f", from {st['start_model']}" if st["start_model"] else "") + ")")
        has_run = (run_dir / "config.sha256").is_file() or (run_dir / "checkpoints").is_dir()
        result = run_training(cfg, run_dir, resume=has_run, stop_after=stop_after, quiet=quiet, log=log)
        summary = result.summary
        summaries[ph.name] = summary
        done = bool(summary) and summary.get("global_step", 0) >= (summary.get("max_steps") or 0) > 0
        st.update(status="done" if done else "stopped", global_step=summary.get("global_step", result.global_step),
                  max_steps=summary.get("max_steps"))
        if rank == 0:
            write_state(out, state)
        if not done:
            stopped_in = ph.name
            break
    state["finished"] = stopped_in is None
    state["current"] = stopped_in
    result_doc = pipeline_summary(p, out, state, summaries)
    if rank == 0:
        write_state(out, state)
        if stopped_in is None:
            from trainfit.files import write_atomic

            write_atomic(out / SUMMARY_FILE, json.dumps(result_doc, indent=2) + "\n")
    return result_doc


def _start_state(p: PipelineConfig, out: Path, resume: bool, say: Log) -> dict:
    """The state to continue from (--resume) or a new one; refuses before any training when OUT
    holds another pipeline, or a run in a phase's directory without --resume."""
    from trainfit.train.environment import world

    state = read_state(out)
    if state is not None and not resume:
        raise BadInputError(f"--out: {out} already holds a pipeline ({STATE_FILE})",
                            hint="pass --resume to continue it, or choose another --out")
    if state is not None:
        if state.get("config_digest") != p.digest() or [s.get("name") for s in state["phases"]] != \
                [ph.name for ph in p.phases]:
            raise BadInputError(f"--resume: {out} belongs to a different pipeline config (digest "
                                f"{str(state.get('config_digest'))[:12]}, this config {p.digest()[:12]}); nothing "
                                "was changed", hint="resume with the meta-config the pipeline started with, or use "
                                                    "another --out")
        where = state.get("current")
        say(f"resuming pipeline {p.name or p.pipeline} at phase {where}" if where else
            f"pipeline {p.name or p.pipeline} already finished; nothing to train")
        return state
    if not resume:
        held = [ph.name for ph in p.phases if (out / ph.name / "config.sha256").is_file()
                or (out / ph.name / "checkpoints").is_dir()]
        if held:
            raise BadInputError(f"--out: {out / held[0]} already holds a run", hint="choose another --out")
    elif out.exists():
        say(f"nothing to resume in {out}: starting the pipeline")
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out: {out} is a file, not a directory")
    state = new_state(p)
    if world()[0] == 0:
        out.mkdir(parents=True, exist_ok=True)
        write_state(out, state)
    return state


def _hand_off(prev: Phase, out: Path, rank: int, say: Log) -> Path:
    """The start model of the phase after `prev`: made by the main process; the others wait for it
    (the runner's final/ is written by the main process too)."""
    from trainfit.export.peft_config import uses_lora
    from trainfit.train.trainer_setup import is_complete_model_dir

    if rank == 0 or not uses_lora(prev.config):
        return start_model_dir(prev, out / prev.name, say)
    merged = out / prev.name / MERGED_DIR
    deadline = time.monotonic() + 6 * 3600  # a merge of a large model on the CPU takes minutes, not hours
    while not is_complete_model_dir(merged):
        if time.monotonic() > deadline:
            raise TrainfitError(f"rank {rank}: {merged} did not appear (the main process merges the adapter)")
        time.sleep(1.0)
    return merged


def pipeline_summary(p: PipelineConfig, out: Path, state: dict, summaries: dict[str, dict]) -> dict[str, Any]:
    """One document for the whole pipeline: each phase's state and run summary, and totals."""
    phases = []
    for ph, st in zip(p.phases, state["phases"]):
        s = summaries.get(ph.name)
        phases.append({"name": ph.name, "method": ph.config.method, "status": st["status"],
                       "run_dir": str(out / ph.name), "start_from": ph.start_from, "start_model": st["start_model"],
                       "global_step": st["global_step"], "max_steps": st["max_steps"], "summary": s})
    ran = [s for s in summaries.values() if s]
    return {"pipeline": p.pipeline, "name": p.name, "out": str(out), "finished": state["finished"],
            "stopped_in": state["current"] if not state["finished"] else None, "phases": phases,
            "totals": {"wall_seconds": sum(s.get("wall_seconds") or 0.0 for s in ran),
                       "optimizer_steps": sum(s.get("global_step") or 0 for s in ran)}}


def train_pipeline_file(config: str | Path, out: str | None, *, resume: bool, max_steps: int | None, verify: bool,
                        quiet: bool, log: Log | None) -> dict[str, Any]:
    """`trainfit train META.yaml`: checks, then run_pipeline (default --out: runs/<file stem>)."""
    if verify:
        raise BadInputError("--verify: checks one run config, not a pipeline",
                            hint="verify a phase with the run.yaml in its folder of the plan (trainfit verify)")
    p = load_pipeline(config)
    if out is not None:
        from trainfit.validate import output_dir

        output_dir(out, "--out")
    return run_pipeline(p, out or str(Path("runs") / Path(config).stem), resume=resume, stop_after=max_steps,
                        quiet=quiet, log=log)


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """The pipeline's result in a few lines for the terminal."""
    lines = []
    for ph in doc["phases"]:
        s = ph.get("summary") or {}
        first, last = s.get("first_loss"), s.get("final_loss")
        loss = f", loss {first:.4f} -> {last:.4f}" if first is not None and last is not None else ""
        lines.append(f"phase {ph['name']} ({ph['method']}): {ph['status']}, step {ph['global_step']}/"
                     f"{ph['max_steps'] if ph['max_steps'] is not None else '-'}{loss}"
                     + (f"; weights: {s['weights']}" if s.get("weights") else ""))
    lines.append("pipeline finished" if doc["finished"] else
                 f"pipeline stopped in phase {doc['stopped_in']}: trainfit train ... --resume continues it")
    return lines
