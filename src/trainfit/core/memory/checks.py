"""Up-front validation of a setup against a model: every problem, one line each, exit code 2."""

from __future__ import annotations

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup
from trainfit.errors import BadInputError

MAX_MICRO_BATCH = 65536
MAX_SEQ_LEN = 4 * 1024 * 1024
MAX_GPUS = 4096


def check_setup(model: ModelSpec, setup: TrainingSetup) -> None:
    problems: list[str] = []

    def rng(name: str, value: int, low: int, high: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            problems.append(f"{name} must be an integer in [{low}, {high}], got {value!r}")

    rng("--micro-batch", setup.micro_batch, 1, MAX_MICRO_BATCH)
    rng("--seq-len", setup.seq_len, 1, MAX_SEQ_LEN)
    rng("--grad-accum", setup.grad_accum, 1, 1_000_000)
    rng("--gpus", setup.num_gpus, 1, MAX_GPUS)
    rng("--zero", setup.zero_stage, 0, 3)
    rng("--generate", setup.generate_tokens, 0, MAX_SEQ_LEN)
    if setup.zero_stage == 3 and setup.num_gpus == 1 and setup.offload == "none":
        problems.append("--zero 3 with one GPU shards nothing: use --gpus >= 2, or add --offload")
    if setup.offload != "none" and setup.zero_stage == 0:
        problems.append("--offload needs DeepSpeed ZeRO: pass --zero 1, 2 or 3")
    if setup.offload == "optimizer+params" and setup.zero_stage != 3:
        problems.append("--offload optimizer+params needs --zero 3 (parameters are only sharded in stage 3)")
    if setup.zero_stage and setup.device in ("cpu", "mps"):
        problems.append(f"--zero needs GPUs with NCCL/RCCL; device {setup.device!r} does not support it")
    if setup.method == "qlora" and setup.quant == "none":
        problems.append("--method qlora needs --quant nf4, nf4-dq or int8")
    if setup.quant != "none" and setup.method in ("full", "pretrain"):
        problems.append(f"--quant {setup.quant} freezes the base weights: use --method qlora (or lora/dpo/inference)")
    if setup.lora is not None:
        rng("--lora-r", setup.lora.rank, 1, 65536)
        if not 0 <= setup.lora.dropout < 1:
            problems.append(f"lora dropout must be in [0, 1), got {setup.lora.dropout!r}")
    if setup.seq_len + setup.generate_tokens > model.max_position_embeddings and model.position == "learned":
        problems.append(f"--seq-len + --generate ({setup.seq_len + setup.generate_tokens}) exceeds the "
                        f"model's {model.max_position_embeddings} learned positions")
    if problems:
        raise BadInputError("; ".join(problems))
