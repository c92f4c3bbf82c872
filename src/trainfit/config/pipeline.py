"""The pipeline meta-config (docs/pipeline.md): phases in order, each a run config (the run.yaml
schema, trainfit.config.run_config) with its hand-off from an earlier phase. Running it is
trainfit.train.pipeline_run; `trainfit plan --pipeline` writes it (trainfit.export.pipeline_files).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.config.run_config import RunConfig, parse_run_config
from trainfit.errors import BadInputError, TrainfitError, short_repr, unknown_keys

# The files the runner writes in OUT beside the phase directories: no phase may be named so.
STATE_FILE = "pipeline_state.json"
SUMMARY_FILE = "summary.json"
PIPELINE_CONFIG_VERSION = 1
ADAPTER_HAND_OFFS = ("merge", "stack")
_TOP_KEYS = ("version", "pipeline", "name", "phases", "estimate")
_PHASE_KEYS = ("name", "start_from", "adapters", "run")
_PHASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_RESERVED = {STATE_FILE, SUMMARY_FILE}
STACK_REFUSED = ("adapters: 'stack' is not supported: the phase would train a second adapter over the previous "
                 "phase's, and a DPO reference taken as 'the model with adapters disabled' would then drop the "
                 "previous phase's adapter too (the bare base instead of the SFT model DPO compares against); "
                 "use adapters: merge")


@dataclass(frozen=True)
class Phase:
    name: str
    config: RunConfig
    start_from: str | None = None
    adapters: str = "merge"  # what happens to start_from's LoRA adapter (only merge is built)


@dataclass(frozen=True)
class PipelineConfig:
    version: int
    pipeline: str
    name: str
    phases: list[Phase]
    source: str = ""

    def digest(self) -> str:
        """What identifies the pipeline's maths: every phase's run-config hash and the hand-offs."""
        data = [[p.name, p.start_from, p.adapters, p.config.config_hash()] for p in self.phases]
        return hashlib.sha256(json.dumps(data).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# the meta-config
def parse_pipeline(raw: Any, *, base_dir: Path | None = None, source: str = "") -> PipelineConfig:
    """Validate a loaded meta-config; every problem reported at once (one BadInputError)."""
    head = f"{source}: " if source else ""
    if not isinstance(raw, dict):
        raise BadInputError(f"{head}expected a YAML mapping at the top level")
    errors: list[str] = []
    errors.extend(unknown_keys(raw, _TOP_KEYS))
    version = raw.get("version")
    if type(version) is not int or version != PIPELINE_CONFIG_VERSION:
        errors.append(f"version: {short_repr(version)} is not supported (this trainfit reads pipeline version "
                      f"{PIPELINE_CONFIG_VERSION})")
    pipeline, name = raw.get("pipeline", ""), raw.get("name", "")
    if not isinstance(pipeline, str):
        errors.append("pipeline: expected a string (e.g. sft+dpo)")
    if not isinstance(name, str):
        errors.append("name: expected a string")
    if "estimate" in raw and not isinstance(raw["estimate"], dict):
        errors.append("estimate: expected a mapping (what the plan predicted; not read by trainfit train)")
    items = raw.get("phases")
    phases: list[Phase] = []
    if not isinstance(items, list) or not items:
        errors.append("phases: give a list of phases, each with name and run (a run config)")
        items = []
    seen: list[str] = []
    for i, item in enumerate(items):
        phase = _parse_phase(item, i, seen, base_dir, errors)
        if phase is not None:
            phases.append(phase)
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            seen.append(item["name"])
    by_name = {p.name: p for p in phases}
    for p in phases:
        if p.start_from is not None and p.start_from in by_name and p.config.method == "pretrain":
            errors.append(f"phases.{p.name}.start_from: a pretrain phase starts from random weights; "
                          "start_from is for sft, lora, qlora and dpo phases")
    if errors:
        raise BadInputError(head + (errors[0] if len(errors) == 1 else f"{len(errors)} problems: " + "; ".join(errors)))
    return PipelineConfig(version, pipeline, name, phases, source)  # type: ignore[arg-type]


def _parse_phase(item: Any, i: int, earlier: list[str], base_dir: Path | None, errors: list[str]) -> Phase | None:
    where = f"phases[{i}]"
    if not isinstance(item, dict):
        errors.append(f"{where}: expected a mapping with name and run")
        return None
    errors.extend(unknown_keys(item, _PHASE_KEYS, f"{where}."))
    name = item.get("name")
    ok = True
    if not isinstance(name, str) or not _PHASE_NAME.match(name) or name in _RESERVED:
        errors.append(f"{where}.name: {short_repr(name)} is not a phase name (letters, digits, '.', '_', '-'; it names the "
                      "phase's run directory)")
        ok = False
    elif name in earlier:
        errors.append(f"{where}.name: {short_repr(name)} is used by an earlier phase (each phase has its own run directory)")
        ok = False
    else:
        where = f"phases.{name}"
    start = item.get("start_from")
    if start is not None and (not isinstance(start, str) or start not in earlier):
        errors.append(f"{where}.start_from: {short_repr(start)} is not an earlier phase (valid: "
                      f"{', '.join(earlier) or 'none: the first phase starts from its own model'})")
        ok = False
    adapters = item.get("adapters", "merge")
    if adapters not in ADAPTER_HAND_OFFS:
        errors.append(f"{where}.adapters: {short_repr(adapters)} is not one of merge, stack")
        ok = False
    elif adapters == "stack":
        errors.append(f"{where}.{STACK_REFUSED}")
        ok = False
    if "run" not in item:
        errors.append(f"{where}.run: missing (the phase's run config, the run.yaml schema)")
        return None
    try:
        cfg = parse_run_config(item["run"], base_dir=base_dir, source=f"{where}.run")
    except BadInputError as exc:
        errors.append(exc.message)
        return None
    return Phase(name, cfg, start, adapters) if ok else None


def load_pipeline(path: str | Path) -> PipelineConfig:
    from trainfit.validate import parse_yaml, read_text_file

    path = Path(path)
    raw = parse_yaml(read_text_file(path, "pipeline config"), str(path))
    return parse_pipeline(raw, base_dir=path.resolve().parent, source=str(path))


def is_pipeline_file(path: str | Path) -> bool:
    """True when the YAML file is a meta-config (a top-level `phases:` list); anything that
    cannot be read is left to the run-config loader, which names the problem."""
    try:
        from trainfit.validate import parse_yaml, read_text_file

        raw = parse_yaml(read_text_file(path, "run config"), str(path))
    except TrainfitError:
        return False
    return isinstance(raw, dict) and "phases" in raw
