"""The environment variables a multi-node run needs on every node, for the network between them.

Three groups, each with the reason a plan prints next to it:

* Rendezvous: MASTER_ADDR (node 0's address, reachable from every node) and MASTER_PORT (a free
  TCP port on node 0; torchrun's default 29500). The launch specs fill them from the scheduler
  (Slurm's node list, SkyPilot's SKYPILOT_NODE_IPS, the PyTorchJob operator's MASTER_ADDR).
* Interfaces: NCCL_SOCKET_IFNAME (the interface NCCL bootstraps over, and carries the data on a
  network without RDMA) and GLOO_SOCKET_IFNAME (the one gloo - the CPU collectives and torchrun's
  store - binds to). Both pick a wrong interface on machines with docker / virtual bridges, the
  most common multi-node hang. launch.sh sets both, when the user has not, to the interface of the
  default route (`ip route`): the interface the nodes reach each other over on a flat cluster network.
  NCCL accepts an exclusion list ("^lo,docker"), gloo only a name, so the name is what both get.
* The fabric (NetworkSpec.kind), from NCCL's and the cloud vendors' documentation:
    infiniband  NCCL_IB_DISABLE=0 NCCL_IB_HCA=mlx5 (every mlx5 HCA: NCCL's prefix match)
    roce        the same, plus NCCL_IB_GID_INDEX=3 (the RoCE v2 GID on ConnectX NICs)
    efa         FI_PROVIDER=efa FI_EFA_USE_DEVICE_RDMA=1 (needs the aws-ofi-nccl plugin, shipped in
                AWS's Deep Learning AMIs and containers), NCCL_IB_DISABLE=1 (EFA is not verbs IB)
    ethernet    NCCL_IB_DISABLE=1: plain TCP sockets over NCCL_SOCKET_IFNAME
  Every value is a default: launch.sh keeps a value the user or the cluster already exported.
Sources: NCCL environment variables,
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html (NCCL_SOCKET_IFNAME, NCCL_IB_HCA,
NCCL_IB_GID_INDEX, NCCL_IB_DISABLE); AWS EFA with NCCL,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html (FI_PROVIDER=efa,
FI_EFA_USE_DEVICE_RDMA=1); PyTorch distributed, https://pytorch.org/docs/stable/distributed.html
(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME; MASTER_ADDR / MASTER_PORT of the env:// rendezvous).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.machines.network_catalog import NetworkSpec

DEFAULT_MASTER_PORT = 29500  # torchrun's and Accelerate's default rendezvous port


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | None  # None: set by the launcher / scheduler on each node (rendezvous, interfaces)
    reason: str


_FABRIC: dict[str, tuple[tuple[str, str, str], ...]] = {
    "infiniband": (("NCCL_IB_DISABLE", "0", "use the InfiniBand verbs transport"),
                   ("NCCL_IB_HCA", "mlx5", "every Mellanox/NVIDIA mlx5 HCA (prefix match)")),
    "roce": (("NCCL_IB_DISABLE", "0", "use RDMA over Converged Ethernet"),
             ("NCCL_IB_HCA", "mlx5", "every mlx5 NIC (prefix match)"),
             ("NCCL_IB_GID_INDEX", "3", "the RoCE v2 GID on ConnectX NICs")),
    "efa": (("FI_PROVIDER", "efa", "libfabric's EFA provider (aws-ofi-nccl plugin)"),
            ("FI_EFA_USE_DEVICE_RDMA", "1", "GPUDirect RDMA over EFA (p4d / p5)"),
            ("NCCL_IB_DISABLE", "1", "EFA is not InfiniBand verbs: NCCL talks to it through libfabric")),
    "ethernet": (("NCCL_IB_DISABLE", "1", "no RDMA: NCCL sends over TCP sockets on NCCL_SOCKET_IFNAME"),),
}


def cluster_env(network: NetworkSpec | None) -> list[EnvVar]:
    """Every variable a node needs, in the order launch.sh sets them (see the module docstring)."""
    out = [
        EnvVar("MASTER_ADDR", None, "node 0's address, reachable from every node (rendezvous)"),
        EnvVar("MASTER_PORT", str(DEFAULT_MASTER_PORT), "a free TCP port on node 0 (rendezvous)"),
        EnvVar("NCCL_SOCKET_IFNAME", None, "the interface NCCL bootstraps over (default: the default route's)"),
        EnvVar("GLOO_SOCKET_IFNAME", None, "the interface gloo and torchrun's store bind to (default: the default route's)"),
    ]
    kind = network.kind if network is not None else "ethernet"
    out += [EnvVar(name, value, reason) for name, value, reason in _FABRIC[kind]]
    return out


def fabric_exports(network: NetworkSpec | None) -> str:
    """Shell lines that export the fabric's variables, keeping values already set."""
    lines = []
    for var in cluster_env(network):
        if var.value is not None and var.name not in ("MASTER_PORT",):
            lines.append(f'export {var.name}="${{{var.name}:-{var.value}}}"  # {var.reason}')
    return "\n".join(lines) + ("\n" if lines else "")


def env_text(network: NetworkSpec | None) -> str:
    """One line for the plan's text output."""
    parts = [f"{v.name}={v.value}" if v.value is not None else v.name for v in cluster_env(network)]
    return " ".join(parts)
