"""SkyPilot task YAMLs of a plan: `sky launch` (a cluster) and `sky jobs launch` (a managed job).

    skypilot.yaml      cd <plan folder> && sky launch -c trainfit skypilot.yaml
    skypilot-job.yaml  cd <plan folder> && sky jobs launch skypilot-job.yaml

Both copy the plan folder to every node (`workdir: .`), mount a bucket at /checkpoints
(`MOUNT_CACHED`: writes land on the local disk first and are uploaded in the background, the mode
SkyPilot documents for checkpoints) and run launch.sh once per node with NODE_RANK from
SKYPILOT_NODE_RANK and MASTER_ADDR = the first line of SKYPILOT_NODE_IPS (SkyPilot's node 0),
checking SKYPILOT_NUM_NODES against the plan. Every start runs `launch.sh --resume`.

The managed form adds `job_recovery`: SkyPilot relaunches the job on new machines when spot
capacity is preempted (`use_spot: true` from `plan --flavor ID --spot`), and up to
MAX_RESTARTS_ON_ERRORS times when the run fails (a node lost mid-run ends the survivor's launcher
with an error, trainfit.export.launch); the relaunch reads the bucket's last checkpoint.

Accelerators: the plan's GPU as SkyPilot names it (SKYPILOT_ACCELERATORS, from
`sky show-gpus`; a GPU not there is refused with the reason). A --flavor from a cloud SkyPilot
runs on pins `cloud:`; its instance type is named in the header, not pinned: SkyPilot picks the
instance for the accelerators itself, and checking an instance type needs its online catalog. The bucket name is the job name plus "-checkpoints"; change
`envs.CHECKPOINT_BUCKET` (or `--env CHECKPOINT_BUCKET=...`) for a name of your own.
"""

from __future__ import annotations

from typing import Any

from trainfit import __version__
from trainfit.core.run.cluster_env import DEFAULT_MASTER_PORT
from trainfit.errors import BadInputError
from trainfit.export.cluster_job import CHECKPOINT_MOUNT, ClusterJob, dump_yaml, header_comments, launch_args

TASK_FILE = "skypilot.yaml"
JOB_FILE = "skypilot-job.yaml"
MAX_RESTARTS_ON_ERRORS = 3
# GPU catalog id -> SkyPilot accelerator name (`sky show-gpus --all`, SkyPilot 0.14)
SKYPILOT_ACCELERATORS = {
    "h100-sxm": "H100", "h100-pcie": "H100", "h100-nvl": "H100", "h200": "H200", "b200": "B200",
    "a100-80gb": "A100-80GB", "a100-80gb-pcie": "A100-80GB", "a100-40gb": "A100", "a100-40gb-pcie": "A100",
    "l4": "L4", "l40s": "L40S", "a10g": "A10G", "a10": "A10", "a40": "A40", "t4": "T4",
    "v100-16gb": "V100", "v100-32gb": "V100-32GB", "v100-pcie-16gb": "V100", "rtx-4090": "RTX4090",
    "rtx-a4000": "RTXA4000", "rtx-a5000": "RTXA5000", "rtx-a6000": "RTXA6000", "rtx-6000-ada": "RTX6000-Ada",
    "mi300x": "MI300X", "mi250x": "MI250X", "mi210": "MI210", "mi325x": "MI325X",
}
SKYPILOT_CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod", "oci", "ibm", "fluidstack", "paperspace", "cudo",
                   "vast", "nebius", "do", "hyperbolic", "kubernetes")

RUN = f"""set -euo pipefail
export NODE_RANK="$SKYPILOT_NODE_RANK"
MASTER_ADDR="${{SKYPILOT_NODE_IPS%%$'\\n'*}}"  # the first line: node 0
export MASTER_ADDR MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"
if [ "$SKYPILOT_NUM_NODES" != "{{nodes}}" ]; then
  echo "trainfit: this plan is for {{nodes}} node(s), SkyPilot started $SKYPILOT_NUM_NODES" >&2; exit 2
fi
exec bash ./launch.sh {{args}}
"""


def accelerators(job: ClusterJob) -> str | None:
    if not job.gpus_per_node:
        return None
    name = SKYPILOT_ACCELERATORS.get(job.gpu_id or "")
    if name is None:
        raise BadInputError(f"--launcher skypilot: the plan's GPU {job.gpu_id or 'unknown'} has no SkyPilot "
                            "accelerator name here",
                            hint=f"plan for one of {', '.join(sorted(SKYPILOT_ACCELERATORS))}, or write the task by hand")
    return f"{name}:{job.gpus_per_node}"


def task_dict(job: ClusterJob, *, managed: bool) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    acc = accelerators(job)
    if acc is not None:
        resources["accelerators"] = acc
    if job.provider in SKYPILOT_CLOUDS:
        resources["cloud"] = job.provider
    if job.mem_gib:
        resources["memory"] = f"{job.mem_gib}+"
    resources["cpus"] = f"{job.cpus_per_node}+"
    resources["disk_size"] = job.disk_gb
    resources["use_spot"] = job.spot
    if managed:
        resources["job_recovery"] = {"max_restarts_on_errors": MAX_RESTARTS_ON_ERRORS}
    return {
        "name": job.name,
        "num_nodes": job.num_nodes,
        "resources": resources,
        "workdir": ".",
        "envs": {"TRAINFIT_CHECKPOINT_DIR": CHECKPOINT_MOUNT, "CHECKPOINT_BUCKET": f"{job.name}-checkpoints"},
        "file_mounts": {CHECKPOINT_MOUNT: {"name": "${CHECKPOINT_BUCKET}", "mode": "MOUNT_CACHED"}},
        "setup": f"pip install 'trainfit[train]=={__version__}'\n",
        "run": RUN.replace("{nodes}", str(job.num_nodes)).replace("{args}", launch_args(job)),
    }


def _about(job: ClusterJob, managed: bool) -> list[str]:
    how = (f"cd <this folder> && sky jobs launch {JOB_FILE}: a managed job, relaunched after a "
           f"{'spot preemption or ' if job.spot else 'preemption or '}failure (up to {MAX_RESTARTS_ON_ERRORS} "
           "failures) and resumed from the bucket's last checkpoint"
           if managed else f"cd <this folder> && sky launch -c {job.name} {TASK_FILE}")
    return [f"SkyPilot task: {job.num_nodes} node(s) x {accelerators(job) or 'CPU'}"
            + (", spot" if job.spot else "") + (f" (planned as {job.flavor_id} on {job.provider})" if job.flavor_id else "")
            + f"; disk {job.disk_gb} GB (image, weights, keep_last + 1 checkpoints staged)",
            f"  {how}",
            f"Checkpoints: the bucket $CHECKPOINT_BUCKET mounted at {CHECKPOINT_MOUNT} (TRAINFIT_CHECKPOINT_DIR)."]


def skypilot_files(job: ClusterJob) -> dict[str, str]:
    out = {}
    for name, managed in ((TASK_FILE, False), (JOB_FILE, True)):
        text = dump_yaml([task_dict(job, managed=managed)])
        out[name] = header_comments(job, _about(job, managed)) + text
    return out
