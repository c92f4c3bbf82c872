"""Models on the Hugging Face Hub that are not in the catalog ("owner/name", "owner/name@revision").

`load_hub_model` fetches the repository's config.json and, for the exact parameter count and the
stored dtype, only the JSON headers of its safetensors files (HTTP Range requests), never the
weights. Which files count is what transformers loads: the shards
listed in model.safetensors.index.json, else model.safetensors. Parsing and validation are
model_loader's, the same as for a local model directory; nothing from the repository is executed.

What was fetched (config.json, each header's elements per dtype, the commit) is kept as one small
JSON file per (endpoint, repository, revision) under trainfit's cache directory, so a second call
makes no request and works offline. Only what passed every check is cached.

The server is not trusted: one lookup has one deadline (TRAINFIT_HUB_DEADLINE, default 60 s) and
every answer is read as a counted stream with a cap per kind of file and for the whole lookup
(trainfit.hub.bounded_http), so a slow, endless or hostile server ends in a one-line error naming the limit.

Environment: HF_ENDPOINT (a mirror, or the tests' fake hub), HF_TOKEN (gated and private
repositories), HF_HUB_OFFLINE=1 (cache only), HF_HUB_DOWNLOAD_TIMEOUT (seconds one read may wait,
default 10), TRAINFIT_HUB_DEADLINE (seconds for the whole lookup, default 60), TRAINFIT_CACHE_DIR
or XDG_CACHE_HOME (where the cache lives). huggingface_hub is imported only when a request is about
to be made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainfit.core.models import loader as model_loader
from trainfit.core.models.catalog import parse_hub_ref as parse_ref
from trainfit.core.models.spec import ModelSpec
from trainfit.errors import BadInputError, TrainfitError, UnavailableError
from trainfit.hub import bounded_http as hub_http
from trainfit.validate import Bound

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CACHE_FORMAT = 2  # 2: each safetensors file as its elements per dtype (1 kept whole headers)
# The limits of one lookup (tests replace it with smaller ones); the deadline and the per-read
# timeout come from the environment (read_limits).
LIMITS = hub_http.Limits()
DEADLINE_ENV = "TRAINFIT_HUB_DEADLINE"
TIMEOUT_ENV = "HF_HUB_DOWNLOAD_TIMEOUT"
# huggingface_hub reads HF_HUB_DOWNLOAD_TIMEOUT with int() when it is imported: a whole number.
_TIMEOUT_BOUND = Bound(1, 3600)
_DEADLINE_BOUND = Bound(0.5, 3600, integer=False)
_FIRST_RANGE_BYTES = 100_001  # huggingface_hub's first read of a safetensors file (bytes=0-100000)
_MAX_CACHE_FILE_BYTES = 64 << 20
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's reading of boolean environment variables
def cache_dir() -> Path:
    """trainfit's cache directory (trainfit.user_cache); Hub entries live in its "hub" folder."""
    from trainfit.user_cache import user_cache_dir

    return user_cache_dir()


def load_hub_model(repo_id: str, revision: str | None = None, *,
                   suggestions: Callable[[], list[str]] = list) -> ModelSpec:
    """A ModelSpec for a Hub repository: from trainfit's cache, else from the Hub (then cached).
    `suggestions` gives catalog names close to the reference, for the hints of the errors.
    BadInputError: no such repository / revision / config.json, a config, index or header trainfit
    refuses (too large, malformed), a bad HF_ENDPOINT / timeout setting. UnavailableError: offline
    and not cached, Hub unreachable, access refused, the deadline passed, an unusable answer."""
    hub = _Hub(repo_id, revision or DEFAULT_REVISION, suggestions)
    entry = hub.read_cache()
    if entry is not None:
        return hub.spec(entry)
    if offline_variable():
        raise hub.offline_error()
    check_endpoint(hub.endpoint)
    entry = hub.fetch_within_deadline(read_limits())
    spec = hub.spec(entry)  # every check (the parameter total too) before anything is cached
    hub.write_cache(entry)
    return spec


def offline_variable() -> str | None:
    """The environment variable that makes the Hub off limits, None when none does: HF_HUB_OFFLINE
    (else TRANSFORMERS_OFFLINE) read now, as huggingface_hub reads it at import."""
    name = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    return name if os.environ.get(name, "").upper() in _TRUE else None


def hub_endpoint() -> str:
    """The Hub's address: HF_ENDPOINT, else huggingface.co (unchecked: check_endpoint)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def read_limits() -> hub_http.Limits:
    """LIMITS with the deadline and per-read timeout the environment sets; a bad value is exit 2
    naming the variable (checked before huggingface_hub is imported: it would fail on one)."""
    return dataclasses.replace(LIMITS, deadline_seconds=_env_seconds(DEADLINE_ENV, _DEADLINE_BOUND,
                                                                     LIMITS.deadline_seconds),
                               read_timeout_seconds=_env_seconds(TIMEOUT_ENV, _TIMEOUT_BOUND,
                                                                 LIMITS.read_timeout_seconds))


def check_endpoint(endpoint: str) -> urllib.parse.SplitResult:
    """HF_ENDPOINT's parts when it is an http(s) URL with a host (and a valid port), else exit 2
    naming it."""
    try:
        parts = urllib.parse.urlsplit(endpoint)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
    except ValueError:  # "http://[bad", a port over 65535
        ok = False
    if ok:
        return parts
    raise BadInputError(f"environment variable HF_ENDPOINT: {endpoint[:80]!r} is not an http(s) URL with a host",
                            hint=f"unset it for {DEFAULT_ENDPOINT}, or give a mirror such as https://hf-mirror.com")


def _env_seconds(name: str, bound: Bound, default: float) -> float:
    text = os.environ.get(name, "")
    if not text.strip():
        return default
    try:
        return float(bound.parse(text))
    except ValueError as exc:
        raise BadInputError(f"environment variable {name}: {exc} (seconds)",
                            hint=f"unset it for the default of {default:g} s") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


class _Hub:
    """One repository at one revision on one endpoint: its cache file, fetch, and error messages."""

    def __init__(self, repo_id: str, revision: str, suggestions: Callable[[], list[str]]):
        self.repo_id, self.revision, self.suggestions = repo_id, revision, suggestions
        self.endpoint = hub_endpoint()
        self.ref = repo_id if revision == DEFAULT_REVISION else f"{repo_id}@{revision}"
        key = hashlib.sha256(f"{self.endpoint}\n{repo_id.lower()}\n{revision}".encode()).hexdigest()[:16]
        safe_rev = re.sub(r"[^\w.-]", "_", revision)[:60]
        self.cache_path = cache_dir() / "hub" / repo_id.lower().replace("/", "--") / f"{safe_rev}.{key}.json"

    # -- cache ------------------------------------------------------------------------------

    def read_cache(self) -> dict[str, Any] | None:
        """The cached entry, or None when there is none or it is unreadable (then it is fetched again)."""
        try:
            if self.cache_path.stat().st_size > _MAX_CACHE_FILE_BYTES:
                return None
            entry = json.loads(self.cache_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        ok = (isinstance(entry, dict) and entry.get("format") == CACHE_FORMAT and isinstance(entry.get("repo_id"), str)
              and isinstance(entry.get("config"), dict) and isinstance(entry.get("shards"), dict)
              and all(_is_dtype_elements(counts) for counts in entry["shards"].values()))
        return entry if ok else None

    def write_cache(self, entry: dict[str, Any]) -> None:
        """Best effort: a cache that cannot be written (read-only home) only costs the next call a fetch."""
        tmp = self.cache_path.with_name(f"{self.cache_path.name}.{os.getpid()}.tmp")
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(entry, separators=(",", ":")), encoding="utf-8")
            os.replace(tmp, self.cache_path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()

    # -- the spec ---------------------------------------------------------------------------

    def spec(self, entry: dict[str, Any]) -> ModelSpec:
        """The ModelSpec of a fetched or cached entry; the config and the parameter total are
        checked again either way."""
        sha = entry.get("sha") if isinstance(entry.get("sha"), str) else None
        spec = model_loader.spec_from_config(entry["config"], origin=self._origin(CONFIG_FILE),
                                             model_id=entry["repo_id"])
        counted = model_loader.params_from_dtype_elements(list(entry["shards"].values()))
        spec = model_loader.with_safetensors_params(spec, entry["config"], counted)
        commit = f", commit {sha}" if sha else ""
        return dataclasses.replace(spec, source=f"{self._url(CONFIG_FILE)} (Hugging Face Hub, revision "
                                                f"{self.revision}{commit})")

    def _url(self, filename: str) -> str:
        return f"{self.endpoint}/{self.repo_id}/blob/{self.revision}/{filename}"

    def _origin(self, filename: str) -> str:
        return f"{self.ref}: {filename}"

    # -- fetch ------------------------------------------------------------------------------

    def fetch_within_deadline(self, limits: hub_http.Limits) -> dict[str, Any]:
        """fetch() on a daemon thread, given up at the deadline even when a read is stuck (a
        server that dribbles its headers out one byte at a time)."""
        started = time.monotonic()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["entry"] = self.fetch(limits, started, outcome)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                outcome["error"] = exc

        worker = threading.Thread(target=run, daemon=True, name="trainfit-hub-lookup")
        worker.start()
        worker.join(max(0.0, started + limits.deadline_seconds - time.monotonic()))
        if worker.is_alive():
            session = outcome.get("session")
            if session is not None:
                session.cancelled = True  # its threads stop at their next read
            doing = (session.doing if session and session.doing
                     else f"{self.ref}: the Hugging Face Hub at {self.endpoint}")
            raise UnavailableError(hub_http.deadline_message(limits.deadline_seconds, doing), hint=_DEADLINE_HINT)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["entry"]

    def fetch(self, limits: hub_http.Limits, started: float | None = None,
              shared: dict[str, Any] | None = None) -> dict[str, Any]:
        """config.json and the checked safetensors headers from the Hub, pinned to one commit.
        `shared` receives the session (what it is waiting for, when the deadline passes)."""
        session = hub_http.Session(limits, self.endpoint, _request_headers(), started)
        if shared is not None:
            shared["session"] = session
        with self._errors(session):
            repo_id, sha, files = self._model_info(session)
            pinned = sha or self.revision  # every file from the same commit, even if the branch moves meanwhile
            if files is not None and CONFIG_FILE not in files:
                raise self._no_config()
            config = self._get_json(session, CONFIG_FILE, pinned, limits.config_bytes)
            # Refuse an unsupported or remote-code config before fetching any header.
            model_loader.spec_from_config(config, origin=self._origin(CONFIG_FILE), model_id=self.repo_id)
            shards = self._shards(session, files, pinned)
            parse_one_at_a_time = threading.Lock()  # a parsed header is ~10x its bytes: one in memory at a time
            counts = session.map_parallel(lambda name: self._header(session, name, pinned, parse_one_at_a_time),
                                          shards)
        return {"format": CACHE_FORMAT, "endpoint": self.endpoint, "repo_id": repo_id, "revision": self.revision,
                "sha": sha, "config": config, "shards": dict(zip(shards, counts))}

    def _model_info(self, session: hub_http.Session) -> tuple[str, str | None, set[str] | None]:
        """(repository id, commit, file names or None when the endpoint lists none) from the Hub
        API's JSON about the repository at the revision (huggingface_hub's model_info)."""
        what = f"{self.ref}: model info from {self.endpoint}"
        url = f"{self.endpoint}/api/models/{self.repo_id}/revision/{urllib.parse.quote(self.revision, safe='')}"
        data = session.get(url, what, session.limits.model_info_bytes, refused_model=False)
        info = hub_http.parse_document(data, what, session.limits.max_json_items, refused_model=False)
        sha = info.get("sha") if isinstance(info.get("sha"), str) and len(info["sha"]) <= 100 else None
        info_id = info.get("id")
        repo_id = info_id if isinstance(info_id, str) and parse_ref(info_id) else self.repo_id
        siblings = info.get("siblings")
        if siblings is None:
            return repo_id, sha, None
        if not (isinstance(siblings, list) and all(isinstance(s, dict) and isinstance(s.get("rfilename"), str)
                                                   for s in siblings)):
            raise hub_http.HubLimitError(f"{what}: 'siblings' is not a list of files")
        return repo_id, sha, {s["rfilename"] for s in siblings}

    def _shards(self, session: hub_http.Session, files: set[str] | None, revision: str) -> list[str]:
        """The safetensors files transformers would load: the index's shards, else model.safetensors."""
        if files is None:  # an endpoint that lists no files: ask for each
            index = self._get_json(session, INDEX_FILE, revision, session.limits.index_bytes, missing_ok=True)
            if index is None:
                exists = session.exists(self._resolve(SINGLE_FILE, revision), self._origin(SINGLE_FILE))
                return [SINGLE_FILE] if exists else []
        elif INDEX_FILE in files:
            index = self._get_json(session, INDEX_FILE, revision, session.limits.index_bytes)
        else:
            return [SINGLE_FILE] if SINGLE_FILE in files else []
        names = model_loader.shard_names(index.pop("weight_map", None), self._origin(INDEX_FILE))
        del index  # the weight map is the big part: 10^5 tensor names for the largest models
        if len(names) > session.limits.max_shards:
            raise BadInputError(f"{self._origin(INDEX_FILE)}: lists {len(names):,} shard files; trainfit reads the "
                                f"headers of at most {session.limits.max_shards:,}",
                                hint="no released model has that many; give a local directory to read it anyway")
        for name in names:
            if files is not None and name not in files:
                raise BadInputError(f"{self._origin(INDEX_FILE)}: lists {name!r}, which the repository does not have")
        return names

    def _header(self, session: hub_http.Session, name: str, revision: str, parse_lock: threading.Lock
                ) -> dict[str, int]:
        """One file's safetensors header from two range reads at most (the first 100 kB, then the
        rest when the header is longer), checked by model_loader.parse_header like a local file's.
        Only what the parameter count needs is kept: elements per dtype."""
        origin, url = self._origin(name), self._resolve(name, revision)
        try:
            first = session.get_range(url, origin, 0, _FIRST_RANGE_BYTES - 1)
        except hub_http.HubStatusError as exc:
            if exc.status == 416:  # an empty file
                raise BadInputError(f"{origin}: too short to be a safetensors file") from None
            if self._missing(exc):
                raise BadInputError(f"{self._origin(INDEX_FILE)}: lists {name!r}, which the repository does not "
                                    "have") from None
            raise
        length = model_loader.header_length(first[:8], origin)
        if length > session.limits.header_bytes:
            raise hub_http.HubLimitError(f"{origin}: safetensors header of {length:,} bytes is larger than "
                                         f"{session.limits.header_bytes >> 20} MiB, trainfit's limit for it",
                                         refused_model=True)
        raw = first[8:8 + length]
        if len(raw) < length and len(first) == _FIRST_RANGE_BYTES:
            try:
                raw += session.get_range(url, origin, _FIRST_RANGE_BYTES, 8 + length - 1)
            except hub_http.HubStatusError as exc:
                if exc.status != 416:
                    raise
        if len(raw) < length:
            raise BadInputError(f"{origin}: safetensors header length exceeds the file (corrupt file?)")
        del first
        hub_http.check_items(raw, f"{origin}: safetensors header", session.limits.max_json_items, refused_model=True)
        with parse_lock:
            try:
                return model_loader.dtype_elements(model_loader.parse_header(raw, origin))
            except ValueError:  # an integer of more than 4,300 digits
                raise BadInputError(f"{origin}: safetensors header holds a number too long to be real") from None

    def _get_json(self, session: hub_http.Session, filename: str, revision: str, max_bytes: int,
                  missing_ok: bool = False) -> dict[str, Any] | None:
        """A small JSON file of the repository: at most max_bytes, an object, not nested deep."""
        origin = self._origin(filename)
        try:
            data = session.get(self._resolve(filename, revision), origin, max_bytes)
        except hub_http.HubStatusError as exc:
            if not self._missing(exc):
                raise
            if missing_ok:
                return None
            if filename == CONFIG_FILE:
                raise self._no_config() from None
            raise BadInputError(f"{self.ref}: {filename} not found in the repository") from None
        return hub_http.parse_document(data, origin, session.limits.max_json_items, refused_model=True)

    def _resolve(self, filename: str, revision: str) -> str:
        """huggingface_hub's hf_hub_url: {endpoint}/{repo}/resolve/{revision}/{file}."""
        return (f"{self.endpoint}/{self.repo_id}/resolve/{urllib.parse.quote(revision, safe='')}/"
                f"{urllib.parse.quote(filename)}")

    @staticmethod
    def _missing(exc: hub_http.HubStatusError) -> bool:
        """A file the repository does not have (a mirror may say 404 without the Hub's error code)."""
        return exc.error_code == "EntryNotFound" or (exc.status == 404 and exc.error_code is None)

    # -- errors -----------------------------------------------------------------------------

    def _no_config(self) -> BadInputError:
        return BadInputError(f"model {self.ref!r} on the Hugging Face Hub has no config.json",
                             hint="trainfit reads transformers-format repositories (config.json + safetensors); "
                             "GGUF-only or adapter-only repositories are not supported")

    def _did_you_mean(self) -> str:
        similar = self.suggestions()
        return f"did you mean (catalog): {', '.join(similar)}; " if similar else ""

    def offline_error(self) -> UnavailableError:
        return UnavailableError(
            f"model {self.ref!r} is not in the catalog nor in trainfit's cache, and Hugging Face Hub offline "
            "mode is on (HF_HUB_OFFLINE=1)",
            hint=f"{self._did_you_mean()}run once online to cache its config and safetensors headers, or give a "
            "local model directory or config.json")

    @contextlib.contextmanager
    def _errors(self, session: hub_http.Session) -> Iterator[None]:
        """HTTP statuses, limits and network failures as trainfit errors with the exit code that fits."""
        try:
            yield
        except TrainfitError:
            raise
        except hub_http.HubLimitError as exc:
            hint = (_DEADLINE_HINT if isinstance(exc, hub_http.HubDeadlineError)
                    else _LIMIT_HINT if exc.refused_model else _SERVER_HINT)
            raise exc.as_trainfit_error(hint) from None
        except hub_http.HubStatusError as exc:
            raise self._status_error(exc, api=f"{self.endpoint}/api/" in exc.url) from None
        except Exception as exc:
            if not _is_network_error(exc):
                raise
            if session.remaining_seconds() <= 0.05:  # the last read's timeout was the deadline's rest
                doing = session.doing or f"{self.ref}: the Hugging Face Hub at {self.endpoint}"
                raise UnavailableError(hub_http.deadline_message(session.limits.deadline_seconds, doing),
                                       hint=_DEADLINE_HINT) from None
            reason = _first_line(exc)[:200]
            if "timeout" in type(exc).__name__.lower() or isinstance(exc, TimeoutError):
                reason = f"no answer within {session.limits.read_timeout_seconds:g} s ({reason})"
            raise UnavailableError(
                f"cannot reach the Hugging Face Hub at {self.endpoint} to look up {self.ref!r}: {reason}",
                hint=f"{self._did_you_mean()}check the network or proxy, or set HF_ENDPOINT to a mirror; a model "
                "fetched once is cached and works offline; a local directory or config.json needs no network") \
                from None

    def _status_error(self, exc: hub_http.HubStatusError, api: bool) -> TrainfitError:
        """huggingface_hub's reading of an error status (hf_raise_for_status), from the status and
        the X-Error-Code header alone."""
        status, code = exc.status, exc.error_code
        if code == "GatedRepo":
            return UnavailableError(
                f"model {self.ref!r} is gated on the Hugging Face Hub: its files need an accepted licence and a token",
                hint=f"accept the licence at {self.endpoint}/{self.repo_id} while logged in, then set HF_TOKEN to a "
                "read token of that account or run 'hf auth login'")
        if code == "RevisionNotFound":
            return BadInputError(f"model {self.repo_id!r}: revision {self.revision!r} not found on the Hugging Face "
                                 "Hub", hint="give a branch, tag or commit of the repository after '@', or leave it "
                                 "out for main")
        invalid_token = exc.error_message == "Invalid credentials in Authorization header"
        if code == "RepoNotFound" or (api and (status == 404 or (status == 401 and not invalid_token))):
            return BadInputError(
                f"unknown model {self.ref!r}: not in the catalog, not a local path, and not found on the Hugging "
                f"Face Hub ({self.endpoint})",
                hint=f"{self._did_you_mean()}see 'trainfit models' for the catalog; a private repository needs "
                "HF_TOKEN; a local directory, a config.json or a shape such as 'shape:125m' also work")
        if status in (401, 403):
            return UnavailableError(
                f"the Hugging Face Hub refused access to {self.ref!r} (HTTP {status})",
                hint=f"set HF_TOKEN to a read token with access; a gated model also needs its licence accepted at "
                f"{self.endpoint}/{self.repo_id}")
        return UnavailableError(f"the Hugging Face Hub ({self.endpoint}) answered {exc} for {self.ref!r}",
                                hint="try again later; HF_HUB_OFFLINE=1 uses only cached models")


_DEADLINE_HINT = (f"set {DEADLINE_ENV} to more seconds on a slow connection; a model fetched once is cached and "
                  "works offline (HF_HUB_OFFLINE=1)")
_SERVER_HINT = ("the server does not answer as the Hugging Face Hub does: check HF_ENDPOINT, or try again later; "
                "HF_HUB_OFFLINE=1 uses only cached models")
_LIMIT_HINT = ("trainfit reads only config.json, the shard index and safetensors headers, each a small file in a "
               "real model repository")


def _is_dtype_elements(counts: Any) -> bool:
    return isinstance(counts, dict) and all(isinstance(d, str) and type(n) is int and n >= 0
                                            for d, n in counts.items())


def _is_network_error(exc: BaseException) -> bool:
    """Connection refused, DNS failure, timeout, TLS error...: the exception classes of the HTTP
    stacks huggingface_hub has used (requests, httpx, httpx2) plus the standard library's."""
    root = type(exc).__module__.split(".")[0]
    return root in {"requests", "urllib3", "httpx", "httpx2", "httpcore", "ssl"} or isinstance(exc, OSError)


def _request_headers() -> dict[str, str]:
    """huggingface_hub's request headers (user agent, the token of HF_TOKEN or 'hf auth login'),
    each a value HTTP can carry. huggingface_hub is imported here, on the first fetch only."""
    try:
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers()
    except ImportError:
        raise UnavailableError("fetching a model from the Hugging Face Hub needs the package 'huggingface_hub'",
                               hint="install it with: pip install 'huggingface_hub>=1.0'") from None
    except ValueError as exc:  # it reads HF_HUB_ETAG_TIMEOUT and others with int() at import
        raise BadInputError(f"huggingface_hub refused the environment: {_first_line(exc)[:120]}",
                            hint="check the HF_* environment variables: timeouts are whole seconds") from None
    for name, value in headers.items():
        if not (isinstance(value, str) and value.isascii() and value.isprintable()):
            what = "HF_TOKEN (or the token saved by 'hf auth login')" if name.lower() == "authorization" else name
            raise BadInputError(f"{what}: holds characters an HTTP header cannot carry (non-ASCII or control)",
                                hint="a Hugging Face token is ASCII letters and digits, 'hf_...'")
    return headers
