"""What else ran on this process's CPUs while it measured something.

A timing taken while other processes (or, in a VM, other guests: "steal") use the same cores
measures the sharing as much as the machine: a 2-core VM measured 87.7 GFLOP/s fp32 with one other
job running where the quiet machine gives 205. The 1-minute load average cannot tell that case
apart: it counts our own threads, lags by a minute, and one competing 2-thread job on 2 cores
(load ~2-4) halves every rate.

So a window is judged by CPU time, read from the kernel's per-CPU counters (/proc/stat through
psutil) on the CPUs this process may run on (its affinity): busy time on those CPUs minus this
process's own CPU time is what others took, and the steal column is what the hypervisor gave to
other guests. Both are averaged over the window's wall time, in cores. `judge` turns a window and
the spread of the repeated fp32 timings into the measurement's load check (profile.MeasurementLoad).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from trainfit.core.machines.profile import MeasurementLoad

# Other work above this share of our cores (its own threads plus steal) makes a timing unreliable:
# with time-sharing every core lost to others is a share of the rate lost. 10 % of the cores is
# above what an idle machine's daemons and kernel threads use and below a noticeable bias.
OTHER_SHARE_LIMIT = 0.10
# Without per-CPU counters (no psutil): the 1-minute load average beyond the cores by this share
# (the rule verify's calibration applies, train.calibration.LOAD_TOLERANCE).
LOAD_LIMIT_PER_CORE = 1.25
# The fp32 matmul timing is repeated this often; 1 - median / best of the repeats above
# SPREAD_LIMIT makes a measurement disturbed even when no other process shows (a VM's slow spells:
# the matmul rate drops by up to a third for seconds).
FP32_REPEATS = 5
SPREAD_LIMIT = 0.30


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float
    own_seconds: float | None  # this process's CPU time (all its threads)
    busy_seconds: float | None  # busy time of our CPUs, every process
    steal_seconds: float | None
    cpus: int
    load_average_1m: float | None


@dataclass(frozen=True)
class LoadWindow:
    """Other work on our CPUs during a window, in cores (averaged over the window's wall time)."""

    seconds: float
    cores: int
    other_cores: float | None  # None: no per-CPU counters on this OS
    steal_cores: float | None
    load_average_1m_before: float | None
    load_average_1m_after: float | None

    @property
    def other_share(self) -> float | None:
        """Cores others took (processes and steal) as a share of our cores."""
        if self.other_cores is None:
            return None
        return (self.other_cores + (self.steal_cores or 0.0)) / max(self.cores, 1)

    @property
    def busy_reason(self) -> str | None:
        """Why a timing taken in this window is not this machine's rate, or None when it is."""
        share = self.other_share
        if share is not None:
            if share <= OTHER_SHARE_LIMIT:
                return None
            steal = (f", the hypervisor {self.steal_cores:.2f} (steal)"
                     if self.steal_cores and self.steal_cores >= 0.05 else "")
            return (f"other processes used {self.other_cores:.2f} of {self.cores} core"
                    f"{'s' if self.cores != 1 else ''}{steal} while it was measured ({share:.0%} of them, "
                    f"limit {OTHER_SHARE_LIMIT:.0%})")
        load = self.load_average_1m_after
        if load is not None and load > LOAD_LIMIT_PER_CORE * self.cores:
            return f"1-min load average {load:.2f} on {self.cores} cores while it was measured"
        return None


def our_cpus() -> list[int] | None:
    """CPU numbers this process may run on (None: no affinity API, i.e. all of them)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def load_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def snapshot() -> CpuSnapshot:
    """The counters now (psutil missing or failing leaves them None)."""
    wall = time.perf_counter()
    cpus = our_cpus()
    try:
        import psutil

        per_cpu = psutil.cpu_times(percpu=True)
        mine = [per_cpu[i] for i in cpus if i < len(per_cpu)] if cpus else list(per_cpu)
        # busy = what /proc/stat counts outside idle, iowait and steal (guest time is inside user)
        busy = sum(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) for t in mine)
        steal = sum(getattr(t, "steal", 0.0) for t in mine)
        own = psutil.Process().cpu_times()
        # children that ended and were waited for (the --benchmark GPU subprocess) count as ours
        own_seconds = own.user + own.system + own.children_user + own.children_system
        count = len(mine)
    except Exception:  # noqa: BLE001 - no psutil, or a platform without per-CPU times
        busy = steal = own_seconds = None
        count = len(cpus) if cpus else (os.cpu_count() or 1)
    return CpuSnapshot(wall, own_seconds, busy, steal, count, load_1m())


def window(start: CpuSnapshot, end: CpuSnapshot | None = None) -> LoadWindow:
    """Other work between two snapshots (`end` defaults to now)."""
    end = end or snapshot()
    wall = max(end.wall - start.wall, 1e-6)
    other = steal = None
    if None not in (start.busy_seconds, end.busy_seconds, start.own_seconds, end.own_seconds):
        # Own threads only run on our CPUs, so busy - own is what others ran there. Counters tick at
        # 1/100 s: clamp the rounding below zero.
        others = (end.busy_seconds - start.busy_seconds) - (end.own_seconds - start.own_seconds)  # type: ignore[operator]
        other = max(0.0, others / wall)
        steal = max(0.0, (end.steal_seconds - start.steal_seconds) / wall)  # type: ignore[operator]
    return LoadWindow(round(wall, 3), end.cpus, None if other is None else round(other, 3),
                      None if steal is None else round(steal, 3), start.load_average_1m, end.load_average_1m)


def sample(seconds: float = 0.5) -> LoadWindow:
    """Other work on our CPUs over the next `seconds` while this process sleeps."""
    start = snapshot()
    time.sleep(seconds)
    return window(start)


def judge(win: LoadWindow | None, fp32_spread: float | None, attempts: int) -> MeasurementLoad:
    """Whether a measurement is this machine's rates: nothing else ran on its cores (`win`) and its
    fp32 repeats agree (`fp32_spread`)."""
    reason = win.busy_reason if win is not None else None
    if reason is None and fp32_spread is not None and fp32_spread > SPREAD_LIMIT:
        reason = (f"its repeated fp32 matmul timings varied by {fp32_spread:.0%} (limit {SPREAD_LIMIT:.0%}): "
                  "the cores were not steadily its own")
    why: dict[str, str] = {}
    if win is None:
        why = {k: "load not watched" for k in ("other_cores", "steal_cores", "load_average_1m_before",
                                                "load_average_1m_after")}
    else:
        for name in ("other_cores", "steal_cores", "load_average_1m_before", "load_average_1m_after"):
            if getattr(win, name) is None:
                why[name] = "not readable on this OS (psutil per-CPU times / os.getloadavg)"
    if fp32_spread is None:
        why["fp32_spread"] = "not measured"
    return MeasurementLoad(
        reliable=reason is None, reason=reason, cores=win.cores if win else 0,
        other_cores=win.other_cores if win else None, steal_cores=win.steal_cores if win else None,
        load_average_1m_before=win.load_average_1m_before if win else None,
        load_average_1m_after=win.load_average_1m_after if win else None,
        fp32_spread=fp32_spread, attempts=attempts, unavailable=why)
