"""Installed library versions, read from package metadata (no import of the library itself).

Only the argument *form* of a few settings depends on a version (FSDP and activation
checkpointing in Transformers 4 vs 5); the exporters take the major version as an argument so
they stay pure, and callers get it here. A neutral module (no trainfit import): the exporters, the
CPU measurement's cache key (hardware.cpu_measure) and the runner all read it.
"""

from __future__ import annotations

from importlib import metadata

# What `pip install 'trainfit[train]'` resolves to today; used when Transformers is not installed
# (a core-only install exporting files for another machine).
TRANSFORMERS_MAJOR_DEFAULT = 5


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
