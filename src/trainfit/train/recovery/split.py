"""How one optimizer step is computed (micro-batch x accumulation per process, gradient
checkpointing) and the rules that compute the same step in a smaller way: the global batch, the
data order and the schedule stay (trainfit.train.recovery)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig


@dataclass(frozen=True)
class Split:
    """How one optimizer step is computed: micro_batch x grad_accum per process, checkpointing."""

    micro_batch: int
    grad_accum: int
    grad_checkpointing: str = "none"

    @classmethod
    def of(cls, cfg: "RunConfig") -> "Split":
        t = cfg.training
        return cls(t.micro_batch, t.grad_accum, t.grad_checkpointing)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        gc = ", gradient checkpointing" if self.grad_checkpointing != "none" else ""
        return f"micro-batch {self.micro_batch} x accumulation {self.grad_accum}{gc}"


def shrink(split: Split) -> Split | None:
    """The next smaller way to compute the same step: the micro-batch's largest divisor <= half of
    it, with the accumulation multiplied by the same factor (the product stays); at micro-batch 1
    gradient checkpointing; None when that is on already."""
    mb = split.micro_batch
    if mb > 1:
        new = max(d for d in range(1, mb // 2 + 1) if mb % d == 0)
        return Split(new, split.grad_accum * (mb // new), split.grad_checkpointing)
    if split.grad_checkpointing == "none":
        return Split(1, split.grad_accum, "full")
    return None


def split_for_world(global_batch: int, processes: int, micro_batch_max: int,
                    grad_checkpointing: str = "none") -> Split | None:
    """The largest micro-batch <= micro_batch_max with micro_batch x grad_accum x processes equal to
    the global batch; None when the global batch does not divide over the processes."""
    if processes < 1 or global_batch % processes:
        return None
    per_process = global_batch // processes
    for mb in range(min(micro_batch_max, per_process), 0, -1):
        if per_process % mb == 0:
            return Split(mb, per_process // mb, grad_checkpointing)
    return None


def with_training(cfg: "RunConfig", **changes: Any) -> "RunConfig":
    """`cfg` with these training keys changed."""
    return dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, **changes))


def with_split(cfg: "RunConfig", split: Split) -> "RunConfig":
    """`cfg` computing its steps with `split`."""
    return with_training(cfg, micro_batch=split.micro_batch, grad_accum=split.grad_accum,
                         grad_checkpointing=split.grad_checkpointing)


def fit_micro_batch(cfg: "RunConfig", spec, device: str, world_size: int, profile=None) -> tuple[Split, str]:
    """The largest micro-batch (at most the current one, same global batch) that the memory model
    fits into the safety mode's share of the device's memory; gradient checkpointing when even
    micro-batch 1 does not fit without it. Returns (split, note)."""
    current = Split.of(cfg)
    if spec is None or profile is None:
        return current, "micro-batch kept: no model description or hardware profile to check it with"
    try:
        from trainfit.core.memory import estimate_memory
        from trainfit.core.plan.engine import Budget, need_ratio
        from trainfit.core.plan.modes import targets

        mode = getattr(getattr(cfg, "safety", None), "mode", "balanced")
        budget = Budget(share=targets(mode).memory_share)
        per_process = current.micro_batch * current.grad_accum
        candidates = [Split(mb, per_process // mb, current.grad_checkpointing)
                      for mb in range(current.micro_batch, 0, -1) if per_process % mb == 0]
        if current.grad_checkpointing == "none":
            candidates.append(Split(1, per_process, "full"))
        for split in candidates:
            setup = with_split(cfg, split).to_setup(device, num_gpus=world_size, hardware=profile)
            if need_ratio(estimate_memory(spec, setup, profile), budget) <= 1.0:
                return split, f"memory model: fits {mode} mode's {budget.share:.0%} of {device} memory"
        return candidates[-1], f"memory model: even {candidates[-1].describe()} is over the {mode} budget; trying it"
    except Exception as exc:  # noqa: BLE001  (an estimate is not worth a failed recovery)
        return current, f"micro-batch kept: the memory model could not check it ({type(exc).__name__}: {exc})"
