"""Cloud catalog: rentable machines (flavors / instance types), their GPUs and prices.

The shipped list lives in `data/cloud.yaml` (each price with its source and date). A user file
given with `--prices FILE` overrides entries with the same id and adds new ones:
    YAML: {flavors: [{id: ..., provider: ..., ...}, ...]}   (or a bare list of flavors)
    CSV:  a header row with the column names below, one flavor per row.
Columns / keys: id, provider, kind, gpu, gpu_count, usd_per_hour (required for a new flavor);
vcpus, ram_gib, spot_usd_per_hour, spot_interruption, spot_interruption_hours, source, as_of, notes
(optional). An override of a shipped id may give only the columns it changes (usually usd_per_hour).

Spot interruption figures (core.cloud.spot.InterruptionFigure) are the shipped file's `interruptions:`
table: each entry is a count (events over running_hours) or a share (of instances interrupted
within window_hours), with its source and date. A flavor's spot price goes with the figure it
names in spot_interruption (default: default_spot_interruption); a user's spot_interruption_hours
(mean hours between interruptions, e.g. from their own logs) wins over both.
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Literal

from trainfit import yaml_io
from trainfit.core.cloud.spot import InterruptionFigure, mean_hours_from_events, mean_hours_from_share
from trainfit.errors import BadInputError, close_matches, short_repr

FlavorKind = Literal["gpu", "cpu", "tpu"]
KINDS = ("gpu", "cpu", "tpu")
REQUIRED = ("id", "provider", "kind", "gpu", "gpu_count", "usd_per_hour")
OPTIONAL = ("vcpus", "ram_gib", "spot_usd_per_hour", "spot_interruption", "spot_interruption_hours", "source",
            "as_of", "notes")
COLUMNS = REQUIRED + OPTIONAL
_NUMERIC = {"gpu_count": int, "vcpus": int, "ram_gib": float, "usd_per_hour": float, "spot_usd_per_hour": float,
            "spot_interruption_hours": float}
# Mean hours between interruptions a user may give (trainfit.validate.BOUNDS["interruption_hours"]).
_INTERRUPTION_HOURS_RANGE = (0.01, 1e6)


@dataclass(frozen=True)
class Flavor:
    id: str
    provider: str
    kind: FlavorKind
    gpu: str | None  # GPU catalog id
    gpu_count: int
    vcpus: int | None
    ram_gib: float | None
    usd_per_hour: float | None  # None only for flavors trainfit cannot use (TPU)
    spot_usd_per_hour: float | None
    source: str  # URL
    as_of: str
    notes: str = ""
    spot_interruption: str | None = None  # id in CloudCatalog.interruptions
    spot_interruption_hours: float | None = None  # the user's own figure (wins over spot_interruption)

    @property
    def usable(self) -> bool:
        """Whether trainfit's PyTorch code can train on it."""
        return self.kind != "tpu"


@dataclass(frozen=True)
class SpotTerms:
    """A flavor's spot price and the interruption figure that goes with it."""

    usd_per_hour: float
    interruption: InterruptionFigure
    assumed: bool  # the figure was measured on another provider (none published for this one)


@dataclass(frozen=True)
class CloudCatalog:
    flavors: list[Flavor]
    # Shipped flavors left out, id -> reason (e.g. their GPU is not in the GPU catalog yet).
    skipped: dict[str, str]
    interruptions: dict[str, InterruptionFigure] = field(default_factory=dict)
    default_interruption: str | None = None

    def spot_terms(self, flavor: Flavor) -> SpotTerms | None:
        """The flavor's spot price with its interruption figure; None without a spot price."""
        if flavor.spot_usd_per_hour is None:
            return None
        if flavor.spot_interruption_hours is not None:
            h = flavor.spot_interruption_hours
            figure = InterruptionFigure(f"{flavor.id}:given", h, f"given: {h:g} h between interruptions (--prices)",
                                        "your --prices file", "")
            return SpotTerms(flavor.spot_usd_per_hour, figure, assumed=False)
        key = flavor.spot_interruption or self.default_interruption
        if key is None or key not in self.interruptions:
            return None
        figure = self.interruptions[key]
        return SpotTerms(flavor.spot_usd_per_hour, figure, assumed=figure.provider != flavor.provider)

    def get(self, flavor_id: str) -> Flavor:
        for f in self.flavors:
            if f.id.lower() == flavor_id.lower():
                return f
        ids = [f.id for f in self.flavors]
        near = close_matches(flavor_id, ids, n=4)
        hint = f"did you mean: {', '.join(near)}?" if near else f"valid: {', '.join(ids)}"
        raise BadInputError(f"--flavor: unknown cloud flavor '{flavor_id}'", hint=hint)


def _gpu_ids() -> set[str]:
    from trainfit.core.machines.gpu_catalog import all_gpus

    return {g.id for g in all_gpus()}


# Prices, counts and memory sizes of a flavor are all far below this.
_MAX_COLUMN_VALUE = 1e9


def _coerce(row: dict, where: str, sources: dict[str, str]) -> dict:
    """Check keys and types of one flavor record; returns the cleaned fields given."""
    unknown = [k for k in row if k not in COLUMNS]
    if unknown:
        raise BadInputError(
            f"{where}: unknown column '{unknown[0]}'", hint=f"valid columns: {', '.join(COLUMNS)}"
        )
    out: dict = {}
    for key, value in row.items():
        if value is None or (isinstance(value, str) and value.strip() == ""):
            out[key] = None
            continue
        if key in _NUMERIC:
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise BadInputError(f"{where}: column '{key}' must be a number, got {short_repr(value)}") from None
            if not 0 <= number <= _MAX_COLUMN_VALUE:  # NaN fails this too
                raise BadInputError(f"{where}: column '{key}' must be a number from 0 to {_MAX_COLUMN_VALUE:.0e}, "
                                    f"got {short_repr(value)}")
            low, high = _INTERRUPTION_HOURS_RANGE
            if key == "spot_interruption_hours" and not low <= number <= high:
                raise BadInputError(f"{where}: column '{key}' must be mean hours between interruptions from "
                                    f"{low:g} to {high:.0e}, got {short_repr(value)}")
            if _NUMERIC[key] is int:
                if number != int(number):
                    raise BadInputError(f"{where}: column '{key}' must be a whole number, got {short_repr(value)}")
                number = int(number)
            out[key] = number
        elif key == "kind":
            if value not in KINDS:
                raise BadInputError(f"{where}: kind {short_repr(value)} is not one of {', '.join(KINDS)}")
            out[key] = value
        elif key == "source":
            out[key] = sources.get(str(value), str(value))
        else:
            out[key] = str(value)
    return out


def _build(fields: dict, where: str) -> Flavor:
    missing = [k for k in REQUIRED if k not in fields or (fields[k] is None and k != "gpu")]
    kind = fields.get("kind")
    if kind == "tpu":
        missing = [k for k in missing if k not in ("usd_per_hour", "gpu")]
    if kind == "cpu":
        missing = [k for k in missing if k != "gpu"]
    if missing:
        raise BadInputError(f"{where}: missing column '{missing[0]}'", hint=f"required columns: {', '.join(REQUIRED)}")
    if kind == "gpu" and not fields.get("gpu"):
        raise BadInputError(f"{where}: a gpu flavor needs column 'gpu' (a GPU catalog id, see: trainfit gpus)")
    if kind == "gpu" and fields["gpu_count"] < 1:
        raise BadInputError(f"{where}: gpu_count must be at least 1 for a gpu flavor")
    return Flavor(
        id=fields["id"],
        provider=fields["provider"],
        kind=kind,  # type: ignore[arg-type]
        gpu=fields.get("gpu"),
        gpu_count=int(fields["gpu_count"]),
        vcpus=fields.get("vcpus"),
        ram_gib=fields.get("ram_gib"),
        usd_per_hour=fields.get("usd_per_hour"),
        spot_usd_per_hour=fields.get("spot_usd_per_hour"),
        source=fields.get("source") or "",
        as_of=fields.get("as_of") or "",
        notes=fields.get("notes") or "",
        spot_interruption=fields.get("spot_interruption"),
        spot_interruption_hours=fields.get("spot_interruption_hours"),
    )


def parse_flavors(records: list, origin: str, sources: dict[str, str] | None = None) -> list[dict]:
    """Validate flavor records (dicts); returns their cleaned fields (not yet merged)."""
    if not isinstance(records, list):
        raise BadInputError(f"{origin}: expected a list of flavors")
    cleaned = []
    for i, rec in enumerate(records):
        where = f"{origin}: flavor {i + 1}"
        if not isinstance(rec, dict):
            raise BadInputError(f"{where}: expected a mapping of column -> value")
        fields = _coerce(rec, where, sources or {})
        if not fields.get("id"):
            raise BadInputError(f"{where}: missing column 'id'", hint=f"required columns: {', '.join(REQUIRED)}")
        cleaned.append(fields)
    return cleaned


# Keys of an `interruptions:` entry: a count (events, running_hours) or a share (share, window_hours).
INTERRUPTION_KEYS = ("provider", "events", "running_hours", "share", "window_hours", "capacity_wait_minutes",
                     "source", "as_of", "notes")


def _positive(rec: dict, key: str, where: str) -> float:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < _MAX_COLUMN_VALUE:
        raise BadInputError(f"{where}: '{key}' must be a positive number, got {short_repr(value)}")
    return float(value)


def parse_interruptions(records: object, origin: str, sources: dict[str, str]) -> dict[str, InterruptionFigure]:
    """Validate the `interruptions:` table (id -> entry) into figures with their conversion."""
    if not isinstance(records, dict):
        raise BadInputError(f"{origin}: interruptions must be a mapping of id -> figure")
    out = {}
    for key, rec in records.items():
        where = f"{origin}: interruption {key}"
        if not isinstance(rec, dict):
            raise BadInputError(f"{where}: expected a mapping")
        unknown = [k for k in rec if k not in INTERRUPTION_KEYS]
        if unknown:
            raise BadInputError(f"{where}: unknown key '{unknown[0]}'",
                                hint=f"valid keys: {', '.join(INTERRUPTION_KEYS)}")
        count, share = "events" in rec or "running_hours" in rec, "share" in rec or "window_hours" in rec
        if count == share:
            raise BadInputError(f"{where}: give either events + running_hours or share + window_hours")
        if not rec.get("source") or not rec.get("as_of") or not rec.get("provider"):
            raise BadInputError(f"{where}: every figure needs provider, source and as_of")
        if count:
            events, hours = _positive(rec, "events", where), _positive(rec, "running_hours", where)
            mean = mean_hours_from_events(events, hours)
            basis = f"{events:g} interruptions in {hours:g} running hours: M = {hours:g} / {events:g} = {mean:.3g} h"
        else:
            fraction, window = _positive(rec, "share", where), _positive(rec, "window_hours", where)
            if fraction >= 1:
                raise BadInputError(f"{where}: 'share' must be below 1, got {short_repr(fraction)}")
            mean = mean_hours_from_share(fraction, window)
            basis = (f"{fraction:.0%} of instances interrupted within {window:g} h: "
                     f"M = {window:g} / -ln(1 - {fraction:g}) = {mean:,.0f} h")
        wait = _positive(rec, "capacity_wait_minutes", where) if "capacity_wait_minutes" in rec else None
        source = str(rec["source"])
        out[str(key)] = InterruptionFigure(str(key), mean, basis, sources.get(source, source), str(rec["as_of"]),
                                           str(rec["provider"]), wait, str(rec.get("notes") or ""))
    return out


def _check_interruption_id(flavor: Flavor, interruptions: dict[str, InterruptionFigure], where: str) -> None:
    if flavor.spot_interruption is not None and flavor.spot_interruption not in interruptions:
        near = close_matches(flavor.spot_interruption, sorted(interruptions), n=3)
        hint = f"did you mean: {', '.join(near)}?" if near else f"valid: {', '.join(sorted(interruptions))}"
        raise BadInputError(f"{where}: unknown spot_interruption '{flavor.spot_interruption}'", hint=hint)


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[Flavor, ...], tuple[tuple[str, str], ...], tuple[tuple[str, InterruptionFigure], ...],
                        str]:
    text = resources.files("trainfit").joinpath("data/cloud.yaml").read_text(encoding="utf-8")
    data = yaml_io.load_yaml_cached(text, "cloud.yaml")
    sources = data.get("sources", {})
    origin = "trainfit/data/cloud.yaml"
    interruptions = parse_interruptions(data.get("interruptions", {}), origin, sources)
    default = data.get("default_spot_interruption")
    if default not in interruptions:
        raise BadInputError(f"{origin}: default_spot_interruption {short_repr(default)} is not in interruptions")
    known = _gpu_ids()
    flavors, skipped = [], []
    for fields in parse_flavors(data["flavors"], origin, sources):
        flavor = _build(fields, f"{origin}: {fields['id']}")
        _check_interruption_id(flavor, interruptions, f"{origin}: {flavor.id}")
        if flavor.gpu and flavor.gpu not in known:
            skipped.append((flavor.id, f"GPU '{flavor.gpu}' is not in the GPU catalog"))
            continue
        flavors.append(flavor)
    return tuple(flavors), tuple(skipped), tuple(interruptions.items()), default


def _read_user_file(path: Path) -> list[dict]:
    from trainfit.validate import parse_yaml, read_text_file

    text = read_text_file(path, "--prices file")
    origin = f"--prices {path.name}"
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        header = reader.fieldnames or []
        bad = [c for c in header if c.strip() not in COLUMNS]
        if bad:
            raise BadInputError(f"{origin}: unknown column '{bad[0]}'", hint=f"valid columns: {', '.join(COLUMNS)}")
        if "id" not in [c.strip() for c in header]:
            raise BadInputError(f"{origin}: missing column 'id'", hint=f"valid columns: {', '.join(COLUMNS)}")
        rows = [{k.strip(): v for k, v in row.items()} for row in reader]
        return parse_flavors(rows, origin)
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        data = parse_yaml(text, origin)
        if isinstance(data, dict):
            extra = [k for k in data if k not in ("flavors", "sources")]
            if extra:
                raise BadInputError(f"{origin}: unknown key '{extra[0]}'", hint="valid keys: flavors, sources")
            return parse_flavors(data.get("flavors") or [], origin, data.get("sources") or {})
        return parse_flavors(data or [], origin)
    raise BadInputError(f"--prices: {path.name} must be a .yaml, .yml, .json or .csv file")


def load_cloud_catalog(prices_file: str | Path | None = None) -> CloudCatalog:
    """The shipped catalog, with a user price file's entries merged over it (same id replaces)."""
    shipped, skipped, interruptions, default = _shipped()
    figures = dict(interruptions)
    flavors = {f.id: f for f in shipped}
    skipped_map = dict(skipped)
    if prices_file is not None:
        known = _gpu_ids()
        for fields in _read_user_file(Path(prices_file)):
            fid = fields["id"]
            given = {k: v for k, v in fields.items() if v is not None}
            if fid in flavors:
                flavor = replace(flavors[fid], **{k: v for k, v in given.items() if k != "id"})
            else:
                flavor = _build(fields, f"--prices: flavor {fid}")
            if flavor.gpu and flavor.gpu not in known:
                near = close_matches(flavor.gpu, sorted(known), n=3)
                hint = f"did you mean: {', '.join(near)}?" if near else "list them with: trainfit gpus"
                raise BadInputError(f"--prices: flavor {fid}: unknown GPU '{flavor.gpu}'", hint=hint)
            if flavor.usable and flavor.usd_per_hour is None:
                raise BadInputError(f"--prices: flavor {fid}: missing column 'usd_per_hour'")
            _check_interruption_id(flavor, figures, f"--prices: flavor {fid}")
            flavors[fid] = flavor
            skipped_map.pop(fid, None)
    return CloudCatalog(flavors=list(flavors.values()), skipped=skipped_map, interruptions=figures,
                        default_interruption=default)
