"""The command that starts a run: `trainfit train` itself, or under a launcher.

One process without a sharding engine runs `trainfit train RUN --out DIR` directly. Several
processes, or FSDP / DeepSpeed (which need an initialised process group even for one process),
run `python -m trainfit train` under a launcher: `accelerate launch --config_file FILE` when an
Accelerate config file is given (CUDA machines), else torchrun with --standalone, as
tests/train/test_distributed.py and docs/training.md do (Accelerate starts several CPU processes
only through mpirun, so CPU runs use torchrun).
"""

from __future__ import annotations

import shlex

from trainfit.export.engine import ENGINES


def _join(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def launch_command(run_config_file: str, *, out_dir: str, num_processes: int, strategy: str,
                   accelerate_file: str | None = None) -> str:
    """The shell command (quoted words) that trains run_config_file into out_dir.

    strategy: the engine (trainfit.export.engine.engine): single, ddp, fsdp or deepspeed.
    """
    if strategy not in ENGINES:
        raise ValueError(f"strategy must be one of {', '.join(ENGINES)}, got {strategy!r}")
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    train = ["train", run_config_file, "--out", out_dir]
    if num_processes == 1 and strategy in ("single", "ddp"):
        return _join(["trainfit", *train])
    if accelerate_file is not None:
        # The process count and the engine come from the config file.
        return _join(["accelerate", "launch", "--config_file", accelerate_file, "-m", "trainfit", *train])
    return _join(["torchrun", "--standalone", "--nproc-per-node", str(num_processes), "-m", "trainfit", *train])
