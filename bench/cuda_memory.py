"""Memory on a real device: trainfit's prediction vs max_memory_allocated / max_memory_reserved /
NVML used memory of real training steps over a grid (architectures x full / LoRA / QLoRA x
precision x micro-batch x sequence x checkpointing x optimizer, plus 1-GPU ZeRO-3 and FSDP
offload), each row in a fresh process; a real CUDA OOM is recorded and compared with the
prediction's fit verdict. Shares the grid and the step runner with bench/cuda_speed.py
(bench/_cuda_harness.py). How to run it on a GPU and what it calibrates: bench/README.md.

    python3 bench/cuda_memory.py                 # the CUDA grid -> bench/results/cuda_memory.{json,md}
    python3 bench/cuda_memory.py --quick         # a few rows
    .venv/bin/python bench/cuda_memory.py --device cpu   # tiny models, live-tensor counter (tests)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cuda_harness import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main("memory"))
