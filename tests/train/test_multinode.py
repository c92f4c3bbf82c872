"""A real two-"node" launch on this machine: the exporter writes the files for 2 nodes x 1 CPU
process, each node gets its own copy of the folder (as two machines would), and both launch.sh
files start with NODE_RANK 0 / 1 and the same rendezvous endpoint on 127.0.0.1 (torchrun --nnodes 2,
--node-rank 0 / 1, gloo); node 0 is global rank 0, so the run directory under the shared
TRAINFIT_CHECKPOINT_DIR gets its files. The run trains, and its losses match one process with
doubled gradient accumulation within the tolerance of test_distributed.py (relative 1e-5).

Node lost mid-run (test_a_node_killed_mid_step_...): the same launch with rank 1 made to stop
responding in a step (TRAINFIT_FAULTS=stall@N,rank=1) while rank 0 waits for it in the gradient
all-reduce; node 1's process group gets SIGKILL (a machine lost). Node 0 must exit on its own within
SURVIVOR_EXIT_BOUND_S (gloo sees the peer's sockets close and raises, the static-rendezvous torchrun
agent does not restart, launch.sh exits non-zero), then both nodes relaunched with --resume finish
with the losses of an uninterrupted two-node run. The Slurm script and the SkyPilot managed job are
run the same way on this machine, with `srun` / `scontrol` and SkyPilot's node variables stood in
for, killed mid-run and started again as a requeue / a managed-job recovery would: both resume
from the last checkpoint and end with the uninterrupted run's losses. Every "node" of those reads
one plan folder and one run directory, as nodes on a shared filesystem do
(checkpointing.allow_node_local: the two "nodes" share this machine's disk).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainfit.config.run_config import load_run_config, parse_run_config
from trainfit.export.bundle import LAUNCH_FILE, render_files, run_dir_name
from trainfit.export.publish import write_tree
from trainfit.train.runner import run_training

from .conftest import loss_trajectory, make_config

TIMEOUT_S = 240
# A lost peer whose sockets close (kill -9, a crashed process, a rebooted machine): gloo raises at
# once and torchrun tears the node down in seconds; 60 s leaves room for a loaded 2-core machine.
# (A silent partition, no FIN / RST, waits for the collective timeout instead: Transformers'
# ddp_timeout, 1800 s by default.)
SURVIVOR_EXIT_BOUND_S = 60.0
STEPS, EVERY, STALL_STEP = 8, 3, 5  # checkpoints at 3 and 6; node 1 hangs in step 5: resume from 3


def write_files(folder: Path, files: dict[str, str], *, force: bool) -> None:
    write_tree(folder, {"": files}, force=force)  # one folder, as plan --out writes it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_config(tmp_path: Path, *, steps: int = 4, every: int = 4, shared_ok: bool = True) -> tuple[dict, str]:
    path = make_config(tmp_path, "pretrain", name="two-nodes.yaml",
                       training={"micro_batch": 2, "grad_accum": 1, "num_nodes": 2, "device": "cpu"},
                       schedule={"max_steps": steps}, checkpointing={"every_steps": every})
    raw = yaml.safe_load(path.read_text())
    raw["name"] = "two-nodes"
    if shared_ok:
        raw["checkpointing"]["allow_node_local"] = True  # the "nodes" share this machine's disk
    return raw, yaml.safe_dump(raw, sort_keys=False)


def _files(tmp_path: Path, **kw) -> tuple[object, dict[str, str]]:
    raw, text = _node_config(tmp_path, **kw)
    cfg = parse_run_config(raw, base_dir=tmp_path, source="two-nodes")
    return cfg, render_files(cfg, header_lines=["test: two nodes on 127.0.0.1"], num_processes=2, device="cpu",
                             run_config_text=text)


def _env(port: int, shared: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TRAINFIT_CHECKPOINT_DIR": str(shared),
           "GLOO_SOCKET_IFNAME": "lo",  # both "nodes" on this machine: loopback (launch.sh keeps a set value)
           # the launch file calls `torchrun`: the one installed with this Python
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
    env.pop("TRAINFIT_FAULTS", None) if "TRAINFIT_FAULTS" not in extra else None
    return env


def _start(folder: Path, rank: int, port: int, shared: Path, *args: str, **extra: str) -> subprocess.Popen:
    env = {**_env(port, shared, **extra), "NODE_RANK": str(rank)}
    return subprocess.Popen(["bash", str(folder / LAUNCH_FILE), "--quiet", "--json", *args], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_all(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Wait for every node; past the deadline, or when one node fails, kill every process group."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            _kill_group(p)
    return [(p.wait(), *p.communicate()) for p in procs]


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to every process the node started, at once (a machine lost): torchrun starts its
    workers in sessions of their own, so the process group alone would leave them running."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _wait_for_step(run_dir: Path, step: int, procs: list[subprocess.Popen]) -> None:
    """Until metrics.jsonl has `step`'s loss (and so the checkpoint before it is written)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").is_file() and step in loss_trajectory(run_dir):
            return
        if any(p.poll() is not None for p in procs):
            outs = [p.communicate() for p in procs]
            pytest.fail(f"a node ended before step {step}: {[o[1][-2000:] for o in outs]}")
        time.sleep(0.1)
    for p in procs:
        _kill_group(p)
    pytest.fail(f"step {step} not reached in {TIMEOUT_S} s")


def _assert_same_losses(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1)), (got, want)
    for step, loss in want.items():
        assert abs(got[step] - loss) <= 1e-5 * abs(loss), (step, got, want)


@pytest.mark.slow
def test_two_nodes_launched_from_the_exported_files_match_one_process(tmp_path):
    cfg, files = _files(tmp_path)
    launch = files[LAUNCH_FILE]
    assert "torchrun --nnodes 2 --node-rank \"$NODE_RANK\" --nproc-per-node 1 --rdzv-backend static" in launch
    assert '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in launch
    assert '--out "$TRAINFIT_CHECKPOINT_DIR"/runs/two-nodes' in launch
    accel = yaml.safe_load(files["accelerate.yaml"])
    assert accel["num_machines"] == 2 and accel["distributed_type"] == "MULTI_CPU"
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    write_tree(node0, {"": files}, force=False)
    shutil.copytree(node0, node1)  # the second machine gets its own copy of the folder

    port, shared = _free_port(), tmp_path / "shared"
    results = _wait_all([_start(node0, 0, port, shared), _start(node1, 1, port, shared)])
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"node {rank} exited {code}: {stderr[-3000:]}"
    summary = json.loads(results[0][1])  # global rank 0 prints the summary
    assert summary["processes"] == 2 and summary["global_batch"] == 4 and summary["global_step"] == 4
    run_dir = shared / run_dir_name(cfg)
    multi_losses = list(loss_trajectory(run_dir).values())
    assert not (node0 / "runs").exists() and not (node1 / "runs").exists()  # only the shared directory

    one = make_config(tmp_path, "pretrain", name="one.yaml", training={"micro_batch": 2, "grad_accum": 2},
                      schedule={"max_steps": 4}, checkpointing={"every_steps": 4})
    single = run_training(load_run_config(one), tmp_path / "single", quiet=True)
    assert single.summary["global_batch"] == 4
    single_losses = [loss for _, loss in single.losses]
    assert len(multi_losses) == len(single_losses) == 4
    for a, b in zip(multi_losses, single_losses):
        assert abs(a - b) <= 1e-5 * abs(b), (multi_losses, single_losses)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    """The losses of an uninterrupted two-node run of the node-loss tests' config."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    cfg, files = _files(tmp, steps=STEPS, every=EVERY)
    write_files(tmp / "plan", files, force=False)
    port, shared = _free_port(), tmp / "shared"
    results = _wait_all([_start(tmp / "plan", r, port, shared) for r in (0, 1)])
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"node {rank} exited {code}: {stderr[-3000:]}"
    return loss_trajectory(shared / run_dir_name(cfg))


@pytest.mark.slow
def test_a_node_killed_mid_step_ends_the_other_in_bounded_time_and_both_resume(tmp_path, uninterrupted):
    cfg, files = _files(tmp_path, steps=STEPS, every=EVERY)
    plan = tmp_path / "plan"
    write_files(plan, files, force=False)
    shared = tmp_path / "shared"
    run_dir = shared / run_dir_name(cfg)
    port = _free_port()
    stall = {"TRAINFIT_FAULTS": f"stall@{STALL_STEP},rank=1"}
    node0, node1 = (_start(plan, r, port, shared, **stall) for r in (0, 1))
    _wait_for_step(run_dir, STALL_STEP - 1, [node0, node1])
    time.sleep(2.0)  # node 1 hangs in its forward; node 0 waits for it in the all-reduce
    assert node0.poll() is None, "node 0 must still be waiting in the collective"
    _kill_group(node1)  # the machine is lost: every process of node 1 at once
    killed = time.monotonic()
    try:
        code0 = node0.wait(timeout=SURVIVOR_EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        _kill_group(node0)
        pytest.fail(f"node 0 still running {SURVIVOR_EXIT_BOUND_S:.0f} s after node 1 was killed: a hang")
    survivor_exit_s = time.monotonic() - killed
    node1.wait()
    assert code0 != 0
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"checkpoint-{EVERY}"]

    port = _free_port()  # both nodes relaunched, as a scheduler restarts a failed job
    results = _wait_all([_start(plan, r, port, shared, "--resume") for r in (0, 1)])
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"node {rank} exited {code} on resume: {stderr[-3000:]}"
    summary = json.loads(results[0][1])
    assert summary["resumed_from"] == f"checkpoint-{EVERY}" and summary["global_step"] == STEPS
    _assert_same_losses(loss_trajectory(run_dir), uninterrupted)
    print(f"survivor exited {survivor_exit_s:.1f} s after node 1 was killed (bound {SURVIVOR_EXIT_BOUND_S:.0f} s)")


def _cpu_job(files: dict[str, str], *, spot: bool):
    from trainfit.export.cluster_job import ClusterJob

    return ClusterJob(name="trainfit-two-nodes", header_lines=["test: two CPU nodes on 127.0.0.1"], num_nodes=2,
                      gpus_per_node=0, gpu_id=None, cpus_per_node=1, mem_bytes_per_node=None, run_seconds=None,
                      checkpoint_bytes=None, weights_bytes=None, keep_last=2, spot=spot, network=None,
                      run_dir="runs/two-nodes", plan_files=files)


FAKE_SRUN = """#!/usr/bin/env bash
# srun on one machine: start the command once per "node" with SLURM_NODEID / SLURM_PROCID, in the
# background; --kill-on-bad-exit: when one fails, end the others.
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in --nodes=*) nodes="${1#--nodes=}"; shift ;; --*) shift ;; *) break ;; esac
done
pids=()
for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
status=0
for pid in "${pids[@]}"; do
  if ! wait "$pid"; then status=1; kill "${pids[@]}" 2>/dev/null; fi
done
exit $status
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
case "$1 $2" in
  "show hostnames") printf '127.0.0.1\\n127.0.0.1\\n' ;;
  "requeue "*) echo "requeue $2" >> "$FAKE_SLURM_LOG" ;;
  *) echo "fake scontrol: $*" >&2; exit 1 ;;
esac
"""


def _fake_slurm(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


@pytest.mark.slow
def test_slurm_script_requeued_after_a_kill_resumes_from_the_last_checkpoint(tmp_path, uninterrupted):
    from trainfit.export.slurm import SBATCH_FILE, sbatch_script

    cfg, files = _files(tmp_path, steps=STEPS, every=EVERY)
    plan = tmp_path / "plan"
    write_files(plan, {**files, SBATCH_FILE: sbatch_script(_cpu_job(files, spot=False))}, force=False)
    shared, log = tmp_path / "shared", tmp_path / "slurm.log"
    run_dir = shared / run_dir_name(cfg)
    bin_dir = _fake_slurm(tmp_path)

    def start(restart: int, **extra: str) -> subprocess.Popen:
        env = _env(_free_port(), shared, SLURM_SUBMIT_DIR=str(plan), SLURM_JOB_NODELIST="node[0-1]",
                   SLURM_JOB_ID="42", SLURM_RESTART_COUNT=str(restart), FAKE_SLURM_LOG=str(log), **extra)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        return subprocess.Popen(["bash", str(plan / SBATCH_FILE)], cwd=plan, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    job = start(0, TRAINFIT_FAULTS=f"stall@{STALL_STEP},rank=1")
    _wait_for_step(run_dir, STALL_STEP - 1, [job])
    job.send_signal(signal.SIGUSR1)  # --signal=B:USR1@300: the time limit is near
    deadline = time.monotonic() + 30
    while not (log.is_file() and log.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert log.read_text().split() == ["requeue", "42"]  # the trap requeued the job
    _kill_group(job)  # Slurm ends the job's processes (preemption, the time limit, a lost node)
    job.wait()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"checkpoint-{EVERY}"]

    again = start(1)  # the requeued job starts the same script again
    code = again.wait(timeout=TIMEOUT_S)
    out, err = again.communicate()
    assert code == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == f"checkpoint-{EVERY}" and summary["global_step"] == STEPS
    _assert_same_losses(loss_trajectory(run_dir), uninterrupted)


@pytest.mark.slow
def test_skypilot_managed_spot_job_recovered_after_preemption_resumes_from_the_last_checkpoint(tmp_path,
                                                                                              uninterrupted):
    from trainfit.export.skypilot import JOB_FILE, skypilot_files

    cfg, files = _files(tmp_path, steps=STEPS, every=EVERY)
    spec = skypilot_files(_cpu_job(files, spot=True))[JOB_FILE]
    task = yaml.safe_load(spec)
    assert task["resources"]["use_spot"] is True and task["resources"]["job_recovery"]
    plan = tmp_path / "plan"  # SkyPilot's workdir, copied to every node
    write_files(plan, {**files, JOB_FILE: spec}, force=False)
    bucket = tmp_path / "bucket"  # stands in for the bucket mounted at /checkpoints on every node
    run_dir = bucket / run_dir_name(cfg)

    def start_nodes(**extra: str) -> list[subprocess.Popen]:
        port = _free_port()
        procs = []
        for rank in (0, 1):
            env = {**_env(port, bucket, **extra), **{k: str(v) for k, v in task["envs"].items()},
                   "TRAINFIT_CHECKPOINT_DIR": str(bucket), "SKYPILOT_NODE_RANK": str(rank),
                   "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1", "SKYPILOT_NUM_NODES": "2"}
            env.pop("MASTER_ADDR")  # the run section derives it from SKYPILOT_NODE_IPS
            procs.append(subprocess.Popen(["bash", "-c", task["run"]], cwd=plan, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
        return procs

    nodes = start_nodes(TRAINFIT_FAULTS=f"stall@{STALL_STEP},rank=1")
    _wait_for_step(run_dir, STALL_STEP - 1, nodes)
    for p in nodes:  # a spot preemption takes the machines away
        _kill_group(p)
        p.wait()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"checkpoint-{EVERY}"]
    results = _wait_all(start_nodes())  # the managed job's recovery runs the task again on new machines
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"node {rank} exited {code}: {stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == f"checkpoint-{EVERY}" and summary["global_step"] == STEPS
    _assert_same_losses(loss_trajectory(run_dir), uninterrupted)


def test_multi_node_launch_refuses_to_start_without_a_shared_checkpoint_directory(tmp_path):
    """The quick part of the wiring above: launch.sh checks TRAINFIT_CHECKPOINT_DIR before torchrun."""
    _, files = _files(tmp_path, shared_ok=False)
    write_files(tmp_path / "plan", files, force=False)
    for value, shown in (("", "''"), ("runs", "'runs'")):
        env = {**_env(_free_port(), tmp_path), "NODE_RANK": "0", "TRAINFIT_CHECKPOINT_DIR": value}
        done = subprocess.run(["bash", str(tmp_path / "plan" / LAUNCH_FILE)], env=env, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 2
        assert f"set TRAINFIT_CHECKPOINT_DIR to an absolute directory every node mounts" in done.stderr
        assert f"got {shown}" in done.stderr
