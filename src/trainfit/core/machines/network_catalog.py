"""The inter-node network catalog: `data/networks.yaml` loaded once, validated, looked up by id or alias.

A multi-node plan needs the bandwidth one node can push to the others. The catalog gives each
network's line rate per port and the ports a node trains over (every figure cited in the YAML);
`node_bandwidth_gbps` turns that into GB/s (10^9 bytes/s) per node and direction, and
`usable_node_bandwidth_gbps` applies the one efficiency assumption below.

Assumptions, stated once:
* NETWORK_EFFICIENCY = 0.8: the share of the line rate that NCCL ring collectives sustain between
  nodes (packet headers, flow control, imperfect overlap of the rails). An assumption in the same
  spirit as the NVLink factor of core/speed/rates.py (0.7 of the one-direction figure), not a
  measurement: no published figure for every network here was found. `trainfit profile --benchmark`
  does not measure the network either, so plans say "assumed".
* The default network of a node class (`default_network`): Hopper / Blackwell data-centre GPUs with
  NVLink -> InfiniBand NDR (DGX / HGX H100 and B200 ship eight 400 Gb/s ConnectX-7 ports), Ampere
  and older NVLink data-centre GPUs -> InfiniBand HDR (DGX A100: eight 200 Gb/s ports), other
  data-centre GPUs (PCIe cards: L4, L40S, A10, T4, ...) -> 100 Gb/s Ethernet, anything else
  (workstations, desktops) -> 10 Gb/s Ethernet. Override it with `... over NETWORK` in --hardware.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from trainfit import yaml_io
from trainfit.errors import BadInputError, close_matches

NetworkKind = Literal["infiniband", "roce", "efa", "ethernet"]
_KINDS = ("infiniband", "roce", "efa", "ethernet")
_REQUIRED = {"id", "name", "kind", "aliases", "port_gbit", "ports_per_node", "one_port_per_gpu", "source"}
NETWORK_EFFICIENCY = 0.8  # assumption, see the module docstring
BITS_PER_BYTE = 8.0


class NetworkCatalogError(ValueError):
    """The shipped networks.yaml is invalid (a packaging bug, not a user mistake)."""


@dataclass(frozen=True)
class NetworkSpec:
    id: str
    name: str
    kind: NetworkKind
    aliases: tuple[str, ...]
    port_gbit: float  # line rate of one port, Gb/s (10^9 bit/s) per direction
    ports_per_node: int
    one_port_per_gpu: bool  # rail-optimised: a node with fewer GPUs uses fewer ports
    source: str  # URL + date the figures were read

    def ports_for(self, gpus_per_node: int) -> int:
        """Ports a node with `gpus_per_node` GPUs trains over."""
        if self.one_port_per_gpu:
            return max(1, min(self.ports_per_node, gpus_per_node))
        return self.ports_per_node

    def node_bandwidth_gbps(self, gpus_per_node: int) -> float:
        """Line rate of one node, GB/s (10^9 bytes/s) per direction."""
        return self.port_gbit * self.ports_for(gpus_per_node) / BITS_PER_BYTE


def usable_node_bandwidth_gbps(line_rate_gbps: float) -> float:
    """What ring collectives are assumed to sustain of a node's line rate (GB/s)."""
    return line_rate_gbps * NETWORK_EFFICIENCY


def parse_networks(text: str, origin: str = "networks.yaml") -> tuple[NetworkSpec, ...]:
    """Validate the catalog text; every problem at once in one NetworkCatalogError."""
    data = yaml_io.load_yaml(text)
    entries = data.get("networks") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise NetworkCatalogError(f"{origin}: expected a non-empty 'networks:' list")
    problems: list[str] = []
    specs: list[NetworkSpec] = []
    names: set[str] = set()
    for i, raw in enumerate(entries):
        where = f"{origin}: networks[{i}]"
        if not isinstance(raw, dict):
            problems.append(f"{where}: expected a mapping")
            continue
        where = f"{origin}: {raw.get('id', f'networks[{i}]')}"
        missing, unknown = _REQUIRED - set(raw), set(raw) - _REQUIRED
        if missing or unknown:
            problems.append(f"{where}: missing {sorted(missing)} / unknown {sorted(unknown)} key(s)")
            continue
        if raw["kind"] not in _KINDS:
            problems.append(f"{where}: kind {raw['kind']!r} is not one of {', '.join(_KINDS)}")
        for key in ("port_gbit", "ports_per_node"):
            if isinstance(raw[key], bool) or not isinstance(raw[key], (int, float)) or raw[key] <= 0:
                problems.append(f"{where}: {key} must be a positive number")
        if not str(raw["source"]).strip() or "http" not in str(raw["source"]):
            problems.append(f"{where}: source must name the URL the figures come from")
        ids = [str(raw["id"]).lower()] + [str(a).lower() for a in raw["aliases"] or []]
        for name in ids:
            if name in names:
                problems.append(f"{where}: id or alias {name!r} is used twice")
            names.add(name)
        if problems:
            continue
        specs.append(NetworkSpec(id=str(raw["id"]), name=str(raw["name"]), kind=raw["kind"],
                                 aliases=tuple(str(a).lower() for a in raw["aliases"] or []),
                                 port_gbit=float(raw["port_gbit"]), ports_per_node=int(raw["ports_per_node"]),
                                 one_port_per_gpu=bool(raw["one_port_per_gpu"]), source=str(raw["source"])))
    if problems:
        raise NetworkCatalogError("; ".join(problems))
    return tuple(specs)


@functools.lru_cache(maxsize=1)
def all_networks() -> tuple[NetworkSpec, ...]:
    text = resources.files("trainfit").joinpath("data/networks.yaml").read_text(encoding="utf-8")
    return parse_networks(text)


def network_ids() -> list[str]:
    return [n.id for n in all_networks()]


def get_network(name: str, *, key: str = "--hardware") -> NetworkSpec:
    """A network by id or alias (case-insensitive); BadInputError naming `key` and the valid ids."""
    wanted = (name or "").strip().lower()
    for spec in all_networks():
        if wanted == spec.id or wanted in spec.aliases:
            return spec
    near = close_matches(wanted, [n.id for n in all_networks()], n=3)
    did = f"did you mean {', '.join(near)}? " if near else ""
    raise BadInputError(f"{key}: {name!r} is not a known inter-node network",
                        hint=f"{did}valid networks: {', '.join(network_ids())}")


def default_network(architecture: str | None, gpu_class: str | None, interconnect: str | None) -> NetworkSpec:
    """The assumed network between nodes of this GPU class (see the module docstring)."""
    arch = (architecture or "").lower()
    linked = (interconnect or "").startswith(("nvlink", "infinity"))
    if gpu_class == "datacenter" and linked:
        return get_network("ib-ndr" if arch in ("hopper", "blackwell") else "ib-hdr")
    if gpu_class == "datacenter":
        return get_network("100gbe")
    return get_network("10gbe")
