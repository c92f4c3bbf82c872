"""The command that starts a run: `trainfit train` itself, or under a launcher.

One process without a sharding engine runs `trainfit train RUN --out DIR` directly. Several
processes, or FSDP / DeepSpeed (which need an initialised process group even for one process),
run `python -m trainfit train` under a launcher: `accelerate launch --config_file FILE` when an
Accelerate config file is given (CUDA machines), else torchrun with --standalone, as
tests/train/test_distributed.py and docs/training.md do (Accelerate starts several CPU processes
only through mpirun, so CPU runs use torchrun).

Several nodes: ONE launch.sh serves every node. It reads the node's rank and the rendezvous
address from the environment and refuses to start without them (NODE_PREAMBLE):
    NODE_RANK     0 on the first node, 1 .. N-1 on the others
    MASTER_ADDR   the address of node 0, reachable from every node (required)
    MASTER_PORT   a free TCP port on node 0 (default 29500)
    TRAINFIT_CHECKPOINT_DIR  a directory every node mounts (shared storage, required): the run
                  directory - checkpoints, metrics - is $TRAINFIT_CHECKPOINT_DIR/runs/<name>, so a
                  relaunch with --resume finds the same checkpoint on every node (trainfit train
                  refuses a node-local one, trainfit.config.shared_storage)
and sets the network's variables (trainfit.core.run.cluster_env) where the node has not set them:
NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to the default route's interface, the fabric's NCCL / EFA settings;
and starts `torchrun --nnodes N --node-rank $NODE_RANK --nproc-per-node G --rdzv-backend static
--rdzv-endpoint $MASTER_ADDR:$MASTER_PORT` (CPU), or `accelerate launch` with the multi-node
accelerate.yaml and `--machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port
$MASTER_PORT`, which take precedence over the file's values (CUDA). One file for all nodes, not one
per node: the nodes get the same folder (copied, or on a shared filesystem) and differ only in
NODE_RANK, so nothing can drift between per-node copies.

Why the static rendezvous and not c10d: torchrun ignores --node-rank under c10d ("node_rank is
only used for static rdzv_backend", torch/distributed/run.py) and numbers the nodes by sorting
host name and process id (DynamicRendezvousHandler), so global rank 0 - the process that writes
the run directory, metrics.jsonl and the checkpoints (trainfit.train.runner) - could land on any
node. With the static rendezvous NODE_RANK=0 is rank 0, on the machine at MASTER_ADDR.
"""

from __future__ import annotations

import shlex

from trainfit.core.run.cluster_env import DEFAULT_MASTER_PORT, fabric_exports
from trainfit.export.engine import ENGINES


def _join(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


CHECKPOINT_DIR_ENV = "TRAINFIT_CHECKPOINT_DIR"
SHARED_RUN_DIR = f'"${CHECKPOINT_DIR_ENV}"/'  # shell words: the run directory under the shared directory


def node_preamble(num_nodes: int, network=None) -> str:
    """Shell lines that check NODE_RANK / MASTER_ADDR / MASTER_PORT (see the module docstring)."""
    last = num_nodes - 1
    return f"""if [ -z "${{MASTER_ADDR:-}}" ]; then
  echo "launch.sh: set MASTER_ADDR to the address of node 0, reachable from every node (e.g. MASTER_ADDR=10.0.0.1 NODE_RANK=0 ./launch.sh)" >&2
  exit 2
fi
case "${{NODE_RANK:-}}" in
  ''|*[!0-9]*) echo "launch.sh: set NODE_RANK to this node's rank: 0 on node 0 (MASTER_ADDR), {"1" if last == 1 else f"1..{last}"} on the others; got '${{NODE_RANK:-}}'" >&2; exit 2 ;;
esac
if [ "$NODE_RANK" -gt {last} ]; then
  echo "launch.sh: NODE_RANK must be 0..{last} ({num_nodes} nodes), got $NODE_RANK" >&2
  exit 2
fi
MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"
case "${{{CHECKPOINT_DIR_ENV}:-}}" in
  /*) ;;
  *) echo "launch.sh: set {CHECKPOINT_DIR_ENV} to an absolute directory every node mounts (shared storage: the checkpoints a --resume reads on every node); got '${{{CHECKPOINT_DIR_ENV}:-}}'" >&2; exit 2 ;;
esac
# The interface the nodes reach each other over: the default route's, unless set (cluster_env).
ROUTE_IF="$(ip -o route show default 2>/dev/null | awk '{{for (i = 1; i < NF; i++) if ($i == "dev") {{print $(i + 1); exit}}}}' || true)"
if [ -n "$ROUTE_IF" ]; then
  export NCCL_SOCKET_IFNAME="${{NCCL_SOCKET_IFNAME:-$ROUTE_IF}}" GLOO_SOCKET_IFNAME="${{GLOO_SOCKET_IFNAME:-$ROUTE_IF}}"
fi
{fabric_exports(network)}"""


def launch_command(run_config_file: str, *, out_dir: str, num_processes: int, strategy: str,
                   accelerate_file: str | None = None, num_nodes: int = 1) -> str:
    """The shell command (quoted words) that trains run_config_file into out_dir.

    strategy: the engine (trainfit.export.engine.engine): single, ddp, fsdp or deepspeed.
    num_processes: every node's processes together; num_nodes > 1: the per-node command that
    reads $NODE_RANK, $MASTER_ADDR and $MASTER_PORT (checked by node_preamble).
    """
    if strategy not in ENGINES:
        raise ValueError(f"strategy must be one of {', '.join(ENGINES)}, got {strategy!r}")
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if num_nodes < 1 or num_processes % num_nodes:
        raise ValueError(f"{num_processes} processes do not split evenly over {num_nodes} node(s)")
    train = ["train", run_config_file, "--out", out_dir]
    if num_nodes > 1:
        # the run directory lives on the shared directory every node mounts (node_preamble checks it)
        train = ["train", run_config_file, "--out"]
        suffix = " " + SHARED_RUN_DIR + shlex.quote(out_dir)
        env = '--node-rank "$NODE_RANK"'
        if accelerate_file is not None:
            # The file holds num_machines / num_processes; the flags name this node and node 0.
            return (_join(["accelerate", "launch", "--config_file", accelerate_file])
                    + ' --machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT" '
                    + _join(["-m", "trainfit", *train]) + suffix)
        return (_join(["torchrun", "--nnodes", str(num_nodes)]) + f" {env} "
                + _join(["--nproc-per-node", str(num_processes // num_nodes), "--rdzv-backend", "static"])
                + ' --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" ' + _join(["-m", "trainfit", *train]) + suffix)
    if num_processes == 1 and strategy in ("single", "ddp"):
        return _join(["trainfit", *train])
    if accelerate_file is not None:
        # The process count and the engine come from the config file.
        return _join(["accelerate", "launch", "--config_file", accelerate_file, "-m", "trainfit", *train])
    return _join(["torchrun", "--standalone", "--nproc-per-node", str(num_processes), "-m", "trainfit", *train])
