"""Step time on a real device: trainfit's predict_step vs the median of timed training steps
(torch.cuda.synchronize around each, after warm-up) over the same grid as bench/cuda_memory.py,
less the rows meant to run out of memory. Shares the grid and the step runner
(bench/_cuda_harness.py); how to run it and what it calibrates: bench/README.md.

    python3 bench/cuda_speed.py                  # -> bench/results/cuda_speed.{json,md}
    .venv/bin/python bench/cuda_speed.py --device cpu --quick   # the harness on tiny CPU models
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cuda_harness import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main("speed"))
