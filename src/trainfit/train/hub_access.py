"""Whether training may ask the Hugging Face Hub for a model's files, decided once per process.

huggingface_hub retries a failed request with back-off (five tries per file, and a run asks for
the tokenizer and then the weights): offline, a run waited about a minute before failing. Here:

* HF_HUB_OFFLINE (else TRANSFORMERS_OFFLINE) set: the cache only, never the network (read as
  huggingface_hub reads them: trainfit.hub.models.offline_variable);
* otherwise one TCP connection to the Hub's host (HF_ENDPOINT, default huggingface.co; one that is
  no http(s) URL with a host is exit 2, as for every command: trainfit.hub.models.check_endpoint), at most
  CONNECT_SECONDS: when it fails the files come from the cache only, and a model missing there is
  an UnavailableError at once, saying what was tried and what to do.

Behind an HTTP(S) proxy the direct connection says nothing, so no probe is made.
"""

from __future__ import annotations

import functools
import os
import socket

from trainfit.hub.models import check_endpoint, hub_endpoint, offline_variable

CONNECT_SECONDS = 5.0


def offline_reason() -> str | None:
    """Why the Hub is not to be asked (None: it may be). BadInputError: HF_ENDPOINT is no URL."""
    variable = offline_variable()
    if variable is not None:
        return f"{variable} is set"
    url = check_endpoint(hub_endpoint())
    if _behind_proxy():
        return None
    return _unreachable(url.hostname, url.port or (80 if url.scheme == "http" else 443))


def _behind_proxy() -> bool:
    return any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                          "all_proxy"))


@functools.lru_cache(maxsize=None)
def _unreachable(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_SECONDS):
            return None
    except OSError as exc:
        return f"{host}:{port} cannot be reached ({exc.strerror or type(exc).__name__})"


def offline_hint(model_id: str) -> str:
    return (f"connect to the network, or download it where there is one (huggingface-cli download {model_id}), "
            "copy the cache here and set HF_HUB_OFFLINE=1; or use model.path with weights: local")
