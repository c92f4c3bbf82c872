"""Time-bounded probe runner: every probe gets a deadline, none can hang the profile.

Probes run in daemon threads, all started at once (they mostly wait on the kernel, the NVML
driver or a subprocess, so they overlap well even on 2 cores). A probe still running at its
deadline is abandoned: its thread is a daemon, so it cannot keep the process alive, and its
result is replaced by the caller's fallback with the reason "timed out after X s". ctypes
releases the GIL during foreign calls, so a hung NVML call does not freeze the other threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProbeResult:
    name: str
    value: Any  # None when the probe failed or timed out
    seconds: float
    error: str | None  # "timed out after 2 s", "RuntimeError: ..."


def run_probes(
    probes: dict[str, Callable[[], Any]], timeout_s: dict[str, float] | float
) -> dict[str, ProbeResult]:
    """Run all probes concurrently; return each one's value, or its error, within its deadline."""
    results: dict[str, ProbeResult] = {}
    lock = threading.Lock()
    started = time.perf_counter()

    def _target(name: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            value, error = fn(), None
        except BaseException as exc:  # a probe bug must become a reason, not a crash
            value, error = None, f"{type(exc).__name__}: {exc}"
        with lock:
            results.setdefault(name, ProbeResult(name, value, time.perf_counter() - t0, error))

    threads = {}
    for name, fn in probes.items():
        thread = threading.Thread(target=_target, args=(name, fn), name=f"probe-{name}", daemon=True)
        thread.start()
        threads[name] = thread
    for name, thread in threads.items():
        limit = timeout_s[name] if isinstance(timeout_s, dict) else timeout_s
        remaining = limit - (time.perf_counter() - started)
        thread.join(max(0.0, remaining))
        with lock:
            if name not in results:
                results[name] = ProbeResult(name, None, limit, f"timed out after {limit:g} s")
    return results
