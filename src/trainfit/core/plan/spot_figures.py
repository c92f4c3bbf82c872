"""A planned mode's figures on a spot instance (`trainfit plan --flavor ID --spot`): the spot
estimate of its run (core.cloud.spot), the expected rental with re-done work, and the lines that explain
them."""

from __future__ import annotations

import math

from trainfit.core.run.checkpoint_cadence import ASSUMED_WRITE_BYTES_PER_SECOND
from trainfit.core.cloud.catalog import SpotTerms
from trainfit.core.plan.results import RunFigures
from trainfit.core.run.safety_thresholds import safety_thresholds
from trainfit.core.cloud.spot import checkpoint_bytes_for, estimate_spot, hours_text

# A restart on a new instance repeats the job's setup (boot, image pull, dependency install,
# weight download): the same 10 minutes `trainfit cloud` bills once per run (core.plan.cloud_rank,
# from seed 004's ~10-15 minute quick demo), plus reading the checkpoint back.
RESTART_SETUP_SECONDS = 600.0


def plan_figures(terms: SpotTerms, mode: str, setup, memory, run: RunFigures, budget_usd: float | None = None
                 ) -> tuple[RunFigures, list[str], list[str]]:
    """A planned mode's RunFigures with the spot estimate and the expected rental including
    re-done work (`trainfit plan --flavor ID --spot`), plus its reason and warning lines.
    mode: the plan mode, whose safety thresholds the exported run config names; run: replaced with
    the spot figures."""
    import dataclasses

    work = (run.hours or 0.0) * 3600.0
    est = estimate_spot(work_seconds=work, checkpoint_size_bytes=checkpoint_bytes_for(setup, memory),
                        setup_seconds=RESTART_SETUP_SECONDS, figure=terms.interruption,
                        thresholds=safety_thresholds(mode), assumed=terms.assumed)
    f = terms.interruption
    assumed = f" (assumed: measured on {f.provider})" if terms.assumed else ""
    reasons = [f"spot: {hours_text(f.mean_hours)} between interruptions{assumed} [{f.basis}; {f.source}, {f.as_of}]; "
               f"checkpoint every {est.checkpoint_interval_seconds / 60:.1f} min of training "
               f"({est.checkpoint_seconds:.0f} s each, estimated at "
               f"{ASSUMED_WRITE_BYTES_PER_SECOND / 1e6:.0f} MB/s; the trainer re-times it), restart "
               f"{est.restart_seconds / 60:.0f} min"]
    if run.hours is None:
        return dataclasses.replace(run, spot=est), reasons, []
    expected = est.expected_hours * terms.usd_per_hour if math.isfinite(est.expected_hours) else math.inf
    reasons.append(f"spot: expected {est.expected_interruptions:.1f} interruptions, {est.expected_hours:.2f} h billed "
                   f"(+{est.expected_overhead_share:.0%} for checkpoints, re-done work and restarts)")
    warnings = []
    if budget_usd is not None and math.isfinite(expected) and (run.rental_usd or 0) <= budget_usd < expected:
        warnings.append(f"spot: the expected cost incl. re-done work ${expected:.2f} is over the ${budget_usd:g} "
                        f"budget (uninterrupted ${run.rental_usd:.2f})")
    if not math.isfinite(expected):
        warnings.append(f"spot: {hours_text(f.mean_hours)} between interruptions is too short for this run's "
                        "checkpoint interval and restarts: it would practically never finish; rent on-demand")
    return dataclasses.replace(run, spot=est, rental_expected_usd=expected), reasons, warnings
