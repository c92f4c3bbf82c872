"""A live tensor-bytes counter for CPU runs: the CPU twin of torch.cuda.max_memory_allocated.

CPU has no caching allocator with statistics, so peak RSS mixes tensors with the Python heap,
the libraries and the allocator's free lists. The memory model's `tensor_peak_bytes` only
counts tensors, so verification needs a counter of live tensor storage bytes. This is the
approach DESIGN names: a `TorchDispatchMode` that sees every tensor an op creates, counts each
storage once (keyed by its data pointer) and uncounts it when the storage object is freed
(a weakref callback; storages keep one Python object for their lifetime, which is what
`torch.distributed._tools.mem_tracker` relies on too).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any


class TensorBytesCounter:
    """Counts live tensor storage bytes on CPU; `peak_bytes` is the high-water mark.

    Use `track_existing(tensors)` for tensors created before the counter was entered (model
    parameters, buffers), then run the training steps inside `with counter:`.
    """

    def __init__(self) -> None:
        self.current_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}  # storage data_ptr -> bytes
        self._refs: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._mode = None

    # -- bookkeeping ---------------------------------------------------------------------
    def _add_storage(self, storage: Any) -> None:
        try:
            ptr = storage.data_ptr()
            size = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # meta / sparse / functional wrappers
            return
        if ptr == 0 or size == 0:
            return
        with self._lock:
            if ptr in self._live:
                return
            self._live[ptr] = size
            self.current_bytes += size
            if self.current_bytes > self.peak_bytes:
                self.peak_bytes = self.current_bytes
        try:
            self._refs[ptr] = weakref.ref(storage, lambda _r, p=ptr: self._release(p))
        except TypeError:  # storage type without weakref support: counted, never released
            pass

    def _release(self, ptr: int) -> None:
        with self._lock:
            size = self._live.pop(ptr, 0)
            self._refs.pop(ptr, None)
            self.current_bytes -= size

    def track_tensor(self, value: Any) -> None:
        import torch

        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.layout == torch.strided:
            self._add_storage(value.untyped_storage())

    def track_existing(self, tensors: Any) -> None:
        """Count tensors that already exist (parameters, buffers, optimizer state)."""
        for t in tensors:
            self.track_tensor(t)

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_bytes = self.current_bytes

    # -- context manager -----------------------------------------------------------------
    def __enter__(self) -> "TensorBytesCounter":
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for leaf in tree_leaves(out):
                    counter.track_tensor(leaf)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
