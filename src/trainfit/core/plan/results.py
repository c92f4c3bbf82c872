"""What `plan` answers: a Plan of ModePlans (one per mode), each with its run's figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainfit.core.memory_types import MemoryEstimate
from trainfit.core.models.spec import ModelSpec
from trainfit.core.plan import lengths
from trainfit.core.plan.data_io import DataPlan
from trainfit.core.plan.modes import ModeTargets
from trainfit.core.run.power import PowerEstimate
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed.types import SpeedEstimate

if TYPE_CHECKING:  # names only: the spot model loads with `plan --flavor ID --spot` alone
    from trainfit.core.cloud.spot import SpotEstimate


@dataclass(frozen=True)
class RunFigures:
    tokens: int | None  # tokens processed by the whole run (all epochs)
    steps: int | None
    hours: float | None
    energy_kwh: float | None
    electricity_cost: float | None
    rental_usd: float | None
    spot: SpotEstimate | None = None  # with PlanRequest.spot
    rental_expected_usd: float | None = None  # spot: the rental including re-done work and restarts


@dataclass(frozen=True)
class ModePlan:
    mode: str
    fits: bool
    model_id: str
    params_total: int | None
    setup: TrainingSetup | None
    memory: MemoryEstimate | None
    memory_budget_bytes: float | None  # this mode's share of the usable memory per device
    memory_used_bytes: int | None  # predicted total on the busiest device
    speed: SpeedEstimate | None
    power: PowerEstimate | None
    run: RunFigures | None
    reasons: list[str]
    warnings: list[str]
    targets: ModeTargets
    model: ModelSpec | None = None
    pretrain: dict | None = None  # params, tokens, tokens_per_param when the planner chose a size
    candidates_evaluated: int = 0
    data_io: DataPlan | None = None  # stream / cache / workers / input bottleneck / token budget (core.plan.data_io)
    # The examples' lengths at this mode's sequence length: tokens per epoch, share truncated (core.plan.lengths)
    data_lengths: lengths.DataLengths | None = None
    # Host RAM the setting holds at its peak (core.plan.host_ram), checked against Plan.host_ram_usable_bytes
    host_ram_bytes: int | None = None


@dataclass(frozen=True)
class Plan:
    method: str
    hardware: str  # profile source
    device: str  # rules label
    modes: list[ModePlan]
    notes: list[str] = field(default_factory=list)
    # The RAM of the machine planned for: this machine's, a catalog machine's typical host, or a
    # rented flavor's own (data/cloud.yaml ram_gib); None when not measured.
    host_ram_usable_bytes: int | None = None
    # Which speed rates the plan used and when they were measured (core.speed.rates.rates_source).
    rates: dict | None = None
