"""Which distributed engine a run config trains with — one rule for the runner and the exporters.

The rule is the one `trainfit train` has always applied: `distributed.strategy` fsdp or deepspeed
names the sharding engine (whatever the process count: FSDP and DeepSpeed also run, and shard
nothing, with one process); otherwise several processes mean DDP and one process means a plain
single-process run. `strategy: auto` with `zero_stage > 0` therefore stays DDP: choosing DeepSpeed
there would change what existing configs run, so it is not done implicitly. Change the rule here
and the runner, the exported files and the launch command all follow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trainfit.config.run_config import RunConfig

Engine = Literal["single", "ddp", "fsdp", "deepspeed"]
ENGINES: tuple[str, ...] = ("single", "ddp", "fsdp", "deepspeed")


def sharding_engine(cfg: RunConfig) -> Literal["fsdp", "deepspeed"] | None:
    """The sharding library the config asks for, or None (plain DDP / single process)."""
    strategy = cfg.distributed.strategy
    if strategy == "fsdp":
        return "fsdp"
    if strategy == "deepspeed":
        return "deepspeed"
    return None


def engine(cfg: RunConfig, *, num_processes: int) -> Engine:
    """The engine for this config launched as num_processes processes."""
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    sharded = sharding_engine(cfg)
    if sharded is not None:
        return sharded
    return "ddp" if num_processes > 1 else "single"
