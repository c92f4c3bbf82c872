"""Errors that carry the exit code the CLI gives for them.

Exit codes are a contract (see DESIGN): 0 ok, 2 bad input, 3 does not fit, 4 hardware or
dependency unavailable, 5 training diverged (non-finite losses that no recovery could end; the
last good checkpoint is kept); 130 / 143 stopped by SIGINT / SIGTERM. Library code raises these; only the CLI prints them and exits.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3
EXIT_UNAVAILABLE = 4
EXIT_DIVERGED = 5
# Stopped by a signal: 128 + its number, as a shell reports a process the signal killed, but with
# a message and after the command rolled back what it was writing.
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C)
EXIT_TERMINATED = 143  # SIGTERM


class TrainfitError(Exception):
    """Base class: a message meant for the user, and the exit code that goes with it."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class BadInputError(TrainfitError):
    """The user gave something invalid: a flag, a key, a file. Exit code 2."""

    exit_code = EXIT_BAD_INPUT


class DoesNotFitError(TrainfitError):
    """The estimate is over the hardware budget. Exit code 3."""

    exit_code = EXIT_DOES_NOT_FIT


class UnavailableError(TrainfitError):
    """Hardware or an optional dependency is missing. Exit code 4."""

    exit_code = EXIT_UNAVAILABLE


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where the command was, so that writers roll back (a
    KeyboardInterrupt: every `except KeyboardInterrupt` sees it). `detail` says what the command
    left behind; the CLI prints it and exits with 130 (SIGINT) or 143 (SIGTERM)."""

    def __init__(self, signum: int, detail: str | None = None):
        super().__init__(signum, detail)
        self.signum = signum
        self.detail = detail

    @property
    def signal_name(self) -> str:
        import signal

        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {self.signal_name}" + (f"; {self.detail}" if self.detail else "")


def raise_interrupted(signum, frame) -> None:
    """A signal handler: the signal raised as Interrupted where the command was."""
    raise Interrupted(signum)


class TrainingDivergedError(TrainfitError):
    """Training diverged: non-finite losses or gradients kept coming after every recovery (fp32,
    raised accumulation). Exit code 5; the last good checkpoint stays for a --resume."""

    exit_code = EXIT_DIVERGED


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to n choices that look like `word` (case-insensitive), for 'did you mean' hints."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    import difflib

    found = difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=0.5)
    # Substring matches help with short aliases ("qwen2.5-7b" inside a hub id).
    for c in choices:
        if len(found) >= n:
            break
        if word.lower() in c.lower() and c.lower() not in found:
            found.append(c.lower())
    return [lowered[f] for f in found]


def unknown_keys(keys: Iterable[object], valid: Iterable[str], where: str = "") -> list[str]:
    """One message per key not in `valid`: '<where><key>: unknown key (did you mean ...? valid: ...)'."""
    valid = list(valid)
    out = []
    for key in keys:
        if key not in valid:
            near = close_matches(str(key), valid)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            out.append(f"{where}{key}: unknown key ({hint}valid: {', '.join(valid)})")
    return out


def require_extra(module: str, extra: str) -> None:
    """Raise UnavailableError naming the pip extra when an optional module is missing."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UnavailableError(
            f"this needs the optional dependency '{module}'",
            hint=f"install it with: pip install 'trainfit[{extra}]'",
        )


def short_repr(value: object, limit: int = 40) -> str:
    """A bad value as an error message quotes it: at most `limit` characters, however large or
    deeply shared the value is (a YAML alias bomb repr()'d whole is gigabytes)."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlevel, shortener.maxlist, shortener.maxtuple, shortener.maxdict = 2, 3, 3, 3
    shortener.maxset = shortener.maxfrozenset = shortener.maxdeque = shortener.maxarray = 3
    shortener.maxstring, shortener.maxother, shortener.maxlong = limit, limit, limit
    try:
        text = shortener.repr(value)
    except (ValueError, RecursionError):  # an int over the 4,300-digit str() limit, a cycle
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
