"""One reading of the machine while training runs: the contract between the sampler
(hardware/sampling.py), the monitor (train/monitor/live.py), the safety policies (train/monitor/safety.py) and
`trainfit report`.

Every field is measured or None; a None field has its reason in `unavailable` (the profile's
rule). Units are in the names. A Sample serialises to one `metrics.jsonl` record of kind
"sample" via `to_record()`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    index: int
    memory_used_bytes: int | None = None  # the driver's view (nvidia-smi): every process, context included
    memory_total_bytes: int | None = None
    # This process's allocator (torch.cuda.memory_allocated / memory_reserved), when torch is loaded.
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    utilization_percent: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_c: float | None = None
    slowdown_temperature_c: float | None = None  # where the GPU starts to throttle for heat
    sm_clock_mhz: float | None = None
    # NVML clock-event (throttle) reasons active now: "sw_thermal", "hw_slowdown", "sw_power_cap", ...
    throttle_reasons: tuple[str, ...] = ()
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HostSample:
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    process_rss_bytes: int | None = None
    cpu_percent: float | None = None  # whole machine, 0-100
    cpu_temperature_c: float | None = None  # hottest CPU package / core sensor
    cpu_throttle_events: int | None = None  # cumulative thermal throttle count (Linux)
    cpu_package_watts: float | None = None  # RAPL, averaged since the previous sample
    on_ac: bool | None = None
    battery_percent: float | None = None
    battery_seconds_left: float | None = None
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    time: float  # time.time() of the reading
    host: HostSample
    gpus: tuple[GpuSample, ...] = ()

    def to_record(self) -> dict[str, Any]:
        """The metrics.jsonl record: {"event": "sample", "time": ..., "host": {...}, "gpus": [...]}."""
        return {"event": "sample", "time": self.time, "host": asdict(self.host),
                "gpus": [asdict(g) for g in self.gpus]}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> "Sample":
        gpus = tuple(GpuSample(**{**g, "throttle_reasons": tuple(g.get("throttle_reasons") or ())})
                     for g in rec.get("gpus") or [])
        return cls(time=float(rec["time"]), host=HostSample(**(rec.get("host") or {})), gpus=gpus)
