"""What `plan` is asked (PlanRequest) and the checks a request passes before any search."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan.data_io import DatasetInfo
from trainfit.core.plan.modes import MODES
from trainfit.core.run.power import DEFAULT_PRICE_PER_KWH
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import METHODS, LoraSettings, TrainingSetup
from trainfit.errors import BadInputError

if TYPE_CHECKING:  # names only: the cloud catalog loads with `plan --flavor ID --spot` alone
    from trainfit.core.cloud.catalog import SpotTerms


PLAN_METHODS = ("auto", *METHODS)  # auto: full fine-tuning, falling back to LoRA, then QLoRA


@dataclass(frozen=True)
class PlanRequest:
    hardware: HardwareProfile
    method: str = "auto"  # PLAN_METHODS
    model: ModelSpec | None = None  # None with pretrain: the planner picks the shape
    seq_len: int | None = None  # None: the mode's range
    target_batch: int | None = None  # effective (global) batch to keep; None: the mode's default
    dataset_tokens: int | None = None
    examples: int | None = None
    epochs: float = 1.0
    time_budget_hours: float | None = None  # overrides every mode's hours_max
    memory_budget_bytes: int | None = None  # overrides the device capacity (modes take their share)
    memory_share: float | None = None  # overrides every mode's share
    tokens_per_param: float | None = None
    usd_per_hour: float | None = None  # rented machines: hourly price -> run cost
    budget_usd: float | None = None
    # `plan --flavor ID --spot`: the flavor's spot price and interruption figure (cloud_catalog.SpotTerms);
    # usd_per_hour is then the spot price, and each mode gets the expected cost with re-done work.
    spot: SpotTerms | None = None
    price_per_kwh: float = DEFAULT_PRICE_PER_KWH
    vocab_size: int = 32000  # pretraining shapes
    lora: LoraSettings | None = None  # default: rank 16 on every linear layer of the blocks
    modes: tuple[str, ...] = MODES
    # This machine's `trainfit verify` ratios (measured / predicted), as estimate applies them.
    memory_factor: float = 1.0
    step_time_factor: float = 1.0
    calibration_source: str = ""
    # The dataset as trainfit.dataset_size measured it (--data / --dataset): the data I/O plan,
    # and the workload when neither --examples nor --dataset-tokens is given.
    dataset: DatasetInfo | None = None
    # Vision-language models: image side in pixels (0: the model's default) and images per example;
    # their tokens are added to each sequence (core.memory's image model), as `estimate` counts them.
    image_size: int = 0
    images_per_example: int = 0
    # Step times measured on this machine (core.plan.measured.MeasuredStep, from `plan`'s probe):
    # they rank their settings instead of the speed model; empty: the speed model alone.
    measured_steps: tuple = ()
    measured_settle: bool = False  # the final ranking (core.plan.measured.unmeasured_factor)
    # (mode, model id, setup): picks the probe kept because nothing was measured faster by more
    # than the measurements' noise (core.plan.measured.decide); the search ranks them first.
    measured_pins: tuple = ()
    # Test hook (core.plan.measured.SpeedSkew): a speed model deliberately wrong about one knob.
    speed_skew: tuple = ()
    # The tool that will run the plan (core.frameworks.Framework, `--framework`): every candidate's memory
    # and step time are that tool's. None: trainfit's own run.
    framework: object | None = None


def check_request(req: PlanRequest) -> None:
    problems = []
    if req.method not in PLAN_METHODS:
        problems.append(f"--method: {req.method!r} is not one of {', '.join(PLAN_METHODS)}")
    for m in req.modes:
        if m not in MODES:
            problems.append(f"--mode: {m!r} is not one of {', '.join(MODES)}")
    if req.model is None and req.method != "pretrain":
        problems.append("MODEL missing: give a model (catalog id, config.json) or --method pretrain")
    for flag, value in (("--seq-len", req.seq_len), ("--target-batch", req.target_batch),
                        ("--dataset-tokens", req.dataset_tokens), ("--examples", req.examples)):
        if value is not None and (isinstance(value, bool) or value < 1 or value > 10**15):
            problems.append(f"{flag} must be an integer in [1, 1e15], got {value}")
    if req.dataset_tokens is not None and req.examples is not None:
        problems.append("give either --dataset-tokens or --examples, not both")
    if not (0 < req.epochs <= 1000):
        problems.append(f"--epochs must be in (0, 1000], got {req.epochs}")
    if req.time_budget_hours is not None and not (0 < req.time_budget_hours <= 24 * 365):
        problems.append(f"--time-budget must be a positive duration up to a year, got {req.time_budget_hours} h")
    if req.memory_budget_bytes is not None and req.memory_budget_bytes < 64 * 2**20:
        problems.append(f"--memory-budget must be at least 64 MiB, got {req.memory_budget_bytes} bytes")
    if req.memory_share is not None and not (0 < req.memory_share <= 1):
        problems.append(f"--memory-share must be in (0, 1], got {req.memory_share}")
    if req.tokens_per_param is not None and not (0 < req.tokens_per_param <= 10000):
        problems.append(f"--tokens-per-param must be in (0, 10000], got {req.tokens_per_param}")
    for flag, value in (("--usd-per-hour", req.usd_per_hour), ("--budget", req.budget_usd),
                        ("--price-per-kwh", req.price_per_kwh)):
        if value is not None and (value < 0 or math.isnan(value)):
            problems.append(f"{flag} must not be negative, got {value}")
    if not (2 <= req.vocab_size <= 10_000_000):
        problems.append(f"--vocab must be in [2, 10000000], got {req.vocab_size}")
    if problems:
        raise BadInputError("; ".join(problems))
    _check_image_knobs(req)


def _check_image_knobs(req: PlanRequest) -> None:
    """--image-size / --images-per-example against the model, with estimate's checks (a refused knob
    is bad input, not a setting that "does not fit")."""
    if not (req.image_size or req.images_per_example):
        return
    if req.model is None:
        raise BadInputError("--image-size / --images-per-example: pretraining from scratch plans a text model; "
                            "give a vision-language model (e.g. qwen2-vl-2b)")
    from trainfit.core.knob_rules import check_knobs

    check_knobs(TrainingSetup(image_size=req.image_size, images_per_example=req.images_per_example), req.model)
