"""The Sources of the machine this process runs on (the fakes build the same from fixtures)."""

from __future__ import annotations

import os
import platform
from typing import Any

from trainfit.hardware.sources import Commands, Fs, PlatformFacts, Sources
from trainfit.hardware.storage import measure_disk


# Where a Linux machine shows an NVIDIA driver: the loaded kernel module (/proc/driver/nvidia,
# also mounted into GPU containers), its control device, or WSL 2's GPU paravirtualisation device.
_NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def _import_nvml() -> Any:
    if platform.system() == "Linux" and not any(os.path.exists(p) for p in _NVIDIA_DRIVER_PATHS):
        # No driver, so no NVIDIA GPU: importing pynvml and loading NVML would only cost time.
        raise FileNotFoundError(f"no NVIDIA driver ({', '.join(_NVIDIA_DRIVER_PATHS)} absent)")
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
            hostname=platform.node(),  # uname nodename: what socket.gethostname() gives on Unix
            python_version=platform.python_version(),
        ),
        env=dict(os.environ),
        cwd=os.getcwd(),
        nvml=_import_nvml,
        amdsmi=_import_amdsmi,
        psutil=psutil,
        disk_bench=measure_disk,
    )
