"""The Sources of the machine this process runs on (the fakes build the same from fixtures)."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

from trainfit.hardware.sources import Commands, Fs, PlatformFacts, Sources
from trainfit.hardware.storage import measure_disk


def _import_nvml() -> Any:
    import pynvml  # nvidia-ml-py; loads libnvidia-ml lazily in nvmlInit

    return pynvml


def _import_amdsmi() -> Any:
    import amdsmi  # type: ignore[import-not-found]

    return amdsmi


def live_sources() -> Sources:
    import psutil

    return Sources(
        fs=Fs("/"),
        commands=Commands(),
        platform=PlatformFacts(
            system=platform.system(),
            release=platform.release(),
            machine=platform.machine(),
            hostname=socket.gethostname(),
            python_version=platform.python_version(),
        ),
        env=dict(os.environ),
        cwd=os.getcwd(),
        nvml=_import_nvml,
        amdsmi=_import_amdsmi,
        psutil=psutil,
        disk_bench=measure_disk,
    )
