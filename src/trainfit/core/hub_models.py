"""Models on the Hugging Face Hub that are not in the catalog ("owner/name", "owner/name@revision").

`load_hub_model` fetches the repository's config.json and, for the exact parameter count and the
stored dtype, only the JSON headers of its safetensors files (HTTP Range requests made by
huggingface_hub), never the weights. Which files count is what transformers loads: the shards
listed in model.safetensors.index.json, else model.safetensors. Parsing and validation are
model_loader's, the same as for a local model directory; nothing from the repository is executed.

What was fetched (config.json, the checked headers, the commit) is kept as one small JSON file per
(endpoint, repository, revision) under trainfit's cache directory, so a second call makes no
request and works offline. Environment: HF_ENDPOINT (a mirror, or the tests' fake hub), HF_TOKEN
(gated and private repositories), HF_HUB_OFFLINE=1 (cache only), HF_HUB_DOWNLOAD_TIMEOUT (seconds
per request, default 10), TRAINFIT_CACHE_DIR or XDG_CACHE_HOME (where the cache lives).
huggingface_hub is imported only when a request is about to be made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainfit.core import model_loader
from trainfit.core.model_spec import ModelSpec
from trainfit.errors import BadInputError, TrainfitError, UnavailableError

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
DEFAULT_TIMEOUT_SECONDS = 10.0
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CACHE_FORMAT = 1
_MAX_PARALLEL_HEADERS = 8
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's reading of boolean environment variables
# A Hub repo id: "owner/name", each part letters, digits, "_", "-", "." (not first or last), at
# most 96 characters; then an optional "@revision" (branch, tag, commit, "refs/pr/1").
_PART = r"\w(?:[\w.-]{0,94}\w)?"
_HUB_REF = re.compile(rf"({_PART}/{_PART})(?:@([\w][\w./+-]{{0,254}}))?", re.ASCII)


def parse_ref(ref: str) -> tuple[str, str | None] | None:
    """("owner/name", revision or None) when `ref` reads as a Hub model id, else None."""
    m = _HUB_REF.fullmatch(ref)
    if m is None or ".." in ref or "--" in m.group(1) or m.group(1).endswith((".git", ".json")):
        return None
    return m.group(1), m.group(2)


def cache_dir() -> Path:
    """trainfit's cache directory (trainfit.user_cache); Hub entries live in its "hub" folder."""
    from trainfit.user_cache import user_cache_dir

    return user_cache_dir()


def load_hub_model(repo_id: str, revision: str | None = None, *,
                   suggestions: Callable[[], list[str]] = list) -> ModelSpec:
    """A ModelSpec for a Hub repository: from trainfit's cache, else from the Hub (then cached).
    `suggestions` gives catalog names close to the reference, for the hints of the errors.
    BadInputError: no such repository / revision / config.json, a config or header trainfit
    refuses. UnavailableError: offline and not cached, Hub unreachable, access refused."""
    hub = _Hub(repo_id, revision or DEFAULT_REVISION, suggestions)
    entry = hub.read_cache()
    if entry is None:
        if _offline():
            raise hub.offline_error()
        entry = hub.fetch()
        hub.write_cache(entry)
    return hub.spec(entry)


def _offline() -> bool:
    """HF_HUB_OFFLINE (else TRANSFORMERS_OFFLINE) read now, as huggingface_hub reads it at import."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def _timeout() -> float:
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or DEFAULT_TIMEOUT_SECONDS)
    except ValueError:
        return DEFAULT_TIMEOUT_SECONDS


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


class _Hub:
    """One repository at one revision on one endpoint: its cache file, fetch, and error messages."""

    def __init__(self, repo_id: str, revision: str, suggestions: Callable[[], list[str]]):
        self.repo_id, self.revision, self.suggestions = repo_id, revision, suggestions
        self.endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.ref = repo_id if revision == DEFAULT_REVISION else f"{repo_id}@{revision}"
        key = hashlib.sha256(f"{self.endpoint}\n{repo_id.lower()}\n{revision}".encode()).hexdigest()[:16]
        safe_rev = re.sub(r"[^\w.-]", "_", revision)[:60]
        self.cache_path = cache_dir() / "hub" / repo_id.lower().replace("/", "--") / f"{safe_rev}.{key}.json"

    # -- cache ------------------------------------------------------------------------------

    def read_cache(self) -> dict[str, Any] | None:
        """The cached entry, or None when there is none or it is unreadable (then it is fetched again)."""
        try:
            entry = json.loads(self.cache_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        ok = (isinstance(entry, dict) and entry.get("format") == CACHE_FORMAT and isinstance(entry.get("repo_id"), str)
              and isinstance(entry.get("config"), dict) and isinstance(entry.get("headers"), dict)
              and all(isinstance(h, dict) for h in entry["headers"].values()))
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
        """The ModelSpec of a fetched or cached entry; the headers are checked again either way."""
        sha = entry.get("sha") if isinstance(entry.get("sha"), str) else None
        spec = model_loader.spec_from_config(entry["config"], origin=self._origin(CONFIG_FILE),
                                             model_id=entry["repo_id"])
        headers = [model_loader.parse_header(json.dumps(h).encode(), self._origin(name))
                   for name, h in entry["headers"].items()]
        spec = model_loader.with_safetensors_params(spec, entry["config"], model_loader.params_from_headers(headers))
        commit = f", commit {sha}" if sha else ""
        return dataclasses.replace(spec, source=f"{self._url(CONFIG_FILE)} (Hugging Face Hub, revision "
                                                f"{self.revision}{commit})")

    def _url(self, filename: str) -> str:
        return f"{self.endpoint}/{self.repo_id}/blob/{self.revision}/{filename}"

    def _origin(self, filename: str) -> str:
        return f"{self.ref}: {filename}"

    # -- fetch ------------------------------------------------------------------------------

    def fetch(self) -> dict[str, Any]:
        """config.json and the checked safetensors headers from the Hub, pinned to one commit."""
        hf = _import_hub()
        api = hf.HfApi(endpoint=self.endpoint)
        with self._errors(hf):
            info = api.model_info(self.repo_id, revision=self.revision, timeout=_timeout())
            sha = info.sha if isinstance(info.sha, str) else None
            pinned = sha or self.revision  # every file from the same commit, even if the branch moves meanwhile
            files = None if info.siblings is None else {s.rfilename for s in info.siblings}
            if files is not None and CONFIG_FILE not in files:
                raise self._no_config()
            config = self._get_json(hf, CONFIG_FILE, pinned)
            # Refuse an unsupported or remote-code config before fetching any header.
            model_loader.spec_from_config(config, origin=self._origin(CONFIG_FILE), model_id=self.repo_id)
            shards = self._shards(hf, files, pinned)
            headers = self._headers(hf, api, shards, pinned)
        repo_id = info.id if isinstance(info.id, str) and parse_ref(info.id) else self.repo_id
        return {"format": CACHE_FORMAT, "endpoint": self.endpoint, "repo_id": repo_id, "revision": self.revision,
                "sha": sha, "config": config, "headers": headers}

    def _shards(self, hf: Any, files: set[str] | None, revision: str) -> list[str]:
        """The safetensors files transformers would load: the index's shards, else model.safetensors."""
        if files is None:  # an endpoint that lists no files: ask for each
            index = self._get_json(hf, INDEX_FILE, revision, missing_ok=True)
            if index is None:
                return [SINGLE_FILE] if self._exists(hf, SINGLE_FILE, revision) else []
        elif INDEX_FILE in files:
            index = self._get_json(hf, INDEX_FILE, revision)
        else:
            return [SINGLE_FILE] if SINGLE_FILE in files else []
        names = model_loader.shard_names(index.get("weight_map"), self._origin(INDEX_FILE))
        for name in names:
            if files is not None and name not in files:
                raise BadInputError(f"{self._origin(INDEX_FILE)}: lists {name!r}, which the repository does not have")
        return names

    def _headers(self, hf: Any, api: Any, shards: list[str], revision: str) -> dict[str, dict[str, Any]]:
        if len(shards) <= 1:
            return {name: self._header(hf, api, name, revision) for name in shards}
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL_HEADERS, len(shards)))
        try:
            found = list(pool.map(lambda name: self._header(hf, api, name, revision), shards))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return dict(zip(shards, found))

    def _header(self, hf: Any, api: Any, name: str, revision: str) -> dict[str, Any]:
        """One file's safetensors header through huggingface_hub (first 100 kB, then the rest if
        the header is longer), checked by model_loader.parse_header like a local file's."""
        origin = self._origin(name)
        kwargs = {"timeout": _timeout()} if _accepts_timeout(api.parse_safetensors_file_metadata) else {}
        try:
            meta = api.parse_safetensors_file_metadata(self.repo_id, name, revision=revision, **kwargs)
        except hf.SafetensorsParsingError as exc:
            # "Failed to parse safetensors header for 'f' (repo 'r', revision 'v'): REASON. Please make sure..."
            reason = re.search(r"\): (.+?)(?:\. Please|$)", _first_line(exc))
            raise BadInputError(f"{origin}: not a valid safetensors file"
                                + (f" ({reason.group(1).rstrip('.')})" if reason else "")) from None
        except hf.EntryNotFoundError:
            raise BadInputError(f"{self._origin(INDEX_FILE)}: lists {name!r}, which the repository does not have") \
                from None
        except hf.HfHubHTTPError as exc:
            if _status(exc) == 416:  # the header length points past the end of the file
                raise BadInputError(f"{origin}: safetensors header length exceeds the file (corrupt file?)") from None
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, struct.error):
            # huggingface_hub's reader on bytes that are not a header ({"w": []}, offsets not a
            # list; a file shorter than 8 bytes before huggingface_hub 0.2x checked for it)
            raise BadInputError(f"{origin}: safetensors header is malformed") from None
        raw = {"__metadata__": meta.metadata or {}}
        for tensor, t in meta.tensors.items():
            offsets = t.data_offsets
            raw[tensor] = {"dtype": t.dtype, "shape": t.shape,
                           "data_offsets": list(offsets) if isinstance(offsets, (list, tuple)) else offsets}
        return model_loader.parse_header(json.dumps(raw).encode(), origin)

    def _get_json(self, hf: Any, filename: str, revision: str, missing_ok: bool = False) -> dict[str, Any] | None:
        """A small JSON file of the repository, through huggingface_hub's session (endpoint, token,
        offline mode and error classes are the library's)."""
        url = hf.hf_hub_url(self.repo_id, filename, revision=revision, endpoint=self.endpoint)
        try:
            response = hf.get_session().get(url, headers=hf.build_hf_headers(), timeout=_timeout())
            hf.hf_raise_for_status(response)
        except hf.EntryNotFoundError:
            if missing_ok:
                return None
            if filename == CONFIG_FILE:
                raise self._no_config() from None
            raise BadInputError(f"{self.ref}: {filename} not found in the repository") from None
        try:
            data = json.loads(response.content)
        except (ValueError, UnicodeDecodeError):
            raise BadInputError(f"{self._origin(filename)}: not valid JSON") from None
        if not isinstance(data, dict):
            raise BadInputError(f"{self._origin(filename)}: expected a JSON object")
        return data

    def _exists(self, hf: Any, filename: str, revision: str) -> bool:
        url = hf.hf_hub_url(self.repo_id, filename, revision=revision, endpoint=self.endpoint)
        response = hf.get_session().head(url, headers=hf.build_hf_headers(), timeout=_timeout())
        if response.status_code == 404:
            return False
        hf.hf_raise_for_status(response)
        return True

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
    def _errors(self, hf: Any) -> Iterator[None]:
        """huggingface_hub's exceptions as trainfit errors with the exit code that fits them."""
        try:
            yield
        except TrainfitError:
            raise
        except hf.GatedRepoError:
            raise UnavailableError(
                f"model {self.ref!r} is gated on the Hugging Face Hub: its files need an accepted licence and a token",
                hint=f"accept the licence at {self.endpoint}/{self.repo_id} while logged in, then set HF_TOKEN to a "
                "read token of that account or run 'hf auth login'") from None
        except hf.RepositoryNotFoundError:
            raise BadInputError(
                f"unknown model {self.ref!r}: not in the catalog, not a local path, and not found on the Hugging "
                f"Face Hub ({self.endpoint})",
                hint=f"{self._did_you_mean()}see 'trainfit models' for the catalog; a private repository needs "
                "HF_TOKEN; a local directory, a config.json or a shape such as 'shape:125m' also work") from None
        except hf.RevisionNotFoundError:
            raise BadInputError(f"model {self.repo_id!r}: revision {self.revision!r} not found on the Hugging Face Hub",
                                hint="give a branch, tag or commit of the repository after '@', or leave it out "
                                "for main") from None
        except hf.OfflineModeIsEnabled:
            raise self.offline_error() from None
        except hf.HfHubHTTPError as exc:
            status = _status(exc)
            if status in (401, 403):
                raise UnavailableError(
                    f"the Hugging Face Hub refused access to {self.ref!r} (HTTP {status})",
                    hint=f"set HF_TOKEN to a read token with access; a gated model also needs its licence accepted at "
                    f"{self.endpoint}/{self.repo_id}") from None
            raise UnavailableError(f"the Hugging Face Hub ({self.endpoint}) answered HTTP {status or '?'} for "
                                   f"{self.ref!r}: {_first_line(exc)}",
                                   hint="try again later; HF_HUB_OFFLINE=1 uses only cached models") from None
        except Exception as exc:
            if not _is_network_error(exc):
                raise
            reason = _first_line(exc)
            if "timeout" in type(exc).__name__.lower() or isinstance(exc, TimeoutError):
                reason = f"no answer within {_timeout():g} s ({reason})"
            raise UnavailableError(
                f"cannot reach the Hugging Face Hub at {self.endpoint} to look up {self.ref!r}: {reason}",
                hint=f"{self._did_you_mean()}check the network or proxy, or set HF_ENDPOINT to a mirror; a model "
                "fetched once is cached and works offline; a local directory or config.json needs no network") \
                from None


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _is_network_error(exc: BaseException) -> bool:
    """Connection refused, DNS failure, timeout, TLS error...: the exception classes of the HTTP
    stacks huggingface_hub has used (requests, httpx, httpx2) plus the standard library's."""
    root = type(exc).__module__.split(".")[0]
    return root in {"requests", "urllib3", "httpx", "httpx2", "httpcore", "ssl"} or isinstance(exc, OSError)


def _accepts_timeout(fn: Callable[..., Any]) -> bool:
    import inspect

    try:
        return "timeout" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _import_hub() -> Any:
    """huggingface_hub's pieces this module uses, imported on the first fetch only."""
    try:
        import huggingface_hub as hub
        from huggingface_hub import utils
    except ImportError:
        raise UnavailableError("fetching a model from the Hugging Face Hub needs the package 'huggingface_hub'",
                               hint="install it with: pip install 'huggingface_hub>=0.23'") from None
    import types

    return types.SimpleNamespace(
        HfApi=hub.HfApi, hf_hub_url=hub.hf_hub_url, get_session=utils.get_session,
        build_hf_headers=utils.build_hf_headers, hf_raise_for_status=utils.hf_raise_for_status,
        **{name: getattr(utils, name) for name in (
            "EntryNotFoundError", "GatedRepoError", "HfHubHTTPError", "OfflineModeIsEnabled",
            "RepositoryNotFoundError", "RevisionNotFoundError", "SafetensorsParsingError")})
