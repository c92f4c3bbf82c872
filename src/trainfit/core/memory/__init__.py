"""The memory model: per-device bytes of a training or inference setup, with its parts.

Public: `estimate_memory(model, setup, hardware=None) -> MemoryEstimate`. The nearest setting
that fits is a policy of the planner's search engine (trainfit.core.plan.nearest).
Pure functions, no I/O; checked against a live-tensor counter in bench/memory_accuracy.py.
"""

from trainfit.core.memory.estimate import estimate_memory

__all__ = ["estimate_memory"]
