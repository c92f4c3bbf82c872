"""Bounded HTTP for Hub lookups: one deadline for the whole lookup, every answer read as a stream
and counted before and after decompressing, redirects followed by hand, nothing read that was not
asked for.

A server may be slow, endless or hostile (one byte every few seconds, a gzip bomb, 3 GB where a
100 kB range was asked, a redirect loop): each of those ends in a `HubLimitError` that says which
limit was hit, within the deadline and with a few MiB of memory. The per-read timeout
(HF_HUB_DOWNLOAD_TIMEOUT) bounds one silent wait; the deadline (TRAINFIT_HUB_DEADLINE) bounds the
sum of all of them. httpx (huggingface_hub's HTTP stack) does the protocol; it is imported only
when a request is about to be made.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from trainfit.errors import BadInputError, UnavailableError
from trainfit.validate import nested_deeper_than

T = TypeVar("T")
R = TypeVar("R")
_CHUNK_BYTES = 64 << 10
# Deeper than any config.json, index or model info (a few levels); shallow enough that nothing
# recursive downstream (serialisers, the cache) can run out of stack.
MAX_JSON_DEPTH = 64


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one Hub lookup may spend: wall time, one silent wait, bytes per kind of answer and in
    total (the total bounds memory: everything read is held until the lookup ends)."""

    deadline_seconds: float = 60.0
    read_timeout_seconds: float = 10.0
    model_info_bytes: int = 4 << 20  # the API's JSON about the repository (a few kB; ~60 B per file listed)
    config_bytes: int = 1 << 20  # config.json: a few kB for any real model
    index_bytes: int = 16 << 20  # model.safetensors.index.json: ~9 MB for DeepSeek-V3's 91k tensors
    header_bytes: int = 8 << 20  # one safetensors JSON header (a shard's is ~0.1-2 MB)
    total_bytes: int = 32 << 20  # everything one lookup reads, after decompressing
    # Keys and values (":" and "," counted) of one JSON document: parsed JSON takes ~10x its bytes
    # when made of the smallest items. DeepSeek-V3's index has ~2x 91k; a header of the smallest
    # tensor entries, 9 per entry, ~1.2M in header_bytes.
    max_json_items: int = 1_500_000
    max_shards: int = 1024  # safetensors files whose headers are read (DeepSeek-V3: 163, Llama-3.1-405B: 191)
    max_redirects: int = 5
    parallel_requests: int = 8


class HubLimitError(Exception):
    """A limit was hit; `refused_model` when it is the repository's own file that is too big or
    malformed (exit 2), else the server or the connection is at fault (exit 4)."""

    def __init__(self, message: str, *, refused_model: bool = False):
        super().__init__(message)
        self.refused_model = refused_model

    def as_trainfit_error(self, hint: str) -> BadInputError | UnavailableError:
        cls = BadInputError if self.refused_model else UnavailableError
        return cls(str(self), hint=hint)


class HubDeadlineError(HubLimitError):
    """The lookup's deadline passed (exit 4)."""


class HubStatusError(Exception):
    """An HTTP error status; its body is never read (it could be anything, of any size)."""

    def __init__(self, status: int, url: str, headers: Any):
        self.status, self.url = status, url
        self.error_code = _header_text(headers, "x-error-code")
        self.error_message = _header_text(headers, "x-error-message")
        super().__init__(f"HTTP {status}" + (f": {self.error_message}" if self.error_message else ""))


def _header_text(headers: Any, name: str) -> str | None:
    value = headers.get(name)
    return None if value is None else str(value)[:120]


class Session:
    """The requests of one lookup: one client, one deadline, one byte budget (thread-safe)."""

    def __init__(self, limits: Limits, endpoint: str, headers: dict[str, str], started: float | None = None):
        self.limits = limits
        self.endpoint_origin = _origin(endpoint)
        self.headers = headers
        self.deadline = (time.monotonic() if started is None else started) + limits.deadline_seconds
        self._httpx = _import_httpx()
        try:  # the proxy settings of the environment (HTTPS_PROXY, ALL_PROXY...) are read here
            self._client = self._httpx.Client(follow_redirects=False, timeout=None)
        except ImportError as exc:  # a socks:// proxy without httpx[socks]
            raise UnavailableError(f"the HTTP client cannot use the proxy settings: {str(exc)[:160]}",
                                   hint="install the missing package, or unset the *_PROXY variables") from None
        except ValueError as exc:  # a proxy URL of an unknown scheme
            raise BadInputError(f"the proxy settings (HTTPS_PROXY, ALL_PROXY...) are refused: {str(exc)[:160]}",
                                hint="give an http://, https:// or socks5:// proxy URL") from None
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.requests = 0
        self.doing = ""  # the answer last asked for, named when the deadline passes
        self.cancelled = False

    # -- time -------------------------------------------------------------------------------

    def remaining_seconds(self) -> float:
        return self.deadline - time.monotonic()

    def check_deadline(self, what: str) -> None:
        if self.cancelled:  # another request of the lookup failed: its error is the one reported
            raise HubLimitError(f"{what}: given up, another request of the lookup failed")
        if self.remaining_seconds() <= 0:
            raise HubDeadlineError(deadline_message(self.limits.deadline_seconds, what))

    def _timeout(self, what: str) -> Any:
        """Every wait of one request: the per-read timeout, never past the deadline."""
        self.check_deadline(what)
        return self._httpx.Timeout(max(0.01, min(self.limits.read_timeout_seconds, self.remaining_seconds())))

    # -- requests ---------------------------------------------------------------------------

    def get(self, url: str, what: str, max_bytes: int, *, refused_model: bool = True) -> bytes:
        """The whole body of a GET, at most `max_bytes` after decompressing (more is refused: exit 2
        when `refused_model`, the answer being a file of the repository, else 4)."""
        with self._open("GET", url, what, {"Accept-Encoding": "gzip, deflate"}) as response:
            return self._read(response, what, max_bytes, prefix=False, refused_model=refused_model)

    def get_range(self, url: str, what: str, start: int, end: int) -> bytes:
        """Bytes start..end (inclusive) of a file, or fewer when the file is shorter. A server that
        ignores Range and sends the whole file is read only as far as `end`, then dropped."""
        headers = {"Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
        with self._open("GET", url, what, headers) as response:
            if response.status_code == 206:
                first = _content_range_start(response.headers.get("content-range"))
                if first != start:
                    raise HubLimitError(f"{what}: the server's partial answer does not start at byte {start} "
                                        "(Content-Range missing or elsewhere)")
                return self._read(response, what, end - start + 1, prefix=True)
            return self._read(response, what, end + 1, prefix=True)[start:]  # 200: the file from byte 0

    def exists(self, url: str, what: str) -> bool:
        """HEAD: True for 2xx and redirects (the Hub redirects large files to its CDN), False for 404."""
        try:
            with self._open("HEAD", url, what, {}, follow=False):
                return True
        except HubStatusError as exc:
            if exc.status == 404:
                return False
            raise

    def _open(self, method: str, url: str, what: str, headers: dict[str, str], follow: bool = True) -> Any:
        """The response to `method url` after at most max_redirects redirects (followed here, so that
        no redirect's body is ever read); HubStatusError for an error status. A context manager."""
        self.doing = what
        for _ in range(self.limits.max_redirects + 1):
            request = self._client.build_request(method, url, headers={**self._headers_for(url), **headers},
                                                 timeout=self._timeout(what))
            with self._lock:
                self.requests += 1
            response = self._client.send(request, stream=True, follow_redirects=False)
            status = response.status_code
            if follow and 300 <= status < 400:
                response.close()
                location = response.headers.get("location")
                if status not in (301, 302, 303, 307, 308) or not location:
                    raise HubLimitError(f"{what}: HTTP {status} without a redirect to follow")
                url = urllib.parse.urljoin(url, location)
                if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                    raise HubLimitError(f"{what}: redirected to a URL that is not http(s)")
                continue
            if status >= 400:
                response.close()
                raise HubStatusError(status, url, response.headers)
            return _Closing(response)
        raise HubLimitError(f"{what}: more than {self.limits.max_redirects} redirects")

    def _headers_for(self, url: str) -> dict[str, str]:
        """The token goes to the endpoint only, never to the host a redirect points at (a CDN)."""
        if _origin(url) == self.endpoint_origin:
            return dict(self.headers)
        return {k: v for k, v in self.headers.items() if k.lower() != "authorization"}

    def _read(self, response: Any, what: str, max_bytes: int, *, prefix: bool, refused_model: bool = True) -> bytes:
        """The body, counted as it arrives (before and after decompressing) and charged to the
        lookup's total. `prefix`: keep the first max_bytes and stop reading; else more is refused."""
        decoder = _decoder(response.headers.get("content-encoding"), what)
        declared = _content_length(response.headers.get("content-length"))
        if not prefix and decoder is None and declared is not None and declared > max_bytes:
            raise _too_large(what, max_bytes, f"the server announces {declared:,} bytes", refused_model)
        body = bytearray()
        raw_bytes = 0
        for chunk in response.iter_raw():  # each network read as it comes, so the deadline is checked between them
            self.check_deadline(what)
            raw_bytes += len(chunk)
            before = len(body)
            if decoder is None:
                body += chunk[: max_bytes + 1 - len(body)]
            else:
                try:
                    body += decoder.decompress(chunk, max_bytes + 1 - len(body))
                except zlib.error:
                    raise HubLimitError(f"{what}: the server's compressed answer is corrupt") from None
                if decoder.unconsumed_tail and not prefix:
                    raise _too_large(what, max_bytes, "after decompressing", refused_model)
            raw_too_large = raw_bytes > max(max_bytes, _CHUNK_BYTES) * 2  # compressed, yet larger than the cap
            if len(body) > max_bytes or raw_too_large:
                if prefix:
                    del body[max_bytes:]
                    break
                detail = "before decompressing" if raw_too_large else "after decompressing" if decoder else ""
                raise _too_large(what, max_bytes, detail, refused_model)
            self._charge(len(body) - before, what)  # as it arrives: parallel reads share the one total
        return bytes(body)

    def _charge(self, n_bytes: int, what: str) -> None:
        with self._lock:
            self.bytes_read += n_bytes
            over = self.bytes_read > self.limits.total_bytes
        if over:
            raise HubLimitError(f"{what}: the lookup read more than {_mib(self.limits.total_bytes)} in all, "
                                "trainfit's limit for one model's metadata", refused_model=True)

    def map_parallel(self, fn: Callable[[T], R], items: list[T]) -> list[R]:
        """fn over items on up to parallel_requests daemon threads (never joined: a lookup given up
        cannot hold the process). The first error is raised at once, without waiting for the
        requests still under way; they stop at their next read (the session is cancelled)."""
        if len(items) <= 1:
            return [fn(item) for item in items]
        results: list[Any] = [None] * len(items)
        errors: list[BaseException] = []
        left = [len(items)]
        queue: Iterator[int] = iter(range(len(items)))
        lock = threading.Lock()
        finished = threading.Event()

        def work() -> None:
            while True:
                with lock:
                    i = None if errors else next(queue, None)
                if i is None:
                    return
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                    with lock:
                        errors.append(exc)
                    self.cancelled = True
                    finished.set()
                    return
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        finished.set()

        for _ in range(min(self.limits.parallel_requests, len(items))):
            threading.Thread(target=work, daemon=True, name="trainfit-hub").start()
        finished.wait()
        if errors:
            raise errors[0]
        return results


class _Closing:
    """A streamed response as a context manager that always closes it (drops the connection when
    the body was not read to its end)."""

    def __init__(self, response: Any):
        self.response = response

    def __enter__(self) -> Any:
        return self.response

    def __exit__(self, *exc: object) -> None:
        self.response.close()


def _decoder(encoding: str | None, what: str) -> Any:
    """A bounded zlib decoder for gzip / deflate, None for identity; anything else is refused."""
    name = (encoding or "identity").strip().lower()
    if name in ("", "identity"):
        return None
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return zlib.decompressobj(zlib.MAX_WBITS)
    raise HubLimitError(f"{what}: the server sent Content-Encoding {name[:40]!r}; trainfit reads identity, gzip "
                        "or deflate")


def _content_length(value: str | None) -> int | None:
    text = (value or "").strip()
    return int(text) if _is_ascii_number(text) else None


def _content_range_start(value: str | None) -> int | None:
    # "bytes 0-99/1234"
    if not value or not value.startswith("bytes "):
        return None
    first = value[6:].split("-", 1)[0].strip()
    return int(first) if _is_ascii_number(first) else None


def _is_ascii_number(text: str) -> bool:
    """Digits 0-9 only ('²' and '١' are digits to str.isdigit, and int() refuses the first)."""
    return 0 < len(text) <= 20 and text.isascii() and text.isdigit()


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 20):g} MiB"


def _too_large(what: str, max_bytes: int, detail: str, refused_model: bool) -> HubLimitError:
    return HubLimitError(f"{what} is larger than {_mib(max_bytes)}" + (f" ({detail})" if detail else "")
                         + ", trainfit's limit for it", refused_model=refused_model)


def deadline_message(deadline_seconds: float, what: str) -> str:
    return (f"{what}: no complete answer within the {deadline_seconds:g} s deadline for one Hub lookup "
            "(TRAINFIT_HUB_DEADLINE)")


def check_items(data: bytes, what: str, max_items: int, *, refused_model: bool) -> None:
    """Refuse JSON of more than max_items keys and values before parsing it (":" and "," counted,
    those inside strings too: an overestimate, and a count at C speed)."""
    items = data.count(b":") + data.count(b",")
    if items > max_items:
        raise HubLimitError(f"{what}: holds about {items:,} JSON items, more than the {max_items:,} trainfit "
                            "parses", refused_model=refused_model)


def parse_document(data: bytes, what: str, max_items: int, *, refused_model: bool) -> dict[str, Any]:
    """A JSON object from a Hub answer: at most max_items items, valid UTF-8 JSON, an object, at
    most MAX_JSON_DEPTH deep."""
    check_items(data, what, max_items, refused_model=refused_model)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise HubLimitError(f"{what}: nested deeper than {MAX_JSON_DEPTH} levels", refused_model=refused_model) \
            from None
    except UnicodeDecodeError:
        raise HubLimitError(f"{what}: not UTF-8 JSON", refused_model=refused_model) from None
    except json.JSONDecodeError as exc:
        raise HubLimitError(f"{what}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                            refused_model=refused_model) from None
    except ValueError:  # an integer of more than 4,300 digits
        raise HubLimitError(f"{what}: holds a number too long to be real", refused_model=refused_model) from None
    if not isinstance(doc, dict):
        raise HubLimitError(f"{what}: expected a JSON object, got {type(doc).__name__}", refused_model=refused_model)
    if nested_deeper_than(doc, MAX_JSON_DEPTH):
        raise HubLimitError(f"{what}: nested deeper than {MAX_JSON_DEPTH} levels", refused_model=refused_model)
    return doc


def _import_httpx() -> Any:
    """huggingface_hub's HTTP library (httpx2 in huggingface_hub 2.x, httpx in 1.x)."""
    try:
        import httpx2 as httpx
    except ImportError:
        try:
            import httpx  # type: ignore[no-redef]
        except ImportError:
            raise UnavailableError("fetching a model from the Hugging Face Hub needs huggingface_hub>=1.0 "
                                   "(it brings httpx)", hint="pip install -U huggingface_hub") from None
    return httpx
