"""The memory model: per-device bytes of a training or inference setup, with its parts.

Public: `estimate_memory(model, setup, hardware=None) -> MemoryEstimate` and
`nearest_fitting(model, setup, hardware) -> TrainingSetup | None`.
Pure functions, no I/O; checked against a live-tensor counter in bench/memory_accuracy.py.
"""

from trainfit.core.memory.estimate import estimate_memory
from trainfit.core.memory.fit import describe_changes, nearest_fitting

__all__ = ["estimate_memory", "nearest_fitting", "describe_changes"]
