"""Framework profiles: which tool (and which release of it) runs a setup, as TrainingSetup knobs.

`data/frameworks.yaml` holds, per tool, the behaviours the memory and speed models know
(trainfit.core.runtime) and, per release span, the versions of what it runs on.
`resolve_framework("trl@0.12")` gives a Framework; `apply_framework(setup, framework)` sets the knobs
that apply to that setup (AdamW runs, 4-bit runs, FSDP LoRA runs, accumulating FSDP runs, ...) and
says what each one changed. Pure: no CLI, no torch; installed versions are read with
importlib.metadata, never by importing the packages.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from trainfit.core.setup import TrainingSetup
from trainfit.errors import BadInputError, TrainfitError, short_repr
from trainfit.versions import installed_version, release_tuple

OWN = "trainfit"
# Conditions a behaviour applies under (frameworks.yaml `when`), on the setup it is applied to.
CONDITIONS: dict[str, Callable[[TrainingSetup], bool]] = {}
# Packages whose installed versions describe trainfit's own run on this machine.
RUNTIME_PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "deepspeed")
# The HF Trainer's default optim: "adamw_hf" (a per-parameter loop) before 4.32, "adamw_torch" (foreach on
# CUDA) until 4.54, whose default is "adamw_torch_fused" with torch >= 2.8 (transformers#25109, #37358).
TRAINER_ADAMW_TORCH = (4, 32, 0)
TRAINER_FUSED_DEFAULT = (4, 54, 0)
TORCH_FUSED_DEFAULT = (2, 8, 0)
FIELDS = {f.name for f in dataclasses.fields(TrainingSetup)}


def _condition(name: str):
    def register(fn):
        CONDITIONS[name] = fn
        return fn
    return register


def _sharded_fsdp(s: TrainingSetup) -> bool:
    return s.fsdp_strategy in ("full-shard", "shard-grad-op")


_condition("always")(lambda s: True)
# torch picks foreach for AdamW only when every parameter is on a GPU (torch/optim/optimizer.py
# _default_to_fused_or_foreach); on a CPU the tools run the per-parameter loop, as trainfit does
_condition("adamw")(lambda s: s.optimizer == "adamw" and s.device in ("cuda", "rocm"))
_condition("bnb_4bit")(lambda s: s.quant in ("nf4", "nf4-dq"))
_condition("bnb")(lambda s: s.quant in ("nf4", "nf4-dq", "int8"))
_condition("fsdp_lora")(lambda s: _sharded_fsdp(s) and s.method == "lora" and s.quant == "none")
_condition("fsdp_accumulating")(lambda s: _sharded_fsdp(s) and s.grad_accum > 1)
_condition("qlora_16bit")(lambda s: s.method == "qlora" and s.precision in ("bf16", "fp16"))
# transformers' own loss and model code run (not a tool's own loss kernel or model classes)
_condition("transformers_code")(lambda s: s.loss == "standard" and s.model_code == "transformers")
_condition("transformers_fsdp")(lambda s: CONDITIONS["transformers_code"](s) and s.fsdp_strategy != "none")
# transformers knobs that only act under FSDP
FSDP_ONLY_KNOBS = ("fsdp_flat_params", "reentrant_checkpoint_around_fsdp_units")


@dataclass(frozen=True)
class Behaviour:
    knob: str  # a TrainingSetup field
    value: Any
    when: str  # a CONDITIONS key
    says: str  # what the tool does, as the output states it
    source: str


@dataclass(frozen=True)
class Framework:
    name: str  # the profile's name ("trl")
    title: str
    release: str  # the release described ("0.12.2"; "installed" for trainfit on this machine)
    asked: str  # what the user wrote ("trl@0.12")
    versions: dict[str, str]  # what it runs on: transformers / bitsandbytes / torch / ...
    behaviours: tuple[Behaviour, ...]
    partial: str = ""  # what is derived rather than read in the tool's own source
    source: str = ""

    @property
    def label(self) -> str:
        """'TRL 0.12.2' style: the tool and the release the figure describes."""
        return f"{self.name} {self.release}"

    @property
    def is_own(self) -> bool:
        return self.name == OWN


@dataclass(frozen=True)
class Change:
    knob: str
    before: Any
    after: Any
    says: str
    source: str


# ---------------------------------------------------------------------------------------------
# versions
_CONSTRAINT = re.compile(r"^\s*(==|!=|<=|>=|<|>|~=)?\s*([0-9][0-9A-Za-z.+-]*)\s*$")


def _satisfies(version: tuple[int, int, int], op: str, bound: tuple[int, int, int]) -> bool:
    return {"==": version == bound, "!=": version != bound, "<": version < bound, "<=": version <= bound,
            ">": version > bound, ">=": version >= bound, "~=": bound <= version < (bound[0], bound[1] + 1, 0)}[op]


def _parse_constraints(text: str) -> list[tuple[str, tuple[int, int, int]]]:
    out = []
    for part in text.split(","):
        m = _CONSTRAINT.match(part)
        if not m:
            raise ValueError(f"{part.strip()!r} is not a version or a constraint (e.g. 0.12, <4.49, >=0.9,<0.12)")
        out.append((m[1] or "==", release_tuple(m[2])))
    return out


# ---------------------------------------------------------------------------------------------
# the catalog
@lru_cache(maxsize=1)
def catalog() -> dict[str, dict]:
    """frameworks.yaml's profiles, checked once."""
    from importlib import resources

    from trainfit import yaml_io

    text = resources.files("trainfit").joinpath("data/frameworks.yaml").read_text(encoding="utf-8")
    profiles = yaml_io.load_yaml_cached(text, "frameworks.yaml")["profiles"]
    problems = catalog_problems(profiles)
    if problems:
        raise ValueError("frameworks.yaml: " + "; ".join(problems))
    return profiles


def catalog_problems(profiles: dict[str, dict]) -> list[str]:
    """Every profile has a title, a source and version spans; every behaviour names a known knob and
    condition, says what it does and where that is read."""
    problems = []
    for name, p in profiles.items():
        if not p.get("title") or not p.get("source"):
            problems.append(f"{name}: needs a title and a source")
        if p.get("builds_on") and p["builds_on"] not in profiles:
            problems.append(f"{name}: builds_on {p['builds_on']!r} is not a profile")
        if not p.get("versions"):
            problems.append(f"{name}: no versions")
        behaviours = list(p.get("behaviours") or [])
        for entry in p.get("versions") or []:
            behaviours += entry.get("behaviours") or []
            if "from" not in entry or "release" not in entry:
                problems.append(f"{name}: a version entry needs from and release")
        for b in behaviours:
            if b.get("knob") not in FIELDS:
                problems.append(f"{name}: {b.get('knob')!r} is not a TrainingSetup field")
            if b.get("when") not in CONDITIONS:
                problems.append(f"{name}: when {b.get('when')!r} is not one of {sorted(CONDITIONS)}")
            if not b.get("says") or not b.get("source"):
                problems.append(f"{name}: behaviour {b.get('knob')} needs says and source")
    return problems


def _names() -> dict[str, str]:
    """Every name and alias -> its profile."""
    out = {}
    for name, p in catalog().items():
        out[name] = name
        for alias in p.get("aliases") or []:
            out[alias] = name
    return out


def framework_names() -> list[str]:
    return sorted(catalog())


def valid_text(name: str | None = None) -> str:
    """The names (or one profile's versions) for an error message."""
    if name is None:
        return ", ".join(framework_names())
    spans = catalog()[name]["versions"]
    return ", ".join(str(e["release"]).split(" ")[0] for e in spans)


# ---------------------------------------------------------------------------------------------
# resolving what a user typed
_SPEC = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.-]*?)\s*(?:@\s*(.+?)|((?:[<>=!~]=?|==).+?))?\s*$")


def resolve_framework(text: str, *, key: str = "--framework") -> Framework:
    """'trl', 'trl@0.12', 'litgpt@0.4.9', 'transformers<4.49', 'torchtune@0.3' -> its Framework.
    BadInputError naming `key` and the valid names or versions otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise BadInputError(f"{key}: {short_repr(text)} names no framework (valid: {valid_text()}, "
                            "optionally @VERSION or a constraint such as <4.49)")
    m = _SPEC.match(text)
    name = _names().get(m[1].lower()) if m else None
    if name is None:
        raise BadInputError(f"{key}: {short_repr(text)} is not a known framework (valid: {valid_text()}, "
                            "optionally @VERSION or a constraint such as <4.49)")
    version_text = (m[2] or m[3] or "").strip() or None
    try:
        return _resolve(name, version_text, {}, asked=text.strip())
    except ValueError as e:
        raise BadInputError(f"{key}: {short_repr(text)}: {e} (known {name} releases: {valid_text(name)})") from None


def _entry_for(name: str, version_text: str | None) -> tuple[dict, str]:
    """The version span for what was asked, and the release the figure describes."""
    spans = catalog()[name]["versions"]
    if version_text is None or version_text == "installed":
        return spans[-1], str(spans[-1]["release"])
    constraints = _parse_constraints(version_text)
    exact = len(constraints) == 1 and constraints[0][0] == "=="
    if exact:
        wanted = constraints[0][1]
        entry = None
        for e in spans:
            if _from(e) <= wanted:
                entry = e
        if entry is None:
            raise ValueError(f"{version_text} is older than every release described")
        return entry, version_text.lstrip("=").strip()  # the release asked, in the span that describes it
    for e in reversed(spans):  # the newest release that satisfies every constraint
        release = _release_of(e)
        if release is not None and all(_satisfies(release, op, b) for op, b in constraints):
            return e, str(e["release"])
    raise ValueError(f"no described release satisfies {version_text}")


def _from(entry: dict) -> tuple[int, int, int]:
    return release_tuple(str(entry["from"]))


def _release_of(entry: dict) -> tuple[int, int, int] | None:
    try:
        return release_tuple(str(entry["release"]))
    except ValueError:
        return None


def _resolve(name: str, version_text: str | None, forced: dict[str, str], *, asked: str) -> Framework:
    profile = catalog()[name]
    entry, release = _entry_for(name, version_text)
    versions = {k: str(v) for k, v in (entry.get("implies") or {}).items()}
    if profile.get("package"):
        versions[profile["package"]] = release.split(" ")[0]
    versions.update(forced)
    # first the release's own, then the profile's, then what it builds on: the first whose condition
    # holds decides a knob (apply_framework)
    own = [Behaviour(**b) for b in (entry.get("behaviours") or [])]
    own += [Behaviour(**b) for b in (profile.get("behaviours") or [])]
    behaviours: list[Behaviour] = []
    hf_trainer = bool(profile.get("hf_trainer"))
    if profile.get("builds_on"):
        base_name = profile["builds_on"]
        base_package = catalog()[base_name].get("package")
        base = _resolve(base_name, versions.get(base_package), versions, asked=asked)
        versions = {**base.versions, **versions}
        behaviours = [b for b in base.behaviours if not b.source.startswith("derived:")]
        hf_trainer = hf_trainer or _uses_hf_trainer(base_name)
    behaviours = own + behaviours + _derived(versions, hf_trainer)
    return Framework(name, profile["title"], release, asked, versions, tuple(behaviours),
                     str(profile.get("partial") or "").strip(), str(profile.get("source") or "").strip())


def _uses_hf_trainer(name: str) -> bool:
    p = catalog()[name]
    return bool(p.get("hf_trainer")) or (bool(p.get("builds_on")) and _uses_hf_trainer(p["builds_on"]))


# What a transformers release decides (runtime.transformers_knobs), as the output says it.
TRANSFORMERS_SAYS = {
    ("logits_shift_copy", True): "copies the shifted fp32 logits in the causal-LM loss (before 4.49)",
    ("logits_shift_copy", False): "shifts the labels, not the logits, in the causal-LM loss (4.49 on)",
    ("logits_returned_fp32", True): "returns the logits upcast to fp32 from the forward (before 4.46)",
    ("logits_returned_fp32", False): "returns the logits in the compute dtype (4.46 on)",
    ("experts_fused", True): "stores MoE experts as fused 3-D parameters, left unquantised by bitsandbytes (5.0 on)",
    ("experts_fused", False): "builds one nn.Linear per MoE expert, which bitsandbytes quantises (before 5)",
    ("reentrant_checkpoint_around_fsdp_units", True):
        "checkpoints each decoder layer's call, the FSDP unit's, reentrantly (before 4.52)",
    ("reentrant_checkpoint_around_fsdp_units", False): "checkpoints inside each FSDP unit (4.52 on)",
    ("cache_under_checkpointing", True): "keeps gpt_bigcode's key/value cache on under checkpointing (before 4.53)",
    ("cache_under_checkpointing", False): "turns the key/value cache off under checkpointing (4.53 on)",
    ("fsdp_flat_params", True): "runs FSDP1 with flat parameters (Accelerate's default before 5)",
    ("fsdp_flat_params", False): "runs FSDP2, one gradient per parameter (5.0 on)",
    ("mqa_kv_unrepeated", True):
        "hands SDPA Falcon's one multi-query key/value head, which its math path broadcasts (before 5.25)",
    ("mqa_kv_unrepeated", False): "repeats Falcon's multi-query key/value head before SDPA (5.25 on)",
}


def _derived(versions: dict[str, str], hf_trainer: bool) -> list[Behaviour]:
    """Knobs the versions decide: transformers' loss and model code, bitsandbytes' 4-bit matmul, the
    HF Trainer's default AdamW."""
    from trainfit.core.runtime import bnb_keeps_input_for, transformers_knobs

    out = []
    tf = versions.get("transformers")
    if tf:
        for knob, value in transformers_knobs(tf).items():
            when = "transformers_fsdp" if knob in FSDP_ONLY_KNOBS else "transformers_code"
            out.append(Behaviour(knob, value, when, f"transformers {tf} {TRANSFORMERS_SAYS[knob, value]}",
                                 "derived: trainfit.core.runtime.transformers_knobs"))
    bnb = versions.get("bitsandbytes")
    if bnb:
        keeps = bnb_keeps_input_for(bnb)
        says = "keeps each 4-bit linear's input for backward (before 0.43.2)" if keeps else \
            "keeps no 4-bit linear's input (0.43.2 on)"
        out.append(Behaviour("bnb_keeps_input", keeps, "bnb_4bit", f"bitsandbytes {bnb} {says}",
                             "derived: bitsandbytes#1270 (0.43.2), trainfit.core.runtime.bnb_keeps_input_for"))
    if hf_trainer and tf:
        impl = trainer_optimizer_impl(tf, versions.get("torch"))
        out.append(Behaviour("optimizer_impl", impl, "adamw",
                             f"the HF Trainer {tf} steps AdamW with torch's {impl} implementation (its default optim)",
                             "derived: transformers training_args.py optim default (#25109, #37358)"))
    return out


def trainer_optimizer_impl(transformers_version: str, torch_version: str | None) -> str:
    """The AdamW implementation of the HF Trainer's default `optim` for a transformers / torch pair."""
    tf = release_tuple(transformers_version)
    if tf < TRAINER_ADAMW_TORCH:
        return "for-loop"
    new_torch = torch_version is not None and release_tuple(torch_version) >= TORCH_FUSED_DEFAULT
    fused = tf >= TRAINER_FUSED_DEFAULT and new_torch
    return "fused" if fused else "foreach"


# ---------------------------------------------------------------------------------------------
# applying a profile
def apply_framework(setup: TrainingSetup, framework: Framework) -> tuple[TrainingSetup, list[Change]]:
    """The setup as the framework runs it, and each knob that changed (in the order applied).

    Behaviours come in priority order (the release's, the tool's, what it builds on, then what the
    versions decide); the first whose condition holds on the setup decides its knob. The versions'
    knobs come last, so transformers' own knobs see the tool's loss kernel and model code."""
    framed = setup
    changes: list[Change] = []
    decided: set[str] = set()
    for b in framework.behaviours:
        if b.knob in decided or not CONDITIONS[b.when](framed):
            continue
        decided.add(b.knob)
        before = getattr(framed, b.knob)
        if before == b.value:
            continue
        framed = dataclasses.replace(framed, **{b.knob: b.value})
        changes.append(Change(b.knob, before, b.value, b.says, b.source))
    return framed, changes


def base_setup(framed: TrainingSetup, framework: Framework) -> TrainingSetup:
    """A framed setup with every knob the framework may set back at trainfit's default: what
    apply_framework started from when the setup was built with the defaults (the planner's)."""
    defaults = TrainingSetup()
    knobs = {b.knob for b in framework.behaviours}
    return dataclasses.replace(framed, **{k: getattr(defaults, k) for k in knobs})


def framed_tiers(tiers: list, framework: Framework | None) -> list:
    """A search's tiers (core.plan.engine.Tier) with every candidate setup as the framework runs it,
    so each candidate's memory and step time are the framework's. None: unchanged."""
    if framework is None or framework.is_own:
        return tiers
    return [dataclasses.replace(t, chains=[_framed_chain(c, framework) for c in t.chains]) for t in tiers]


def _framed_chain(chain, framework: Framework):
    for setup in chain:
        yield apply_framework(setup, framework)[0]


def without_change(framed: TrainingSetup, change: Change) -> TrainingSetup:
    """The framed setup with one behaviour undone (for what that behaviour alone adds)."""
    return dataclasses.replace(framed, **{change.knob: change.before})


def change_effects(framed: TrainingSetup, changes: list[Change], measure: Callable[[TrainingSetup], float]
                   ) -> list[tuple[Change, float]]:
    """Each change with `measure(framed) - measure(framed without it)`: what that behaviour alone adds
    (bytes of the peak, seconds of a step, ... whatever `measure` gives)."""
    total = measure(framed)
    out = []
    for c in changes:
        try:
            out.append((c, total - measure(without_change(framed, c))))
        except TrainfitError:  # a combination the model refuses without this knob: no figure
            out.append((c, float("nan")))
    return out


# ---------------------------------------------------------------------------------------------
# trainfit's own run on this machine
def installed_versions(packages: tuple[str, ...] = RUNTIME_PACKAGES) -> dict[str, str]:
    """Versions of the installed runtime packages (package metadata; nothing imported); absent
    packages are left out."""
    found = {name: installed_version(name) for name in packages}
    return {name: version for name, version in found.items() if version is not None}


def own_run(*, this_machine: bool) -> Framework:
    """trainfit's own run: on this machine with the installed versions, else its defaults."""
    versions = installed_versions() if this_machine else {}
    release = installed_version("trainfit") or "dev"
    return Framework(OWN, catalog()[OWN]["title"], release, OWN, versions, (),
                     source=str(catalog()[OWN]["source"]).strip())


def describe(framework: Framework) -> str:
    """One line: which framework and version the figure is for."""
    if framework.is_own:
        text = "trainfit's own run"
        if framework.versions:
            text += " with the installed " + ", ".join(f"{k} {v}" for k, v in framework.versions.items())
        return text
    runs_on = ", ".join(f"{k} {v}" for k, v in framework.versions.items() if k != _package(framework.name))
    text = f"{framework.title}, {framework.release}" + (f" (on {runs_on})" if runs_on else "")
    return text


def _package(name: str) -> str | None:
    return catalog()[name].get("package")
