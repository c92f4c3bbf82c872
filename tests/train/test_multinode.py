"""A real two-"node" launch on this machine: the exporter writes the files for 2 nodes x 1 CPU
process, each node gets its own copy of the folder (as two machines would), and both launch.sh
files start with NODE_RANK 0 / 1 and the same rendezvous endpoint on 127.0.0.1 (torchrun --nnodes 2,
--node-rank 0 / 1, gloo); node 0 is global rank 0, so its folder gets the run directory. The run trains, and its losses match one process with doubled gradient accumulation
within the tolerance of test_distributed.py (relative 1e-5)."""

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

from trainfit.export.bundle import LAUNCH_FILE, render_files, run_dir_name
from trainfit.export.publish import write_tree
from trainfit.train.run_config import load_run_config, parse_run_config
from trainfit.train.runner import run_training

from .conftest import make_config

TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_config(tmp_path: Path) -> tuple[dict, str]:
    path = make_config(tmp_path, "pretrain", name="two-nodes.yaml",
                       training={"micro_batch": 2, "grad_accum": 1, "num_nodes": 2, "device": "cpu"},
                       schedule={"max_steps": 4}, checkpointing={"every_steps": 4})
    raw = yaml.safe_load(path.read_text())
    raw["name"] = "two-nodes"
    return raw, yaml.safe_dump(raw, sort_keys=False)


def _start(folder: Path, rank: int, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           # the launch file calls `torchrun`: the one installed with this Python
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(["bash", str(folder / LAUNCH_FILE), "--quiet", "--json"], cwd=folder, env=env,
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
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return [(p.wait(), *p.communicate()) for p in procs]


@pytest.mark.slow
def test_two_nodes_launched_from_the_exported_files_match_one_process(tmp_path):
    raw, text = _node_config(tmp_path)
    cfg = parse_run_config(raw, base_dir=tmp_path, source="two-nodes")
    files = render_files(cfg, header_lines=["test: two nodes on 127.0.0.1"], num_processes=2, device="cpu",
                         run_config_text=text)
    launch = files[LAUNCH_FILE]
    assert "torchrun --nnodes 2 --node-rank \"$NODE_RANK\" --nproc-per-node 1 --rdzv-backend static" in launch
    assert '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in launch
    accel = yaml.safe_load(files["accelerate.yaml"])
    assert accel["num_machines"] == 2 and accel["distributed_type"] == "MULTI_CPU"
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    write_tree(node0, {"": files}, force=False)
    shutil.copytree(node0, node1)  # the second machine gets its own copy of the folder

    port = _free_port()
    results = _wait_all([_start(node0, 0, port), _start(node1, 1, port)])
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"node {rank} exited {code}: {stderr[-3000:]}"
    summary = json.loads(results[0][1])  # global rank 0 prints the summary
    assert summary["processes"] == 2 and summary["global_batch"] == 4 and summary["global_step"] == 4
    run_dir = node0 / run_dir_name(cfg)
    multi = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    multi_losses = [r["loss"] for r in multi if "loss" in r]
    assert not (node1 / run_dir_name(cfg) / "metrics.jsonl").exists()  # only global rank 0 writes metrics

    one = make_config(tmp_path, "pretrain", name="one.yaml", training={"micro_batch": 2, "grad_accum": 2},
                      schedule={"max_steps": 4}, checkpointing={"every_steps": 4})
    single = run_training(load_run_config(one), tmp_path / "single", quiet=True)
    assert single.summary["global_batch"] == 4
    single_losses = [loss for _, loss in single.losses]
    assert len(multi_losses) == len(single_losses) == 4
    for a, b in zip(multi_losses, single_losses):
        assert abs(a - b) <= 1e-5 * abs(b), (multi_losses, single_losses)
