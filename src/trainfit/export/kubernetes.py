"""The Kubernetes manifest of a plan: a Kubeflow PyTorchJob with what it needs, `kubectl apply -f`.

pytorchjob.yaml holds three documents:
  ConfigMap              the plan folder (run.yaml, launch.sh, accelerate.yaml, ...), mounted at /plan
  PersistentVolumeClaim  the checkpoints: ReadWriteMany, so every pod mounts the same volume
                         (at /checkpoints = TRAINFIT_CHECKPOINT_DIR), sized for keep_last + 1 checkpoints
  PyTorchJob             kubeflow.org/v1: one Master and num_nodes - 1 Worker replicas, each a pod
                         running /plan/launch.sh --resume with NODE_RANK = PET_NODE_RANK (the
                         training operator sets it, with MASTER_ADDR / MASTER_PORT, on every pod:
                         pkg/controller.v1/pytorch/envvar.go), GPUs / CPUs / memory from the plan as
                         requests = limits, /dev/shm as a memory volume (data-loader workers)

Restarts: restartPolicy OnFailure restarts a failed pod's container in place; a node lost
mid-run ends the survivors' launchers with an error (no hang: trainfit.export.launch), they
restart too, and every restart resumes from the volume's last checkpoint. runPolicy.backoffLimit
bounds the restarts. No elasticPolicy: it switches torchrun to the c10d rendezvous, which numbers
the nodes itself, and trainfit keeps node 0 = global rank 0 (the static rendezvous, export/launch.py).

The image must hold CUDA PyTorch; the container installs trainfit[train] at this version first.
"""

from __future__ import annotations

from typing import Any

from trainfit import __version__
from trainfit.export.cluster_job import CHECKPOINT_MOUNT, PLAN_MOUNT, ClusterJob, dump_yaml, header_comments, launch_args

MANIFEST_FILE = "pytorchjob.yaml"
IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"  # an official PyTorch CUDA runtime image
BACKOFF_LIMIT = 5
SHM_SIZE = "16Gi"  # data-loader workers pass batches through /dev/shm; the container default is 64 MiB


def _container(job: ClusterJob) -> dict[str, Any]:
    resources: dict[str, str] = {"cpu": str(job.cpus_per_node)}
    if job.mem_gib:
        resources["memory"] = f"{job.mem_gib}Gi"
    if job.gpus_per_node:
        resources["nvidia.com/gpu"] = str(job.gpus_per_node)
    command = (f"pip install --quiet 'trainfit[train]=={__version__}' && "
               f'export NODE_RANK="${{PET_NODE_RANK:-$RANK}}" && exec bash {PLAN_MOUNT}/launch.sh ' + launch_args(job))
    return {
        "name": "pytorch",  # the container name the training operator looks for
        "image": IMAGE,
        "command": ["bash", "-c", command],
        "env": [{"name": "TRAINFIT_CHECKPOINT_DIR", "value": CHECKPOINT_MOUNT}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [{"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
                         {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }


def _replica(job: ClusterJob, replicas: int) -> dict[str, Any]:
    return {"replicas": replicas, "restartPolicy": "OnFailure", "template": {"spec": {
        "containers": [_container(job)],
        "volumes": [{"name": "plan", "configMap": {"name": f"{job.name}-plan"}},
                    {"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"{job.name}-checkpoints"}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]}}}


def manifest_documents(job: ClusterJob) -> list[dict[str, Any]]:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{job.name}-plan"},
                  "data": dict(job.plan_files)}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": f"{job.name}-checkpoints"},
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": f"{job.volume_gib}Gi"}}}}
    specs = {"Master": _replica(job, 1)}
    if job.num_nodes > 1:
        specs["Worker"] = _replica(job, job.num_nodes - 1)
    pytorchjob = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": job.name},
                  "spec": {"runPolicy": {"backoffLimit": BACKOFF_LIMIT, "cleanPodPolicy": "None"},
                           "pytorchReplicaSpecs": specs}}
    return [config_map, claim, pytorchjob]


def pytorchjob_manifest(job: ClusterJob) -> str:
    about = [f"Kubeflow PyTorchJob: 1 Master + {job.num_nodes - 1} Worker pod(s), "
             f"{job.gpus_per_node or 'no'} GPU(s) each; the plan folder as a ConfigMap, checkpoints on a "
             f"{job.volume_gib}Gi ReadWriteMany claim (keep_last + 1 checkpoints x 1.2).",
             f"  kubectl apply -f {MANIFEST_FILE}",
             f"A failed pod restarts (OnFailure, at most {BACKOFF_LIMIT} times) and resumes from the last checkpoint."]
    docs = manifest_documents(job)
    return header_comments(job, about) + dump_yaml(docs)
