"""The rich Console every printing layer uses (CLI output, the training progress bar)."""

from __future__ import annotations

import os
import sys


def console(stderr: bool = False):
    """A rich Console; on stdout for human output, stderr for messages."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output (logs, CI) gets a fixed 120 columns rather than rich's 80, so tables stay readable.
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 120
    # emoji=False: the output spells emoji as characters, never as :codes: (and rich then skips
    # loading its emoji table)
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)
