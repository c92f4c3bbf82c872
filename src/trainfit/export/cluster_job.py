"""What every scheduler spec (Slurm, SkyPilot, Kubernetes) needs from a plan, in one place.

`plan --launcher ENGINE` writes one spec per engine next to launch.sh (export/slurm.py,
export/skypilot.py, export/kubernetes.py). Each starts launch.sh once per node with the node's
rank and node 0's address taken from the scheduler, `--resume` on every start (a run with nothing
to resume starts from step 0), and the run directory on shared storage (TRAINFIT_CHECKPOINT_DIR,
trainfit.export.launch), so a requeued / recovered / restarted job continues from its last
checkpoint.

Sizes, with the margins stated once:
* time limit (Slurm): the plan's predicted run time x TIME_MARGIN + START_SECONDS (start, weight
  download, checkpoint load; the same 10 minutes core.cloud.spot bills a restart, plus 5 for the queue's
  node boot), rounded up to a minute; no limit when the plan does not know the run's length.
* memory per node: the plan's host-RAM peak (core.plan.host_ram) x HOST_RAM_MARGIN, rounded up to
  a GiB (a node runs one task, the launcher, with all its processes).
* CPUs per node: one per training process plus the data-loader workers the plan gave each.
* disk (SkyPilot): DISK_BASE_GB for the image and packages, plus the model's weights and keep_last + 1
  checkpoints (core.cloud.spot.checkpoint_bytes_for) staged locally before the bucket upload.
* checkpoint volume (Kubernetes): keep_last + 1 checkpoints (one being written while keep_last are
  kept) x VOLUME_MARGIN, rounded up to a GiB.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import yaml

from trainfit.core.machines.network_catalog import NetworkSpec

TIME_MARGIN = 1.2
START_SECONDS = 900.0
HOST_RAM_MARGIN = 1.25
DISK_BASE_GB = 64
VOLUME_MARGIN = 1.2
GIB = 1 << 30
CHECKPOINT_MOUNT = "/checkpoints"  # where SkyPilot's bucket and Kubernetes' volume are mounted
PLAN_MOUNT = "/plan"  # Kubernetes: the plan folder (a ConfigMap)
LAUNCHERS = ("slurm", "skypilot", "kubernetes")


def launch_args(job: "ClusterJob") -> str:
    """What every spec passes to launch.sh (and on to trainfit train): --resume, and the run
    directory under the shared checkpoint directory (one node too: a relaunch on a new machine
    finds its checkpoint there, not on the lost machine's disk)."""
    return f'--resume --out "$TRAINFIT_CHECKPOINT_DIR/{job.run_dir}"'


@dataclass(frozen=True)
class ClusterJob:
    """One planned mode as a scheduler sees it."""

    name: str  # job name: DNS-1123 safe (Kubernetes), also Slurm's and SkyPilot's
    header_lines: list[str]  # the plan it came from (the same header as the other files)
    num_nodes: int
    gpus_per_node: int  # 0: CPU nodes
    gpu_id: str | None  # GPU catalog id
    cpus_per_node: int
    mem_bytes_per_node: int | None
    run_seconds: float | None  # predicted, uninterrupted
    checkpoint_bytes: int | None
    weights_bytes: int | None
    keep_last: int
    spot: bool
    network: NetworkSpec | None
    run_dir: str  # runs/<name>, under TRAINFIT_CHECKPOINT_DIR
    provider: str | None = None  # the --flavor's cloud
    flavor_id: str | None = None  # the --flavor (an instance type on AWS / GCP / Azure)
    plan_files: dict[str, str] = field(default_factory=dict)  # the folder launch.sh runs in

    @property
    def time_limit_seconds(self) -> int | None:
        if not self.run_seconds:
            return None
        return int(math.ceil((self.run_seconds * TIME_MARGIN + START_SECONDS) / 60.0) * 60)

    @property
    def mem_gib(self) -> int | None:
        if not self.mem_bytes_per_node:
            return None
        return int(math.ceil(self.mem_bytes_per_node * HOST_RAM_MARGIN / GIB))

    @property
    def disk_gb(self) -> int:
        staged = (self.keep_last + 1) * (self.checkpoint_bytes or 0) + (self.weights_bytes or 0)
        return DISK_BASE_GB + int(math.ceil(staged / 1e9))

    @property
    def volume_gib(self) -> int:
        return max(1, int(math.ceil((self.keep_last + 1) * (self.checkpoint_bytes or 0) * VOLUME_MARGIN / GIB)))


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (scripts, the plan's files) as YAML literal blocks, readable in the spec."""


def _str(dumper: yaml.SafeDumper, text: str):
    block = "\n" in text and not any(line != line.rstrip() for line in text.splitlines())
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if block else None)


_BlockDumper.add_representer(str, _str)


def dump_yaml(docs: list) -> str:
    """YAML documents (one or several), keys in the order given."""
    return yaml.dump_all(docs, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=1000)


def job_name(mode: str) -> str:
    """trainfit-<mode>, made a DNS-1123 label (lower case, digits, '-'; at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"trainfit-{mode}".lower()).strip("-")
    return name[:63].rstrip("-") or "trainfit"


def slurm_time(seconds: int) -> str:
    """Slurm's days-hours:minutes:seconds form of a time limit."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def header_comments(job: ClusterJob, about: list[str]) -> str:
    lines = [part for line in [*job.header_lines, *about] for part in str(line).splitlines() or [""]]
    return "".join(f"# {line}\n" if line else "#\n" for line in lines)


def cluster_job(mp, req, *, run_dir: str, keep_last: int, header_lines: list[str],
                plan_files: dict[str, str]) -> ClusterJob:
    """The ClusterJob of a planned mode (core.plan.planner.ModePlan) for its PlanRequest."""
    from trainfit.core.machines.network_catalog import get_network
    from trainfit.core.cloud.spot import checkpoint_bytes_for

    s = mp.setup
    hw = req.hardware
    nodes = max(1, s.num_nodes)
    per_node = max(1, s.num_gpus // nodes) if s.device != "cpu" else 0
    workers = mp.data_io.num_workers if mp.data_io is not None else 0
    network = get_network(hw.nodes.network) if hw.node_count > 1 and hw.nodes.network else None
    ckpt = checkpoint_bytes_for(s, mp.memory) if mp.memory is not None else None
    width = 2 if s.precision in ("bf16", "fp16", "bf16-mixed", "fp16-mixed") else 4
    weights = (mp.params_total or 0) * width if mp.model is not None and mp.model.source != "shape" else 0
    source = hw.source or ""
    provider = flavor_id = None
    if source.startswith("flavor ") and "(" in source:  # plan --flavor: "flavor ID (provider)"
        flavor_id = source[len("flavor "):].rsplit("(", 1)[0].strip() or None
        provider = source.rsplit("(", 1)[1].rstrip(")").strip() or None
    return ClusterJob(
        name=job_name(mp.mode), header_lines=header_lines, num_nodes=nodes, gpus_per_node=per_node,
        gpu_id=hw.gpus[0].catalog_id if hw.gpus else None, cpus_per_node=max(1, per_node) * (1 + workers),
        mem_bytes_per_node=mp.host_ram_bytes, run_seconds=(mp.run.hours * 3600.0) if mp.run and mp.run.hours else None,
        checkpoint_bytes=ckpt, weights_bytes=weights, keep_last=keep_last, spot=getattr(req, "spot", None) is not None,
        network=network, run_dir=run_dir, provider=provider, flavor_id=flavor_id, plan_files=plan_files)
