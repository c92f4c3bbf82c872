"""Where trainfit keeps what it can recompute: parsed catalogs, Hub model metadata, disk
measurements. One rule for every cache: $TRAINFIT_CACHE_DIR, else $XDG_CACHE_HOME/trainfit (an
absolute path, as the XDG spec asks), else ~/.cache/trainfit. Deleting it loses nothing."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(*parts: str) -> Path:
    """trainfit's cache directory, or a folder inside it (not created here)."""
    own = os.environ.get("TRAINFIT_CACHE_DIR")
    if own:
        root = Path(os.path.expanduser(own))
    else:
        base = os.environ.get("XDG_CACHE_HOME") or ""
        root = Path(base if os.path.isabs(base) else os.path.join(os.path.expanduser("~"), ".cache")) / "trainfit"
    return root.joinpath(*parts)
