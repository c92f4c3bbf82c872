"""Spot / preemptible machines: how often they are interrupted, and what a run costs on them.

Interruption figures (data/cloud.yaml, `interruptions:`) are published or measured numbers turned
into one quantity, M, the mean running time between interruptions, by one of two conversions:

* a count: `events` interruptions seen in `running_hours` of running time (a preemption trace)
  -> M = running_hours / events, the maximum-likelihood estimate of a Poisson process's mean;
* a share: `share` of the instances interrupted at least once within `window_hours` (AWS Spot
  Instance Advisor bands are per trailing month) -> with a Poisson process of rate 1/M an
  instance running the whole window is interrupted with probability 1 - exp(-W/M), so
  M = W / -ln(1 - share). This reads the band as if every instance ran the whole window; one
  that counted shorter-lived instances would mean a shorter M, so a share-based M is optimistic.

Expected run on a spot machine (`expected_spot_run`): W seconds of training are cut into
segments of tau seconds of work, each ended by a checkpoint of C seconds; an interruption loses
the segment in progress (on average about half an interval of work, plus any partial
checkpoint) and costs a restart of R seconds (a new instance: boot, image, dependencies and
weight download -- the job's setup time -- plus reading the checkpoint back). With interruptions
a Poisson process of mean M over the billed running time, restarts included, one segment of
s = tau + C seconds takes in expectation (Daly 2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps", the exact value for this model):

    E[s] = M * exp(R / M) * (exp(s / M) - 1)

Derivation, with restarts first taken as uninterruptible: an attempt succeeds with probability
p = exp(-s/M); the number of failed attempts is geometric with mean (1 - p) / p = exp(s/M) - 1;
a failed attempt costs E[X | X < s] + R with E[X | X < s] = M - s p / (1 - p); the successful
one costs s. Summing, E = s + (exp(s/M) - 1)(M + R) - s = (M + R)(exp(s/M) - 1). Letting the
restart itself be interrupted (it is billed running time too) turns M + R into M exp(R/M)
(Daly's eq.); the two agree to first order in R/M. Expanding exp to second order gives the
first-order rule E ~ s + (s/M)(s/2 + R): the checkpoint, half a segment re-done and one restart
per interruption, s/M interruptions per segment -- the picture the estimate is built on.

The run is floor(W / tau) full segments plus one of the remaining work; the expected number of
interruptions is E[T] / M (Wald's identity for a Poisson process). Waiting for capacity after an
interruption is not billed: it only lengthens the wall-clock time (`capacity_wait_minutes` of the
figure, where the source measured it). Pure functions; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainfit.core.run.checkpoint_cadence import (ASSUMED_WRITE_BYTES_PER_SECOND, cadence_interval, checkpoint_bytes,
                                              checkpoint_seconds, combined_interruption_seconds)
from trainfit.core.run.safety_thresholds import SafetyThresholds

# A checkpoint is read back at the speed it is assumed to be written (core.run.checkpoint_cadence:
# a 7200-rpm disk's sequential speed; cloud NVMe is faster, so restarts err long).
ASSUMED_READ_BYTES_PER_SECOND = ASSUMED_WRITE_BYTES_PER_SECOND
# exp() of more than this overflows a float: such a segment practically never completes.
_MAX_EXPONENT = 700.0


@dataclass(frozen=True)
class InterruptionFigure:
    """A spot interruption figure with the conversion that gives its mean time between
    interruptions (module docstring)."""

    id: str
    mean_hours: float  # mean running time between interruptions
    basis: str  # the published figure and the conversion, in one line
    source: str  # URL
    as_of: str
    provider: str = ""  # where it was measured or published
    capacity_wait_minutes: float | None = None  # mean unbilled wait for a new instance, where measured
    notes: str = ""


def hours_text(hours: float) -> str:
    """2.13 h, 14.5 h, 6,834 h: three significant figures without an exponent."""
    return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.3g} h"


def mean_hours_from_events(events: float, running_hours: float) -> float:
    """Interruptions counted over running time -> mean hours between them."""
    if events <= 0 or running_hours <= 0:
        raise ValueError("events and running_hours must be positive")
    return running_hours / events


def mean_hours_from_share(share: float, window_hours: float) -> float:
    """A share of instances interrupted within a window -> mean hours between interruptions."""
    if not 0 < share < 1 or window_hours <= 0:
        raise ValueError("share must be in (0, 1) and window_hours positive")
    return window_hours / -math.log1p(-share)


@dataclass(frozen=True)
class SpotRun:
    """The expected cost in time of W seconds of training on an interruptible machine."""

    work_seconds: float
    interval_seconds: float
    checkpoint_seconds: float
    restart_seconds: float
    interruption_seconds: float
    expected_seconds: float  # billed: work + checkpoints + re-done work + restarts (inf: never finishes)
    expected_interruptions: float
    checkpoints: int
    overhead_share: float  # expected_seconds / work_seconds - 1


def _segment_seconds(s: float, restart: float, mean: float) -> float:
    if not math.isfinite(mean):
        return s
    if (s + restart) / mean > _MAX_EXPONENT:
        return math.inf
    return mean * math.exp(restart / mean) * math.expm1(s / mean)


def expected_spot_run(work_seconds: float, interval_seconds: float, checkpoint_seconds: float,
                      restart_seconds: float, interruption_seconds: float) -> SpotRun:
    """Expected billed running time of `work_seconds` of training that checkpoints every
    `interval_seconds` of work (module docstring: Daly's exact value for Poisson interruptions)."""
    if work_seconds < 0 or interval_seconds <= 0 or checkpoint_seconds < 0 or restart_seconds < 0 \
            or interruption_seconds <= 0:
        raise ValueError("work, checkpoint and restart must be >= 0; interval and interruption > 0")
    full = int(work_seconds // interval_seconds)
    rest = work_seconds - full * interval_seconds
    total = full * _segment_seconds(interval_seconds + checkpoint_seconds, restart_seconds, interruption_seconds)
    segments = full
    if rest > 1e-9 or full == 0:
        total += _segment_seconds(rest + checkpoint_seconds, restart_seconds, interruption_seconds)
        segments += 1
    interruptions = total / interruption_seconds if math.isfinite(interruption_seconds) else 0.0
    overhead = total / work_seconds - 1 if work_seconds > 0 else 0.0
    return SpotRun(work_seconds, interval_seconds, checkpoint_seconds, restart_seconds, interruption_seconds,
                   total, interruptions, segments, overhead)


@dataclass(frozen=True)
class SpotEstimate:
    """What a ranking or a plan reports for one run on a spot machine (JSON-ready)."""

    interruption_id: str
    interruption_hours: float  # M of the machine (the spot figure alone)
    interruption_basis: str
    interruption_source: str
    interruption_as_of: str
    assumed: bool  # the figure was measured on another provider or machine
    checkpoint_seconds: float  # estimated cost of one checkpoint
    checkpoint_interval_seconds: float  # work between checkpoints (the trainer's rule, spot figure included)
    cadence_limited_by: str
    cadence_interruption_hours: float  # M the cadence rule used: the mode's risk and the spot figure combined
    restart_seconds: float  # billed per interruption: setup (boot, image, weights) + checkpoint read
    uninterrupted_hours: float  # training alone, no interruption
    expected_hours: float  # billed: training + checkpoints + re-done work + restarts
    expected_interruptions: float
    expected_overhead_share: float  # expected_hours / uninterrupted_hours - 1
    expected_wait_hours: float | None  # unbilled capacity waits (where the figure measured them)


def estimate_spot(*, work_seconds: float, checkpoint_size_bytes: int, setup_seconds: float,
                  figure: InterruptionFigure, thresholds: SafetyThresholds, assumed: bool) -> SpotEstimate:
    """Checkpoint cadence and expected time of a run of `work_seconds` on a spot machine."""
    cost = checkpoint_seconds(checkpoint_size_bytes)
    spot_mean = figure.mean_hours * 3600.0
    cadence_mean = combined_interruption_seconds(thresholds.interruption_seconds, spot_mean)
    cadence = cadence_interval(cost, cadence_mean, thresholds)
    restart = setup_seconds + checkpoint_size_bytes / ASSUMED_READ_BYTES_PER_SECOND
    run = expected_spot_run(work_seconds, cadence.interval_seconds, cost, restart, spot_mean)
    wait = (run.expected_interruptions * figure.capacity_wait_minutes / 60.0
            if figure.capacity_wait_minutes is not None and math.isfinite(run.expected_seconds) else None)
    return SpotEstimate(
        interruption_id=figure.id, interruption_hours=figure.mean_hours, interruption_basis=figure.basis,
        interruption_source=figure.source, interruption_as_of=figure.as_of, assumed=assumed,
        checkpoint_seconds=cost, checkpoint_interval_seconds=cadence.interval_seconds,
        cadence_limited_by=cadence.limited_by, cadence_interruption_hours=cadence_mean / 3600.0,
        restart_seconds=restart, uninterrupted_hours=work_seconds / 3600.0,
        expected_hours=run.expected_seconds / 3600.0, expected_interruptions=run.expected_interruptions,
        expected_overhead_share=run.overhead_share, expected_wait_hours=wait,
    )  # fmt: skip


# Precisions whose saved weights are fp32: mixed precision keeps fp32 master weights (what the
# Trainer saves), fp32 is fp32; pure 16-bit training saves 16-bit weights.
_FP32_WEIGHT_PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")


def checkpoint_bytes_for(setup, memory) -> int:
    """Bytes one checkpoint of this TrainingSetup writes, from its MemoryEstimate's parameter
    counts (LoRA / QLoRA save the adapter, kept in fp32 by PEFT)."""
    adapter = setup.lora is not None
    width = 4 if adapter or setup.precision in _FP32_WEIGHT_PRECISIONS else 2
    return checkpoint_bytes(memory.params_total, memory.params_trainable, adapter_only=adapter, bytes_per_weight=width)
