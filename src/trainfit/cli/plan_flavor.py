"""`trainfit plan --flavor ID [--spot]`: plan for a cloud flavor as if renting it.

The flavor's GPUs (type and count) become the hardware, its price the hourly price (the spot
price with --spot), and with --spot its interruption figure (core.cloud.spot) goes into the plan: the
checkpoint cadence, the expected cost including re-done work, and `safety.interruption_hours` in
the exported run config.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainfit.errors import BadInputError

if TYPE_CHECKING:  # names only: the catalog loads with --flavor alone
    from trainfit.core.cloud.catalog import SpotTerms
    from trainfit.core.machines.profile import HardwareProfile


@dataclass(frozen=True)
class FlavorChoice:
    flavor_id: str
    hardware: HardwareProfile
    usd_per_hour: float
    spot: SpotTerms | None  # with --spot


def resolve(args: argparse.Namespace) -> FlavorChoice | None:
    """The --flavor choice, checked against the other flags; None without --flavor."""
    flavor_id, spot = getattr(args, "flavor", None), getattr(args, "spot", False)
    prices = getattr(args, "prices", None)
    if flavor_id is None:
        if spot:
            raise BadInputError("--spot: plans for a cloud flavor's spot price; give --flavor ID too",
                                hint="list the flavors with: trainfit cloud MODEL --examples N --spot")
        if prices is not None:
            raise BadInputError("--prices: prices a cloud flavor; give --flavor ID too")
        return None
    if args.hardware is not None:
        raise BadInputError("--flavor: the flavor sets the hardware; give either --flavor or --hardware, not both")
    if args.usd_per_hour is not None:
        raise BadInputError("--flavor: the flavor sets the price; give either --flavor or --usd-per-hour, not both")
    from trainfit.core.cloud.catalog import load_cloud_catalog
    from trainfit.core.plan.cloud_rank import flavor_hardware

    catalog = load_cloud_catalog(prices)
    flavor = catalog.get(flavor_id)
    if not flavor.usable:
        raise BadInputError(f"--flavor: {flavor.id} is a {flavor.kind} flavor: {flavor.notes or 'not for this code'}")
    hw = dataclasses.replace(flavor_hardware(flavor), source=f"flavor {flavor.id} ({flavor.provider})")
    if not spot:
        return FlavorChoice(flavor.id, hw, flavor.usd_per_hour, None)  # type: ignore[arg-type]
    terms = catalog.spot_terms(flavor)
    if terms is None:
        with_spot = [f.id for f in catalog.flavors if catalog.spot_terms(f) is not None]
        raise BadInputError(f"--spot: {flavor.id} has no spot price in the catalog",
                            hint=f"flavors with one: {', '.join(with_spot)}; or give its spot price in a price file: "
                                 "--prices FILE with columns id,spot_usd_per_hour[,spot_interruption]")
    return FlavorChoice(flavor.id, hw, terms.usd_per_hour, terms)
