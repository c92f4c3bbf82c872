"""The Slurm batch script of a plan: `sbatch slurm.sbatch` from the plan folder.

One task per node (`srun --ntasks-per-node=1`) runs launch.sh, which starts that node's training
processes (torchrun / accelerate launch); NODE_RANK is the task's SLURM_NODEID and MASTER_ADDR the
first host of the allocation (`scontrol show hostnames "$SLURM_JOB_NODELIST"`, first line). The plan folder is
the submit directory (SLURM_SUBMIT_DIR), which every node must see; the run directory defaults to
it too (TRAINFIT_CHECKPOINT_DIR, overridable: `sbatch --export=ALL,TRAINFIT_CHECKPOINT_DIR=/shared/x`).

Preemption and time limits: `--requeue` lets Slurm put a preempted job (PreemptMode=REQUEUE) or a
failed node's job back in the queue; `--signal=B:USR1@REQUEUE_NOTICE_SECONDS` sends the batch shell
USR1 that long before the time limit, and the trap requeues the job itself (`scontrol requeue`).
Every start runs `launch.sh --resume`, so a requeued job continues from its last checkpoint
(a first start finds none and starts from step 0). `--kill-on-bad-exit=1`: when one node's launcher
fails (a node lost), srun ends the others instead of leaving them in a collective.
`--open-mode=append` keeps the log of every start in one file.

Every #SBATCH option used is a documented long option of sbatch (tests/export/data/sbatch_options.txt
lists them with the manual's URL; the tests parse these lines against it).
"""

from __future__ import annotations

import shlex

from trainfit.core.run.cluster_env import DEFAULT_MASTER_PORT
from trainfit.export.cluster_job import ClusterJob, header_comments, launch_args, slurm_time

SBATCH_FILE = "slurm.sbatch"
REQUEUE_NOTICE_SECONDS = 300  # long enough to requeue; the checkpoint cadence bounds the work lost


def sbatch_options(job: ClusterJob) -> list[tuple[str, str | None]]:
    """(long option, value) pairs of the #SBATCH lines, in order."""
    opts: list[tuple[str, str | None]] = [("job-name", job.name), ("nodes", str(job.num_nodes)),
                                          ("ntasks-per-node", "1")]
    if job.gpus_per_node:
        opts.append(("gpus-per-node", str(job.gpus_per_node)))
    opts.append(("cpus-per-task", str(job.cpus_per_node)))
    if job.mem_gib:
        opts.append(("mem", f"{job.mem_gib}G"))
    if job.time_limit_seconds:
        opts.append(("time", slurm_time(job.time_limit_seconds)))
    opts += [("requeue", None), ("signal", f"B:USR1@{REQUEUE_NOTICE_SECONDS}"), ("open-mode", "append"),
             ("output", "slurm-%x-%j.out")]
    return opts


def _about(job: ClusterJob) -> list[str]:
    limit = (f"time limit {slurm_time(job.time_limit_seconds)}: the predicted run x 1.2 + 15 min"
             if job.time_limit_seconds else "no time limit: the plan does not know the run's length")
    mem = (f"memory {job.mem_gib}G per node: the plan's host-RAM peak x 1.25" if job.mem_gib
           else "no --mem: the plan has no host-RAM figure")
    return [f"Slurm batch script: {job.num_nodes} node(s) x {job.gpus_per_node or 'no'} GPU(s), one launch.sh per node.",
            "  cd <this folder, on storage every node sees> && sbatch " + SBATCH_FILE,
            f"{limit}; {mem}; {job.cpus_per_node} CPUs per node (a process per GPU + its data workers).",
            "Preempted or near its time limit, the job is requeued and resumes from its last checkpoint (--resume).",
            "Checkpoints: $TRAINFIT_CHECKPOINT_DIR (default: this folder) must be shared storage."]


def sbatch_script(job: ClusterJob) -> str:
    lines = [f"#SBATCH --{name}" + (f"={value}" if value is not None else "") for name, value in sbatch_options(job)]
    # sbatch reads #SBATCH lines up to the first command: the header comments may come first
    head = "#!/bin/bash\n" + header_comments(job, _about(job)) + "\n".join(lines) + "\n"
    body = f"""set -euo pipefail
PLAN_DIR="${{SLURM_SUBMIT_DIR:-$(pwd)}}"  # sbatch from the plan folder
cd "$PLAN_DIR"
export TRAINFIT_CHECKPOINT_DIR="${{TRAINFIT_CHECKPOINT_DIR:-$PLAN_DIR}}"
HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"  # no pipe into head: pipefail would see SIGPIPE
MASTER_ADDR="${{HOSTS%%$'\\n'*}}"  # the first host is node 0 (SLURM_NODEID 0)
export MASTER_ADDR MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"
echo "trainfit: job ${{SLURM_JOB_ID:-?}} start ${{SLURM_RESTART_COUNT:-0}}: {job.num_nodes} node(s), node 0 $MASTER_ADDR:$MASTER_PORT" >&2

requeue() {{
  echo "trainfit: time limit near: requeueing job $SLURM_JOB_ID (the next start resumes from the last checkpoint)" >&2
  scontrol requeue "$SLURM_JOB_ID"
}}
trap requeue USR1

srun --nodes={job.num_nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\
  bash -c {shlex.quote('NODE_RANK="$SLURM_NODEID" exec ./launch.sh ' + launch_args(job))} &
SRUN_PID=$!
status=0
while true; do  # a trapped signal interrupts wait: wait again until srun has ended
  if wait "$SRUN_PID"; then status=0; else status=$?; fi
  kill -0 "$SRUN_PID" 2>/dev/null || break
done
exit "$status"
"""
    return head + body
