"""Whether training may ask the Hugging Face Hub for a model's files, decided once per process.

huggingface_hub retries a failed request with back-off (five tries per file, and a run asks for
the tokenizer and then the weights): offline, a run waited about a minute before failing. Here:

* HF_HUB_OFFLINE set: the cache only, never the network;
* otherwise one TCP connection to the Hub's host (HF_ENDPOINT, default huggingface.co), at most
  CONNECT_SECONDS: when it fails the files come from the cache only, and a model missing there is
  an UnavailableError at once, saying what was tried and what to do.

Behind an HTTP(S) proxy the direct connection says nothing, so no probe is made.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse

CONNECT_SECONDS = 5.0
_TRUE = {"1", "true", "yes", "on"}


def offline_reason() -> str | None:
    """Why the Hub is not to be asked (None: it may be)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return "HF_HUB_OFFLINE is set"
    return _unreachable(os.environ.get("HF_ENDPOINT") or "https://huggingface.co", _behind_proxy())


def _behind_proxy() -> bool:
    return any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                          "all_proxy"))


@functools.lru_cache(maxsize=None)
def _unreachable(endpoint: str, proxied: bool) -> str | None:
    if proxied:
        return None
    url = urlparse(endpoint)
    host = url.hostname
    if not host:
        return f"HF_ENDPOINT {endpoint[:80]!r} names no host"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_SECONDS):
            return None
    except OSError as exc:
        return f"{host}:{port} cannot be reached ({exc.strerror or type(exc).__name__})"


def offline_hint(model_id: str) -> str:
    return (f"connect to the network, or download it where there is one (huggingface-cli download {model_id}), "
            "copy the cache here and set HF_HUB_OFFLINE=1; or use model.path with weights: local")
