"""What the probes read, behind small interfaces so tests can substitute recorded machines.

`Sources` bundles every input a probe takes: a filesystem root for /proc and /sys, a command
runner (sysctl, system_profiler), an NVML-like module, an amdsmi-like module, a psutil-like
object, the platform facts and environment, a clock, and the disk micro-benchmark. The live
machine uses `trainfit.hardware.live.live_sources()`; `trainfit.hardware.fakes` builds the same from fixture data.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Fs:
    """Reads files below `root` (default "/"); paths are given as absolute machine paths.

    Errors are the OSError subclasses of the real call (FileNotFoundError, PermissionError) so
    probes can turn them into reasons.
    """

    def __init__(self, root: str = "/"):
        self.root = root

    def _p(self, path: str) -> str:
        return path if self.root == "/" else os.path.join(self.root, path.lstrip("/"))

    def read(self, path: str) -> str:
        with open(self._p(path), encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._p(path)))

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))

    def realpath(self, path: str) -> str:
        real = os.path.realpath(self._p(path))
        if self.root != "/" and real.startswith(os.path.abspath(self.root)):
            real = "/" + os.path.relpath(real, os.path.abspath(self.root))
        return real


class Commands:
    """Runs a command with a timeout; returns (exit code, stdout). Missing tool -> rc 127."""

    def run(self, argv: list[str], timeout_s: float = 2.0) -> tuple[int, str]:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except FileNotFoundError:
            return 127, ""
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{argv[0]} timed out after {timeout_s:g} s") from None
        return done.returncode, done.stdout


@dataclass(frozen=True)
class PlatformFacts:
    system: str  # platform.system()
    release: str
    machine: str  # platform.machine()
    hostname: str
    python_version: str


@dataclass
class Sources:
    fs: Fs
    commands: Commands
    platform: PlatformFacts
    env: dict[str, str]
    cwd: str
    # Return the NVML module (already importable); raise ImportError/OSError when absent.
    nvml: Callable[[], Any]
    # Return the amdsmi module; raise ImportError/OSError when absent.
    amdsmi: Callable[[], Any]
    psutil: Any
    # (path, size_bytes) -> (read_mbps, write_mbps); measured on the real disk when live.
    disk_bench: Callable[[str, int], tuple[float, float]]
    sleep: Callable[[float], None] = time.sleep
    # name of the fixture for profile.source; "live" for the real machine.
    name: str = "live"
    # Torch, only when it is already imported in this process (probing must stay cheap).
    torch: Callable[[], Any] = lambda: sys.modules.get("torch")


def os_error_reason(exc: BaseException) -> str:
    """One short reason for a failed read: 'no permission: /sys/...', 'not present: ...'."""
    if isinstance(exc, PermissionError):
        return f"no permission: {exc.filename or exc}"
    if isinstance(exc, FileNotFoundError):
        return f"not present: {exc.filename or exc}"
    if isinstance(exc, TimeoutError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def read_text(fs: Fs, path: str) -> str | None:
    """File content stripped, or None when it cannot be read (callers that need the reason
    catch OSError themselves)."""
    try:
        return fs.read(path).strip()
    except (OSError, ValueError):
        return None


def read_int(fs: Fs, path: str) -> int | None:
    text = read_text(fs, path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
