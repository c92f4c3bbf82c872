"""Cloud catalog: rentable machines (flavors / instance types), their GPUs and prices.

The shipped list lives in `data/cloud.yaml` (each price with its source and date). A user file
given with `--prices FILE` overrides entries with the same id and adds new ones:
    YAML: {flavors: [{id: ..., provider: ..., ...}, ...]}   (or a bare list of flavors)
    CSV:  a header row with the column names below, one flavor per row.
Columns / keys: id, provider, kind, gpu, gpu_count, usd_per_hour (required for a new flavor);
vcpus, ram_gib, spot_usd_per_hour, source, as_of, notes (optional). An override of a shipped id
may give only the columns it changes (usually usd_per_hour).
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Literal

from trainfit import yaml_io
from trainfit.errors import BadInputError, close_matches

FlavorKind = Literal["gpu", "cpu", "tpu"]
KINDS = ("gpu", "cpu", "tpu")
REQUIRED = ("id", "provider", "kind", "gpu", "gpu_count", "usd_per_hour")
OPTIONAL = ("vcpus", "ram_gib", "spot_usd_per_hour", "source", "as_of", "notes")
COLUMNS = REQUIRED + OPTIONAL
_NUMERIC = {"gpu_count": int, "vcpus": int, "ram_gib": float, "usd_per_hour": float, "spot_usd_per_hour": float}


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

    @property
    def usable(self) -> bool:
        """Whether trainfit's PyTorch code can train on it."""
        return self.kind != "tpu"


@dataclass(frozen=True)
class CloudCatalog:
    flavors: list[Flavor]
    # Shipped flavors left out, id -> reason (e.g. their GPU is not in the GPU catalog yet).
    skipped: dict[str, str]

    def get(self, flavor_id: str) -> Flavor:
        for f in self.flavors:
            if f.id.lower() == flavor_id.lower():
                return f
        ids = [f.id for f in self.flavors]
        near = close_matches(flavor_id, ids, n=4)
        hint = f"did you mean: {', '.join(near)}?" if near else f"valid: {', '.join(ids)}"
        raise BadInputError(f"--flavor: unknown cloud flavor '{flavor_id}'", hint=hint)


def _gpu_ids() -> set[str]:
    from trainfit.core.gpu_catalog import all_gpus

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
                raise BadInputError(f"{where}: column '{key}' must be a number, got {value!r}") from None
            if not 0 <= number <= _MAX_COLUMN_VALUE:  # NaN fails this too
                raise BadInputError(f"{where}: column '{key}' must be a number from 0 to {_MAX_COLUMN_VALUE:.0e}, "
                                    f"got {value!r}")
            if _NUMERIC[key] is int:
                if number != int(number):
                    raise BadInputError(f"{where}: column '{key}' must be a whole number, got {value!r}")
                number = int(number)
            out[key] = number
        elif key == "kind":
            if value not in KINDS:
                raise BadInputError(f"{where}: kind {value!r} is not one of {', '.join(KINDS)}")
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


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[Flavor, ...], tuple[tuple[str, str], ...]]:
    text = resources.files("trainfit").joinpath("data/cloud.yaml").read_text(encoding="utf-8")
    data = yaml_io.load_yaml_cached(text, "cloud.yaml")
    sources = data.get("sources", {})
    known = _gpu_ids()
    flavors, skipped = [], []
    for fields in parse_flavors(data["flavors"], "trainfit/data/cloud.yaml", sources):
        flavor = _build(fields, f"trainfit/data/cloud.yaml: {fields['id']}")
        if flavor.gpu and flavor.gpu not in known:
            skipped.append((flavor.id, f"GPU '{flavor.gpu}' is not in the GPU catalog"))
            continue
        flavors.append(flavor)
    return tuple(flavors), tuple(skipped)


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
    shipped, skipped = _shipped()
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
            flavors[fid] = flavor
            skipped_map.pop(fid, None)
    return CloudCatalog(flavors=list(flavors.values()), skipped=skipped_map)
