"""Data-parallel communication per optimizer step, on one node or across nodes.

Volumes (bytes each rank sends per collective, ring algorithm, N ranks; P parameters stored,
T trainable, g bytes per gradient element; Rajbhandari et al. 2020, arXiv 1910.02054 §7):
    DDP / ZeRO-1      one gradient all-reduce per step          2(N-1)/N x T x g
    ZeRO-2            gradient reduce-scatter per micro-batch    (N-1)/N x T x g
                      + bf16 parameter all-gather after the step (N-1)/N x P x 2
    ZeRO-3 / FSDP     per micro-batch: parameter all-gathers in forward and backward (+ recompute)
                      k x (N-1)/N x P x 2, and the gradient reduce-scatter (N-1)/N x T x g
                      (FSDP under no_sync, TrainingSetup.fsdp_no_sync: the reduce-scatter only in the
                      last micro-batch of a step)
    hybrid (FSDP HYBRID_SHARD with ZeRO-3, M nodes of G GPUs): the ZeRO-3 traffic above inside each node
                      (N -> G, over NVLink / PCIe), plus one all-reduce of each rank's gradient
                      shard across the nodes per step: 2(M-1)/M x (T x g / G) per rank, the node's
                      G ranks sharing its network: 2(M-1)/M x T x g / network bytes/s.
                      With G = 1 hybrid sharding is plain data parallelism (refused by the planner).

Link: a ring collective whose ranks span nodes runs at its slowest link: min(the GPU's own link
inside the node, the node's usable network bandwidth). A ring of N ranks crosses each node
boundary once, so of the 2(N-1)/N x bytes each rank sends, what leaves a node leaves through one
edge; NCCL runs one ring (channel) per NIC, so a node's G rings share its ports and each moves
1/G of the data: the network moves 2(N-1)/N x bytes at the node's full bandwidth. Inside one
node: the GPU link.

Overlap rule (the same on one node and across nodes, applied to the whole collective costed at
its slowest link): DDP's bucketed all-reduce hides behind up to 0.9 of the last micro-batch's
backward; ZeRO-2's reduce-scatter behind 0.9 of each backward; ZeRO-3 / FSDP prefetching hides
up to 0.85 of each micro-batch, at least 5 % of the traffic staying exposed. Hybrid: the
inter-node all-reduce runs with the last micro-batch's intra-node traffic and shares its 0.85
window. Latency: 20 us per ring hop, 2(N-1) hops per collective.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.runtime import runtime_of
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed.rates import DeviceRates

HOP_LATENCY_SECONDS = 20e-6
DDP_OVERLAP = 0.9  # share of the backward pass that hides gradient buckets
ZERO3_OVERLAP = 0.85  # share of a micro-batch that prefetching hides
MIN_EXPOSED = 0.05
# GPUs that talk over PCIe (no NVLink) hide much less of the ZeRO-3 / FSDP gathers: on the same
# machines, FSDP full-shard runs were slower than DDP runs of the same model although the model
# predicted the gathers hidden (2x RTX 4090: Llama-2 7B LoRA 2,180 vs 2,400 tokens/s per GPU;
# 2x RTX 3090: 874 vs 1,190; Answer.AI fsdp_qlora benchmarks, bench/data/published_speed.yaml).
# NCCL over PCIe (through host memory where GeForce cards have no P2P) competes with the
# compute kernels: at least half of that traffic stays exposed.
PCIE_MIN_EXPOSED = 0.5
# Bytes per stored weight a ZeRO-3 / FSDP all-gather moves: 16-bit parameters, or the packed
# 4-bit / 8-bit storage of a quantised base (FSDP + QLoRA gathers the quantised weights).
GATHER_BYTES = {"nf4": 0.5625, "nf4-dq": 0.5625, "int8": 1.0}


@dataclass(frozen=True)
class CommTime:
    seconds: float  # exposed (not hidden) collective time per optimizer step
    inter_node_seconds: float  # of the raw traffic time, what crosses the network (before overlap)
    link_bytes_per_s: float  # the link the collectives were costed at
    note: str | None  # what the plan quotes about the network


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def _latency(n: int) -> float:
    return 2 * (n - 1) * HOP_LATENCY_SECONDS if n > 1 else 0.0


def spanning_link(rates: DeviceRates, gpus_per_node: int, network_bytes_per_s: float) -> float:
    """Ring bandwidth (bytes/s per direction) of a collective over ranks on several nodes."""
    if gpus_per_node > 1 and rates.link_bytes_per_s > 0:
        return min(rates.link_bytes_per_s, network_bytes_per_s)
    return network_bytes_per_s


def communication(setup: TrainingSetup, rates: DeviceRates, *, n_stored: float, trainable: float,
                  micro_s: float, bwd_share: float, network_bytes_per_s: float) -> CommTime:
    """Exposed collective time per optimizer step for `setup` (see the module docstring)."""
    n = max(1, setup.num_gpus)
    nodes = max(1, setup.num_nodes) if n > 1 else 1
    g = setup.gpus_per_node
    grad_bytes = 2.0 if setup.precision != "fp32" else 4.0
    gathers = 2 + (1 if setup.grad_checkpointing == "full" else 0)
    if n <= 1:
        return CommTime(0.0, 0.0, 0.0, None)
    if nodes > 1:
        link = spanning_link(rates, g, network_bytes_per_s)
    else:
        link = rates.link_bytes_per_s
    if link <= 0:
        return CommTime(0.0, 0.0, 0.0, None)
    accum = setup.grad_accum
    note = None
    if nodes > 1 and setup.hybrid_shard and setup.zero_stage >= 3:
        intra = rates.link_bytes_per_s if g > 1 else 0.0
        if g > 1 and intra > 0:
            per_micro = _ring(g) * (gathers * n_stored * 2.0 + trainable * grad_bytes) / intra + _latency(g)
        else:
            per_micro = 0.0
        inter = 2 * _ring(nodes) * trainable * grad_bytes / network_bytes_per_s + _latency(nodes)
        window = ZERO3_OVERLAP * micro_s
        exposed = (accum - 1) * max(per_micro - window, MIN_EXPOSED * per_micro)
        exposed += max(per_micro + inter - window, MIN_EXPOSED * (per_micro + inter))
        note = (f"hybrid sharding: shards inside each node of {g} GPUs, one gradient all-reduce across "
                f"{nodes} nodes per step ({inter:.3g} s of network traffic before overlap)")
        return CommTime(exposed, inter, link, note)
    ring = _ring(n)
    latency = _latency(n)
    if setup.zero_stage <= 1:
        # DDP: one bucketed all-reduce during the last micro-batch's backward.
        traffic = 2 * ring * trainable * grad_bytes / link + latency
        exposed = max(traffic - DDP_OVERLAP * bwd_share * micro_s, 0.0) + latency
        total_traffic = traffic
    elif setup.zero_stage == 2:
        per_micro = ring * trainable * grad_bytes / link + latency
        gather = ring * n_stored * 2.0 / link  # updated bf16 params, after the step
        reducing = 1 if runtime_of(setup).fsdp_no_sync else accum  # micro-batches that reduce-scatter
        exposed = reducing * max(per_micro - DDP_OVERLAP * bwd_share * micro_s, 0.0) + gather
        total_traffic = reducing * per_micro + gather
    else:
        # ZeRO-3 / FSDP FULL_SHARD: gather params for forward, again for backward (and recompute),
        # reduce-scatter grads; prefetching hides most of it behind compute.
        gather_bytes = GATHER_BYTES.get(setup.quant, 2.0)
        gather = ring * gathers * n_stored * gather_bytes / link + 2 * latency
        per_micro = gather + ring * trainable * grad_bytes / link + latency
        floor = PCIE_MIN_EXPOSED if rates.link_kind == "pcie-p2p" and nodes <= 1 else MIN_EXPOSED
        window = ZERO3_OVERLAP * micro_s
        gathering = accum - 1 if runtime_of(setup).fsdp_no_sync else 0  # micro-batches without a reduce-scatter
        exposed = ((accum - gathering) * max(per_micro - window, floor * per_micro)
                   + gathering * max(gather - window, floor * gather))
        total_traffic = (accum - gathering) * per_micro + gathering * gather
    inter_s = total_traffic if nodes > 1 else 0.0
    if nodes > 1:
        bound = "the network" if link < rates.link_bytes_per_s or g <= 1 else "the GPU link"
        note = (f"{nodes} nodes: collectives over all {n} GPUs run at {link / 1e9:.3g} GB/s, bound by "
                f"{bound} ({inter_s:.3g} s of traffic per step before overlap)")
    return CommTime(exposed, inter_s, link, note)
