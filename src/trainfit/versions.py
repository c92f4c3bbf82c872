"""Installed library versions, read from package metadata (no import of the library itself), and
the release numbers of version strings.

Only the argument *form* of a few settings depends on a version (FSDP and activation
checkpointing in Transformers 4 vs 5); the exporters take the major version as an argument so
they stay pure, and callers get it here. A neutral module (no trainfit import): the exporters, the
CPU measurement's cache key (hardware.cpu_measure) and the runner all read it.
"""

from __future__ import annotations

import re
from importlib import metadata

# What `pip install 'trainfit[train]'` resolves to today; used when Transformers is not installed
# (a core-only install exporting files for another machine).
TRANSFORMERS_MAJOR_DEFAULT = 5


_RELEASE = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def release_tuple(version: str, *, minor_required: bool = False) -> tuple[int, int, int]:
    """(major, minor, patch) of a release string ('4.39.0.dev0' -> (4, 39, 0)); ValueError for one
    that is not a release number (or, with minor_required, has no minor number)."""
    m = _RELEASE.match(str(version))
    if not m or (minor_required and m[2] is None):
        raise ValueError(f"{version!r} is not a version number" + (" (major.minor[.patch])" if minor_required else ""))
    return int(m[1]), int(m[2] or 0), int(m[3] or 0)


def installed_version(distribution: str) -> str | None:
    """Version string of an installed distribution, None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed_major(distribution: str) -> int | None:
    """Major version of an installed distribution, None when it is not installed."""
    version = installed_version(distribution)
    return None if version is None else int(version.split(".")[0])


def transformers_major() -> int:
    """The installed Transformers major version, or TRANSFORMERS_MAJOR_DEFAULT without it."""
    major = installed_major("transformers")
    return TRANSFORMERS_MAJOR_DEFAULT if major is None else major
