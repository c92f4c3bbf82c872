"""Planning across nodes: which sharding, and why (memory against inter-node traffic).

The planner searches hybrid sharding as one more knob (`hybrid_options`) next to the ZeRO stages,
and the speed model (core/speed/comm.py) costs each choice with the network between the nodes;
the fastest setting that fits wins. `sharding_reasons` then says why, comparing the chosen setting
with its twin (full sharding over every GPU <-> hybrid sharding inside each node):

* full sharding (ZeRO-3 / FSDP FULL_SHARD over all N GPUs) holds 1/N of the model states per GPU,
  but gathers the parameters over the network at every micro-batch;
* hybrid sharding (FSDP HYBRID_SHARD: shard over the G GPUs of a node, replicate across nodes)
  holds 1/G, and sends only one gradient all-reduce per step over the network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trainfit.core.models.spec import ModelSpec
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import TrainingSetup
from trainfit.errors import BadInputError

GIB = 1 << 30


def hybrid_options(base: TrainingSetup) -> tuple[bool, ...]:
    """Values of `hybrid_shard` the search tries: both on several nodes, off on one."""
    return (False, True) if base.num_nodes > 1 else (False,)


def coherent_hybrid(s: TrainingSetup) -> bool:
    """Hybrid sharding means ZeRO-3 / FSDP full sharding inside a node, on several nodes."""
    return not s.hybrid_shard or (s.num_nodes > 1 and s.zero_stage >= 3 and s.num_gpus > s.num_nodes)


def sharding_reasons(model: ModelSpec, s: TrainingSetup, hardware: HardwareProfile, limit_bytes: float,
                     speed_fn: Callable[[ModelSpec, TrainingSetup], object], *,
                     step_time_factor: float = 1.0) -> list[str]:
    """The plan's sentences about nodes, network and sharding (empty on one node). Step times are
    scaled by the plan's calibration factor, as the plan's own step time is."""
    from trainfit.core.memory import estimate_memory
    from trainfit.core.machines.multinode_spec import network_note

    if s.num_nodes <= 1:
        return []
    out = [note] if (note := network_note(hardware)) else []
    g, m, n = s.gpus_per_node, s.num_nodes, s.num_gpus
    if s.zero_stage < 3:
        what = "DDP" if s.zero_stage == 0 else f"ZeRO-{s.zero_stage}"
        out.append(f"{what} across {m} nodes: the gradients cross the network once per step "
                   f"(model states are {'replicated' if s.zero_stage == 0 else 'partly sharded'} on every GPU)")
        return out
    twin = dataclasses.replace(s, hybrid_shard=not s.hybrid_shard)
    try:
        twin_mem = estimate_memory(model, twin, hardware).devices[0].needed_bytes
        mine_mem = estimate_memory(model, s, hardware).devices[0].needed_bytes
        twin_step = getattr(speed_fn(model, twin), "step_seconds") * step_time_factor
        mine_step = getattr(speed_fn(model, s), "step_seconds") * step_time_factor
    except BadInputError:  # the twin may be refused by the models' own checks: nothing to compare
        return out
    from trainfit.core.durations import duration_text

    net = hardware.nodes.network or "the network"
    faster = "faster" if mine_step <= twin_step else "slower, kept by this mode's ranking (larger micro-batch)"
    if s.hybrid_shard:
        out.append(f"hybrid sharding (shard inside each node's {g} GPUs, replicate across {m} nodes): "
                   f"{duration_text(mine_step)} per step, {faster} than full sharding over all {n} GPUs ({duration_text(twin_step)}), "
                   f"whose parameter gathers cross {net} at every micro-batch; it holds "
                   f"{mine_mem / GIB:.1f} GiB per GPU against {twin_mem / GIB:.1f} GiB, within the "
                   f"{limit_bytes / GIB:.1f} GiB budget")
    elif twin_mem > limit_bytes:
        out.append(f"full sharding over all {n} GPUs: hybrid sharding (one node's {g} GPUs per shard) would need "
                   f"{twin_mem / GIB:.1f} GiB per GPU, over the {limit_bytes / GIB:.1f} GiB budget, so the "
                   f"parameter gathers cross {net} at every micro-batch ({duration_text(mine_step)} per step)")
    else:
        out.append(f"full sharding over all {n} GPUs: {duration_text(mine_step)} per step, {faster} than hybrid sharding "
                   f"inside each node ({duration_text(twin_step)}, {twin_mem / GIB:.1f} GiB per GPU against "
                   f"{mine_mem / GIB:.1f} GiB)")
    return out
