"""The multi-node forms of `--hardware` (see trainfit.core.machines.hardware_spec for every form).

    2 nodes x 8x h100-sxm [over NETWORK]     2x 8x h100-sxm [over NETWORK]
    2 nodes x node.json [over NETWORK]       node0.json,node1.json [over NETWORK]

A multi-node profile is one node's profile with every node's GPUs listed (node 0 first, NVLink
peers kept inside a node) and `nodes` set: the count, and the network between the nodes from the
network catalog (the GPU class's default when no `over NETWORK` is given, marked as assumed).

Refused with the reason: nodes that differ (GPU model, count or memory), nodes without GPUs (a
CPU-only run is one process: trainfit trains on CPU with one process per machine), Apple / laptop
GPUs (no NCCL), a profile that is already multi-node, `over` on one machine, counts out of range.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from trainfit.core.machines.network_catalog import NetworkSpec, default_network, get_network
from trainfit.core.machines.profile import HardwareProfile, NodesInfo
from trainfit.errors import BadInputError

_OVER_RE = re.compile(r"^(.*?)\s+over\s+(\S+)\s*$", re.IGNORECASE)
_NODES_RE = re.compile(r"^\s*([+-]?[0-9]+)\s*nodes?\s*(?:[x×*]|of)\s*(.+)$", re.IGNORECASE)
_COUNT_OF_COUNTS_RE = re.compile(r"^\s*([+-]?[0-9]+)\s*[x×*]\s*([0-9]+\s*[x×*]\s*\S.*)$", re.IGNORECASE)
MAX_NODES = 1024  # a large training cluster; more is a typo more often than a plan
KEY = "--hardware"


def resolve_multinode(text: str, *, resolve_single: Callable[[str], HardwareProfile]) -> HardwareProfile | None:
    """The multi-node profile for `text`, or None when `text` names one machine (no node form)."""
    body, network_name = _split_over(text)
    count: int | None = None
    per_node: list[HardwareProfile] = []
    match = _NODES_RE.match(body) or _COUNT_OF_COUNTS_RE.match(body)
    if match:
        count = int(match.group(1))
        if not 1 <= count <= MAX_NODES:
            raise BadInputError(f"{KEY} '{text}': node count must be 1..{MAX_NODES}",
                                hint="e.g. '2 nodes x 8x h100-sxm'")
        node = resolve_single(match.group(2).strip())
        per_node = [node] * count
    elif "," in body:
        parts = [p.strip() for p in body.split(",")]
        if any(not p for p in parts):
            raise BadInputError(f"{KEY} '{text}': an empty name between commas",
                                hint="join one profile path per node: 'node0.json,node1.json'")
        per_node = [resolve_single(p) for p in parts]
        count = len(per_node)
    if count is None:
        if network_name is not None:
            raise BadInputError(f"{KEY} '{text}': 'over {network_name}' names the network between nodes, "
                                "and this is one machine", hint="use e.g. '2 nodes x 8x h100-sxm over 100gbe'")
        return None
    network = get_network(network_name, key=KEY) if network_name is not None else None
    return combine_nodes(per_node, network=network, text=text)


def _split_over(text: str) -> tuple[str, str | None]:
    match = _OVER_RE.match(text)
    if match is None:
        return text, None
    return match.group(1).strip(), match.group(2).strip()


def _node_signature(p: HardwareProfile) -> tuple:
    return tuple((g.catalog_id or g.name, g.vram_total_bytes) for g in p.gpus)


def combine_nodes(nodes: list[HardwareProfile], *, network: NetworkSpec | None, text: str) -> HardwareProfile:
    """One profile for identical `nodes` (a list of per-node profiles) over `network`
    (None: the default of the GPU class, marked assumed)."""
    first = nodes[0]
    for i, node in enumerate(nodes):
        if node.node_count > 1:
            raise BadInputError(f"{KEY} '{text}': node {i} is already a {node.node_count}-node profile",
                                hint="give one profile per machine")
    if not first.gpus:
        raise BadInputError(f"{KEY} '{text}': the nodes have no GPU; trainfit trains on CPU with one process "
                            "per machine, so a multi-node plan needs GPU nodes",
                            hint="plan one CPU machine ('cpu-64gb'), or name GPU nodes ('2 nodes x 8x h100-sxm')")
    if first.accelerator == "mps" or _gpu_class(first) in ("apple", "laptop", "integrated"):
        raise BadInputError(f"{KEY} '{text}': {first.gpus[0].name} nodes cannot train together "
                            "(no NCCL collectives between such machines)",
                            hint="multi-node training needs data-centre or desktop CUDA / ROCm GPUs")
    want = _node_signature(first)
    for i, node in enumerate(nodes[1:], start=1):
        got = _node_signature(node)
        if got != want:
            raise BadInputError(
                f"{KEY} '{text}': node {i} differs from node 0 ({_describe(node)} vs {_describe(first)}); "
                "trainfit plans identical nodes (every rank gets the same share of the batch)",
                hint="give profiles of machines with the same GPUs, or plan the nodes one by one")
    count = len(nodes)
    if count == 1:
        return first
    per_node = len(first.gpus)
    assumed = network is None
    if network is None:
        network = _default_network(first)
    gpus = []
    for k in range(count):
        for g in first.gpus:
            gpus.append(dataclasses.replace(
                g, index=k * per_node + g.index, nvlink_peers=[k * per_node + j for j in g.nvlink_peers]))
    nodes_info = NodesInfo(count=count, network=network.id, network_kind=network.kind,
                           network_gbps=network.node_bandwidth_gbps(per_node), network_assumed=assumed,
                           network_source=network.source, unavailable={})
    base = first.source.split(":", 1)[1] if first.source.startswith(("catalog:", "file:")) else first.source
    kind = first.source.split(":", 1)[0] if ":" in first.source else "file"
    source = f"{kind}:{count} nodes x {base} over {network.id}"
    return dataclasses.replace(first, source=source, gpus=gpus, nodes=nodes_info)


def _gpu_class(p: HardwareProfile) -> str | None:
    spec = _spec(p)
    return spec.gpu_class if spec else None


def _spec(p: HardwareProfile):
    cid = p.gpus[0].catalog_id if p.gpus else None
    if not cid:
        return None
    from trainfit.core.machines.gpu_catalog import get_gpu

    try:
        return get_gpu(cid)
    except BadInputError:
        return None


def _default_network(p: HardwareProfile) -> NetworkSpec:
    spec = _spec(p)
    if spec is None:
        return default_network(p.gpus[0].architecture, None, "nvlink" if p.gpus[0].nvlink_peers else None)
    return default_network(spec.architecture, spec.gpu_class, spec.interconnect)


def _describe(p: HardwareProfile) -> str:
    if not p.gpus:
        return "no GPU"
    g = p.gpus[0]
    mem = f"{(g.vram_total_bytes or 0) / (1 << 30):.0f} GiB" if g.vram_total_bytes else "memory unknown"
    return f"{len(p.gpus)} x {g.catalog_id or g.name} ({mem})"


def network_note(p: HardwareProfile) -> str | None:
    """The sentence a plan quotes about the inter-node network (None on one node)."""
    n = p.nodes
    if p.node_count <= 1 or n.network_gbps is None:
        return None
    how = "assumed for this GPU class (state it with '... over NETWORK')" if n.network_assumed else "as given"
    return (f"{p.node_count} nodes x {p.gpus_per_node} GPUs over {n.network} ({n.network_kind}, "
            f"{n.network_gbps:.0f} GB/s per node line rate, {how}; source: {n.network_source})")
