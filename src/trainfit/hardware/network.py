"""Download bandwidth, only against an endpoint the user configured (TRAINFIT_BANDWIDTH_URL or
--bandwidth-url): trainfit never contacts a server on its own."""

from __future__ import annotations

import time

from trainfit.core.machines.profile import NetworkInfo
from trainfit.hardware.sources import Sources

ENV_VAR = "TRAINFIT_BANDWIDTH_URL"
MAX_BYTES = 32 << 20  # enough for a steady rate on a 1 Gb/s link within the time budget
_CHUNK = 256 << 10


def probe_network(src: Sources, url: str | None = None, timeout_s: float = 3.0) -> NetworkInfo:
    endpoint = url or src.env.get(ENV_VAR) or None
    if not endpoint:
        return NetworkInfo(None, None, {"download_mbps": f"no endpoint configured (set {ENV_VAR})"})
    if not endpoint.startswith(("http://", "https://")):
        return NetworkInfo(endpoint, None, {"download_mbps": "endpoint must be an http(s) URL"})
    import urllib.error  # here, not at the top: urllib + http.client take ~30 ms to import
    import urllib.request

    received = 0
    try:
        t0 = time.perf_counter()
        with urllib.request.urlopen(endpoint, timeout=timeout_s) as resp:
            while received < MAX_BYTES and time.perf_counter() - t0 < timeout_s:
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                received += len(chunk)
        elapsed = time.perf_counter() - t0
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        return NetworkInfo(endpoint, None, {"download_mbps": f"download from {endpoint} failed: {why}"})
    if received == 0:
        return NetworkInfo(endpoint, None, {"download_mbps": f"{endpoint} returned no data"})
    return NetworkInfo(endpoint, round(received / elapsed / 1e6, 2), {})
