"""The GPU catalog: `data/gpus.yaml` loaded once, validated, and looked up by id or detected name.

Validation reports every problem at once, each naming the entry id and the key, and insists on a
source for every figure (see the header of gpus.yaml for the conventions the figures follow).

`find_gpu` turns what a probe reports (NVML `nvmlDeviceGetName`, amdsmi market name, macOS
`machdep.cpu.brand_string`, an lspci line) into a catalog entry, using the reported memory to pick
among variants that share a name (A100 40 vs 80 GB, Apple M2 8/16/24 GB, MI250X module vs GCD).
"""

from __future__ import annotations

import functools
import math
import re
import statistics
import typing
from dataclasses import dataclass
from importlib import resources

from trainfit import yaml_io
from trainfit.core.machines.gpu_spec import GpuClass, GpuSpec, Precision, Vendor
from trainfit.errors import BadInputError, close_matches, short_repr

GIB = 1024**3

_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.]*(-[a-z0-9.]+)*$")
_VENDORS = typing.get_args(Vendor)
_CLASSES = typing.get_args(GpuClass)
_PRECISIONS = typing.get_args(Precision)

_REQUIRED_KEYS = {
    "id", "name", "vendor", "gpu_class", "architecture", "matrix_unit", "vram_gib",
    "memory_bandwidth_gbps", "peak_tflops", "tdp_watts", "pcie_gen", "aliases", "sources",
}  # fmt: skip
_OPTIONAL_KEYS = {"compute_capability", "unified_memory", "interconnect", "interconnect_gbps",
                  "host", "notes", "driver_total_mib", "driver_reserved_mib"}  # fmt: skip
# Figures that must carry a source ("all" in an entry's sources covers those not named).
_ALWAYS_SOURCED = ("vram_gib", "memory_bandwidth_gbps", "peak_tflops", "tdp_watts")
_SOURCED_WHEN_SET = ("compute_capability", "interconnect_gbps", "host", "driver_total_mib", "driver_reserved_mib")


class CatalogError(ValueError):
    """The shipped catalog file is invalid (a packaging bug, not a user mistake)."""


@dataclass(frozen=True)
class HostHint:
    """CPU facts of a system-on-chip entry (Apple): the GPU comes with this CPU."""

    cpu_model: str
    performance_cores: int
    efficiency_cores: int

    @property
    def physical_cores(self) -> int:
        return self.performance_cores + self.efficiency_cores


@dataclass(frozen=True)
class Catalog:
    gpus: tuple[GpuSpec, ...]
    hosts: dict[str, HostHint]  # catalog id -> host hint (Apple entries)
    notes: dict[str, str]  # catalog id -> free-text note from the data file

    @functools.cached_property
    def by_id(self) -> dict[str, GpuSpec]:
        return {g.id: g for g in self.gpus}


# ---------------------------------------------------------------------------- loading
def parse_catalog(text: str, origin: str = "gpus.yaml", *, cache: bool = False) -> Catalog:
    """Parse and validate catalog YAML text. Raises CatalogError listing every problem.
    cache=True keeps the parsed text in the user's cache directory (see trainfit.yaml_io)."""
    try:
        data = yaml_io.load_yaml_cached(text, "gpus.yaml") if cache else yaml_io.load_yaml(text)
    except yaml_io.YAMLError as exc:
        raise CatalogError(f"{origin}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise CatalogError(f"{origin}: expected a mapping with a 'gpus' list")
    refs = data.get("refs") or {}
    problems: list[str] = []
    for name, url in refs.items():
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            problems.append(f"refs.{name}: expected a URL, got {url!r}")
    gpus: list[GpuSpec] = []
    hosts: dict[str, HostHint] = {}
    notes: dict[str, str] = {}
    seen: set[str] = set()
    for i, raw in enumerate(data["gpus"]):
        where = f"gpus[{i}]"
        if isinstance(raw, dict) and isinstance(raw.get("id"), str):
            where = f"gpu '{raw['id']}'"
        entry_problems: list[str] = []
        spec = _build_entry(raw, refs, entry_problems)
        problems.extend(f"{where}: {p}" for p in entry_problems)
        if spec is None:
            continue
        if spec.id in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(spec.id)
        gpus.append(spec)
        if raw.get("host") is not None:
            hosts[spec.id] = HostHint(**raw["host"])
        if raw.get("notes"):
            notes[spec.id] = str(raw["notes"])
    if problems:
        raise CatalogError(f"{origin}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return Catalog(gpus=tuple(gpus), hosts=hosts, notes=notes)


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _build_entry(raw: object, refs: dict, problems: list[str]) -> GpuSpec | None:
    """One catalog entry as a GpuSpec, or None with every problem it has added to `problems`."""
    if not isinstance(raw, dict):
        problems.append("expected a mapping")
        return None
    if not _check_keys(raw, problems):
        return None
    _check_identity(raw, problems)
    tflops = _checked_figures(raw, problems)
    unified, link, link_gbps, pcie = _checked_links(raw, problems)
    aliases = raw["aliases"]
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        problems.append("aliases: expected a list of non-empty strings")
        aliases = []
    driver_mib, reserved_mib = _checked_driver_mib(raw, problems)
    host = raw.get("host")
    if host is not None:
        try:
            HostHint(**host)
        except TypeError:
            problems.append("host: expected cpu_model, performance_cores, efficiency_cores")
    sources = _resolve_sources(raw, refs, tflops, problems)
    if problems:
        return None
    return GpuSpec(
        id=raw["id"],
        name=raw["name"],
        vendor=raw["vendor"],
        gpu_class=raw["gpu_class"],
        architecture=raw["architecture"],
        compute_capability=raw.get("compute_capability"),
        matrix_unit=raw["matrix_unit"],
        vram_bytes=int(round(float(raw["vram_gib"]) * GIB)),
        unified_memory=unified,
        memory_bandwidth_gbps=float(raw["memory_bandwidth_gbps"]),
        peak_tflops={p: float(v) for p, v in tflops.items()},
        tdp_watts=float(raw["tdp_watts"]),
        interconnect=link,
        interconnect_gbps=None if link_gbps is None else float(link_gbps),
        pcie_gen=pcie,
        aliases=list(aliases),
        sources=sources,
        driver_total_bytes=None if driver_mib is None else int(driver_mib) << 20,
        driver_reserved_bytes=None if reserved_mib is None else int(reserved_mib) << 20,
    )


def _check_keys(raw: dict, problems: list[str]) -> bool:
    """Missing and unknown keys; False when a required key is missing (nothing else is checked)."""
    keys = set(raw)
    for key in sorted(_REQUIRED_KEYS - keys):
        problems.append(f"missing key '{key}'")
    for key in sorted(keys - _REQUIRED_KEYS - _OPTIONAL_KEYS):
        problems.append(f"unknown key '{key}'")
    return not _REQUIRED_KEYS - keys


def _check_identity(raw: dict, problems: list[str]) -> None:
    """What the entry is: id, vendor, class, name, architecture, matrix unit, compute capability."""
    gid = raw["id"]
    if not isinstance(gid, str) or not _ID_RE.match(gid):
        problems.append(f"id: {gid!r} must be lower-case letters, digits, dots and dashes")
    if raw["vendor"] not in _VENDORS:
        problems.append(f"vendor: {raw['vendor']!r} is not one of {', '.join(_VENDORS)}")
    if raw["gpu_class"] not in _CLASSES:
        problems.append(f"gpu_class: {raw['gpu_class']!r} is not one of {', '.join(_CLASSES)}")
    for key in ("name", "architecture"):
        if not isinstance(raw[key], str) or not raw[key]:
            problems.append(f"{key}: expected a non-empty string")
    if raw["matrix_unit"] is not None and not isinstance(raw["matrix_unit"], str):
        problems.append("matrix_unit: expected a string or null")
    cc = raw.get("compute_capability")
    if raw["vendor"] == "nvidia":
        if not isinstance(cc, str) or not re.match(r"^\d+\.\d+$", cc):
            problems.append(f"compute_capability: NVIDIA entries need a quoted 'X.Y', got {cc!r}")
    elif cc is not None:
        problems.append("compute_capability: only NVIDIA entries have one")


def _checked_figures(raw: dict, problems: list[str]) -> dict:
    """Memory, bandwidth, power and the peak TFLOPS per precision; returns peak_tflops ({} when malformed)."""
    for key in ("vram_gib", "memory_bandwidth_gbps", "tdp_watts"):
        if not _positive(raw[key]):
            problems.append(f"{key}: expected a positive number, got {raw[key]!r}")
    tflops = raw["peak_tflops"]
    if not isinstance(tflops, dict) or "fp32" not in tflops:
        problems.append("peak_tflops: expected a mapping that includes fp32")
        tflops = {}
    for prec, value in tflops.items():
        if prec not in _PRECISIONS:
            problems.append(f"peak_tflops.{prec}: not one of {', '.join(_PRECISIONS)}")
        elif not _positive(value):
            problems.append(f"peak_tflops.{prec}: expected a positive number, got {value!r}")
    return tflops


def _checked_links(raw: dict, problems: list[str]) -> tuple[object, object, object, object]:
    """(unified_memory, interconnect, interconnect_gbps, pcie_gen) as given, each checked."""
    unified = raw.get("unified_memory", False)
    if not isinstance(unified, bool):
        problems.append("unified_memory: expected true/false")
    if raw["vendor"] == "apple" and unified is not True:
        problems.append("unified_memory: Apple entries share system memory, must be true")
    link, link_gbps = raw.get("interconnect"), raw.get("interconnect_gbps")
    if (link is None) != (link_gbps is None):
        problems.append("interconnect and interconnect_gbps: give both or neither")
    elif link_gbps is not None and not _positive(link_gbps):
        problems.append(f"interconnect_gbps: expected a positive number, got {link_gbps!r}")
    pcie = raw["pcie_gen"]
    if pcie is not None and (not isinstance(pcie, int) or isinstance(pcie, bool) or not 1 <= pcie <= 6):
        problems.append(f"pcie_gen: expected 1..6 or null, got {pcie!r}")
    return unified, link, link_gbps, pcie


def _checked_driver_mib(raw: dict, problems: list[str]) -> tuple[object, object]:
    """(driver_total_mib, driver_reserved_mib) as given, each checked against the other and vram_gib."""
    driver_mib = raw.get("driver_total_mib")
    if driver_mib is not None:
        if not isinstance(driver_mib, int) or isinstance(driver_mib, bool) or driver_mib <= 0:
            problems.append(f"driver_total_mib: expected a positive whole number of MiB, got {driver_mib!r}")
        elif _positive(raw["vram_gib"]) and driver_mib > raw["vram_gib"] * 1024:
            problems.append(f"driver_total_mib: {driver_mib} MiB is more than vram_gib {raw['vram_gib']} GiB")
    reserved_mib = raw.get("driver_reserved_mib")
    if reserved_mib is not None:
        total_mib = driver_mib if isinstance(driver_mib, int) else None
        if not isinstance(reserved_mib, int) or isinstance(reserved_mib, bool) or reserved_mib <= 0:
            problems.append(f"driver_reserved_mib: expected a positive whole number of MiB, got {reserved_mib!r}")
        elif total_mib is not None and reserved_mib >= 0.1 * total_mib:
            problems.append(f"driver_reserved_mib: {reserved_mib} MiB is 10 % or more of the {total_mib} MiB total")
    return driver_mib, reserved_mib


def _resolve_sources(raw: dict, refs: dict, tflops: dict, problems: list[str]) -> dict[str, str]:
    """Expand 'all' and reference names into figure -> URL; every figure must end up sourced."""
    given = raw["sources"]
    if not isinstance(given, dict):
        problems.append("sources: expected a mapping of figure -> reference or URL")
        return {}
    figures = list(_ALWAYS_SOURCED) + [k for k in _SOURCED_WHEN_SET if raw.get(k) is not None]
    allowed = set(figures) | {"all"} | {f"peak_tflops.{p}" for p in tflops}
    resolved: dict[str, str] = {}
    for key, ref in given.items():
        if key not in allowed:
            problems.append(f"sources.{key}: not a figure of this entry ({', '.join(sorted(allowed))})")
            continue
        url = refs.get(ref, ref) if isinstance(ref, str) else None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            problems.append(f"sources.{key}: {ref!r} is neither a URL nor a name under refs")
            continue
        resolved[key] = url
    fallback = resolved.pop("all", None)
    for fig in figures:
        if fig not in resolved:
            if fallback is None:
                problems.append(f"sources: figure '{fig}' has no source")
            else:
                resolved[fig] = fallback
    return resolved


@functools.lru_cache(maxsize=1)
def catalog() -> Catalog:
    """The shipped catalog, parsed and validated once per process."""
    text = resources.files("trainfit").joinpath("data/gpus.yaml").read_text(encoding="utf-8")
    return parse_catalog(text, "trainfit/data/gpus.yaml", cache=True)


def driver_reserved_bytes(spec: GpuSpec) -> int:
    """What the driver keeps of `spec.usable_vram_bytes` for itself (nvidia-smi's "Reserved").

    The recorded figure where the catalog has one. Other NVIDIA parts take the median share of the
    recorded ones (0.5-2.5 % of the total, Volta to Hopper, GeForce to H200): every recent NVIDIA
    driver keeps some, and counting none calls a run that is ~1 % short of the card a fit. Other
    vendors: none recorded, 0."""
    if spec.driver_reserved_bytes is not None:
        return spec.driver_reserved_bytes
    if spec.vendor != "nvidia" or spec.unified_memory:
        return 0
    return int(spec.usable_vram_bytes * _median_reserved_share())


@functools.lru_cache(maxsize=1)
def _median_reserved_share() -> float:
    shares = [g.driver_reserved_bytes / g.usable_vram_bytes for g in all_gpus() if g.driver_reserved_bytes]
    return statistics.median(shares) if shares else 0.0


# ---------------------------------------------------------------------------- lookups
def all_gpus() -> list[GpuSpec]:
    """Every catalog entry, in file order."""
    return list(catalog().gpus)


def get_gpu(catalog_id: str) -> GpuSpec:
    """The entry with this id (case-insensitive; an exact alias works too).

    Raises BadInputError naming close matches when nothing matches.
    """
    cat = catalog()
    key = catalog_id.strip().lower()
    if key in cat.by_id:
        return cat.by_id[key]
    found = _by_normalised_name().get(normalise_name(catalog_id), [])
    if len(found) == 1:
        return found[0]
    ids = [g.id for g in cat.gpus]
    if found:
        choices = ", ".join(g.id for g in found)
        raise BadInputError(f"GPU '{catalog_id}' is ambiguous", hint=f"one of: {choices}")
    near = close_matches(key, ids, n=4)
    hint = f"did you mean: {', '.join(near)}?" if near else "list them with: trainfit gpus"
    raise BadInputError(f"unknown GPU {short_repr(catalog_id)} (not in the catalog)", hint=hint)


_DROP_WORDS = {"nvidia", "geforce", "corporation", "amd", "ati", "intel(r)", "intel", "tm", "r",
               "graphics", "gpu", "tesla", "quadro", "apple", "inc", "inc.", "advanced", "micro",
               "devices", "rev"}  # fmt: skip
# Words that only describe the part and do not tell two entries apart.
_FOLD = {"mobile": "laptop", "max-q": "laptop", "notebook": "laptop", "pcie": "pcie", "hbm3": "",
         "sxm5": "sxm", "sxm4": "sxm", "sxm2": "sxm", "generation": "", "(tm)": "", "(r)": ""}


def normalise_name(name: str) -> str:
    """Fold a reported GPU name to compare it with catalog names and aliases.

    "NVIDIA GeForce RTX 3060 Laptop GPU" -> "rtx 3060 laptop"; "NVIDIA A100-SXM4-80GB" -> "a100 sxm
    80gb"; "Intel(R) Arc(TM) A770 Graphics" -> "arc a770".
    """
    text = name.lower().replace("(tm)", " ").replace("(r)", " ").replace("®", " ").replace("™", " ")
    text = re.sub(r"\(rev [0-9a-f]+\)", " ", text)
    text = re.sub(r"(\d+)\s*gb\b", r"\1gb", text)  # "80 GB" -> "80gb"
    words = re.split(r"[\s_/,\-]+", text)
    out = []
    for word in words:
        word = _FOLD.get(word, word).strip("[]()")
        if word and word not in _DROP_WORDS:
            out.append(word)
    return " ".join(out)


@functools.lru_cache(maxsize=1)
def _by_normalised_name() -> dict[str, list[GpuSpec]]:
    index: dict[str, list[GpuSpec]] = {}
    for spec in catalog().gpus:
        for label in {spec.id, spec.name, *spec.aliases}:
            bucket = index.setdefault(normalise_name(label), [])
            if spec not in bucket:
                bucket.append(spec)
    return index


def _lspci_candidates(name: str) -> list[str]:
    """Names inside an lspci line: 'AD102 [GeForce RTX 4090]' and '[Radeon RX 7900 XT/7900 XTX]'."""
    groups = re.findall(r"\[([^\[\]]+)\]", name)
    if not groups:
        return []
    last = groups[-1]
    parts = [p.strip() for p in last.split("/") if p.strip()]
    first_words = parts[0].split()
    out = [parts[0]]
    for part in parts[1:]:
        # "7900 XTX" after "Radeon RX 7900 XT": reuse the words before the shared model number.
        lead = part.split()[0]
        prefix = first_words[: first_words.index(lead)] if lead in first_words else []
        out.append(" ".join(prefix + [part]))
    return out


def find_gpu(detected_name: str, vram_bytes: int | None = None) -> GpuSpec | None:
    """The catalog entry for a reported GPU name, or None when the catalog does not know it.

    vram_bytes (what the probe read) picks among entries sharing the name: the entry whose memory
    is nearest on a log scale wins. Without it, the first listed variant (the common one) wins.
    """
    if not detected_name or not detected_name.strip():
        return None
    index = _by_normalised_name()
    candidates: list[GpuSpec] = []
    for label in [detected_name, *_lspci_candidates(detected_name)]:
        for spec in index.get(normalise_name(label), []):
            if spec not in candidates:
                candidates.append(spec)
    if not candidates:
        # A name that carries its memory size ("... 80GB") may list a size our alias omits.
        stripped = re.sub(r"\b\d+gb\b", " ", normalise_name(detected_name))
        key = " ".join(stripped.split())
        candidates = list(index.get(key, []))
    if not candidates:
        return None
    if vram_bytes is None or vram_bytes <= 0 or len(candidates) == 1:
        return candidates[0]
    return min(candidates, key=lambda g: abs(math.log(g.vram_bytes / vram_bytes)))


def host_hint(catalog_id: str) -> HostHint | None:
    """CPU facts that come with a system-on-chip entry (Apple), else None."""
    return catalog().hosts.get(catalog_id)
