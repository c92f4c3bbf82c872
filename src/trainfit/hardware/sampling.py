"""Repeated, cheap readings of the machine while training runs: one `Sample` per call.

`Sampler` is created once per run: what never changes during a run (NVML initialised, the GPU
handles this process sees, the GPUs' slowdown temperatures, which sensor files exist) is found
in `__init__`, so `sample()` only reads the values that move. NVML is shut down by `close()`.

Per GPU (NVML; the GPUs this process sees, CUDA_VISIBLE_DEVICES applied and numbered as CUDA
numbers them): memory used / total, utilisation, power and its enforced limit, temperature and
the slowdown threshold, SM clock, the clock-event (throttle) reasons active now; and this
process's torch allocator (allocated / reserved) when torch is already imported and has
initialised CUDA (torch is never imported here: sampling must not create a CUDA context).

Host (psutil and Linux sysfs): RAM used (total - available) / total, swap used, this process's
RSS, machine-wide CPU % since the previous sample, the hottest CPU package / core temperature,
the cumulative thermal-throttle count, RAPL package watts averaged since the previous sample,
AC / battery.

Each read is guarded: a field that cannot be read is None with its reason in `unavailable`,
never an exception. When no GPU is sampled, `host.unavailable["gpus"]` says why.
`python -m trainfit.hardware.sampling [N]` prints samples of this machine and the time one
`sample()` takes.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

from trainfit.hardware.nvml import CLOCK_SM, TEMPERATURE_GPU, THRESHOLD_SLOWDOWN, NvmlReader, decode_clock_events, \
    nvml_reason
from trainfit.hardware.sample_types import GpuSample, HostSample, Sample
from trainfit.hardware.sources import Sources, os_error_reason, read_int, read_text

_RAPL = "/sys/class/powercap"
_THERMAL = "/sys/class/thermal"
_CPU = "/sys/devices/system/cpu"
# psutil.sensors_temperatures() chips that are the CPU (Intel coretemp, AMD k10temp/zenpower,
# ARM SoC sensors). acpitz is a motherboard zone, not the CPU, and is not used.
CPU_SENSOR_CHIPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "soc_thermal")
# /sys/class/thermal zone types that are the CPU (used when psutil lists no CPU chip).
CPU_THERMAL_ZONES = ("x86_pkg_temp", "cpu-thermal", "cpu_thermal", "soc_thermal", "cpu")


def _guard(reasons: dict[str, str], field: str, read: Callable[[], Any], what: str) -> Any:
    """read() or None with `reasons[field]` set: one failing read costs that field only."""
    try:
        value = read()
    except OSError as exc:
        reasons[field] = f"{what}: {os_error_reason(exc)}"
        return None
    except Exception as exc:  # a psutil / driver answer of an unexpected shape is a reason too
        reasons[field] = f"{what} failed: {type(exc).__name__}: {exc}"
        return None
    if value is None and field not in reasons:
        reasons[field] = f"{what} gave no value"
    return value


class _Gpu:
    """One GPU as this process sees it: the handle memory is read from (a MIG slice or the board)
    and the board's handle (utilisation, power, clocks and temperatures are per board)."""

    def __init__(self, index: int, mem: Any, board: Any, uuid: str | None) -> None:
        self.index, self.mem, self.board, self.uuid = index, mem, board, uuid
        self.slowdown_c: float | None = None
        self.slowdown_reason: str | None = None
        self.torch_index: int | None = None  # CUDA's number for it, found once CUDA is initialised


class Sampler:
    """Readings of this machine (or of a fixture machine's Sources), one `Sample` per `sample()`.

    `sources`: the live machine by default (hardware.live.live_sources()); tests pass fixture
    Sources (hardware.sample_fakes). `clock` stamps samples (time.time); `monotonic` times the
    RAPL energy deltas.
    """

    def __init__(self, sources: Sources | None = None, *, pid: int | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 gpus: bool = True) -> None:
        if sources is None:
            from trainfit.hardware.live import live_sources

            sources = live_sources()
        self.src = sources
        self._clock, self._mono = clock, monotonic
        self._linux = sources.platform.system == "Linux"
        self._nv: Any = None
        self._reader: NvmlReader | None = None
        self._gpus: list[_Gpu] = []
        self.gpu_note: str | None = None  # why no GPU is sampled (None when some are)
        self._torch_mapped = False
        self._init_host(pid)
        if gpus:
            self._init_gpus()
        else:
            self.gpu_note = "GPU sampling turned off"

    # ---- set-up (once) -----------------------------------------------------------------------
    def _init_host(self, pid: int | None) -> None:
        ps = self.src.psutil
        self._static: dict[str, str] = {}  # host fields known to be unreadable for the whole run
        try:
            self._proc = ps.Process(pid if pid is not None else os.getpid())
        except Exception as exc:
            self._proc = None
            self._static["process_rss_bytes"] = f"psutil.Process failed: {type(exc).__name__}: {exc}"
        try:
            ps.cpu_percent(interval=None)  # the first call only starts psutil's interval
        except Exception as exc:
            self._static["cpu_percent"] = f"psutil.cpu_percent failed: {type(exc).__name__}: {exc}"
        self._init_cpu_temperature()
        self._init_throttle_counters()
        self._init_rapl()

    def _init_cpu_temperature(self) -> None:
        self._temp_chips: tuple[str, ...] = ()
        self._temp_zones: list[str] = []
        ps = self.src.psutil
        try:
            found = ps.sensors_temperatures() if hasattr(ps, "sensors_temperatures") else {}
        except Exception:
            found = {}
        self._temp_chips = tuple(c for c in (found or {}) if c in CPU_SENSOR_CHIPS)
        if self._temp_chips:
            return
        if self._linux:
            try:
                zones = [z for z in self.src.fs.listdir(_THERMAL) if z.startswith("thermal_zone")]
            except OSError:
                zones = []
            for z in zones:
                kind = (read_text(self.src.fs, f"{_THERMAL}/{z}/type") or "").lower()
                if kind in CPU_THERMAL_ZONES:
                    self._temp_zones.append(f"{_THERMAL}/{z}/temp")
        if not self._temp_zones:
            self._static["cpu_temperature_c"] = (
                "no CPU temperature sensor (psutil lists no " + "/".join(CPU_SENSOR_CHIPS[:3])
                + " chip and no x86_pkg_temp / cpu thermal zone: a virtual machine, or a container without /sys)")

    def _init_throttle_counters(self) -> None:
        """The thermal_throttle counter files, once: one package counter per package and one core
        counter per physical core (hyper-thread siblings share theirs)."""
        self._throttle_files: list[str] = []
        if not self._linux:
            self._static["cpu_throttle_events"] = (f"thermal throttle counters are Linux sysfs; "
                                                   f"not on {self.src.platform.system}")
            return
        fs = self.src.fs
        try:
            cpus = sorted((c for c in fs.listdir(_CPU) if re.fullmatch(r"cpu\d+", c)), key=lambda c: int(c[3:]))
        except OSError:
            cpus = []
        packages: set[str] = set()
        cores: set[tuple[str, str]] = set()
        for c in cpus:
            base = f"{_CPU}/{c}"
            if not fs.exists(f"{base}/thermal_throttle"):
                continue
            pkg = read_text(fs, f"{base}/topology/physical_package_id") or c
            core = read_text(fs, f"{base}/topology/core_id") or c
            if pkg not in packages and fs.exists(f"{base}/thermal_throttle/package_throttle_count"):
                packages.add(pkg)
                self._throttle_files.append(f"{base}/thermal_throttle/package_throttle_count")
            if (pkg, core) not in cores and fs.exists(f"{base}/thermal_throttle/core_throttle_count"):
                cores.add((pkg, core))
                self._throttle_files.append(f"{base}/thermal_throttle/core_throttle_count")
        if not self._throttle_files:
            self._static["cpu_throttle_events"] = ("no thermal_throttle counters in sysfs (an Intel CPU's therm_throt "
                                                   "driver provides them; not on AMD CPUs or virtual machines)")

    def _init_rapl(self) -> None:
        self._rapl: list[tuple[str, int]] = []  # (energy_uj path, max_energy_range_uj)
        self._rapl_last: tuple[float, list[int]] | None = None
        if not self._linux:
            self._static["cpu_package_watts"] = f"RAPL is Linux powercap; not readable on {self.src.platform.system}"
            return
        fs = self.src.fs
        try:
            zones = [z for z in fs.listdir(_RAPL) if re.fullmatch(r"(intel|amd)-rapl:\d+", z)]
        except OSError:
            zones = []
        for z in zones:
            if (read_text(fs, f"{_RAPL}/{z}/name") or "").startswith("package"):
                self._rapl.append((f"{_RAPL}/{z}/energy_uj", read_int(fs, f"{_RAPL}/{z}/max_energy_range_uj") or 0))
        if not self._rapl:
            self._static["cpu_package_watts"] = ("no RAPL powercap package zone (not an Intel/AMD Zen CPU, "
                                                 "or a virtual machine)")

    def _init_gpus(self) -> None:
        try:
            nv = self.src.nvml()
        except FileNotFoundError as exc:  # no NVIDIA driver (hardware.live)
            self.gpu_note = str(exc)
            return
        except (ImportError, OSError) as exc:
            self.gpu_note = f"nvidia-ml-py not importable ({exc})"
            return
        except Exception as exc:
            self.gpu_note = f"loading NVML failed: {type(exc).__name__}: {exc}"
            return
        try:
            nv.nvmlInit()
        except Exception as exc:
            self.gpu_note = nvml_reason(exc)
            return
        self._nv, self._reader = nv, NvmlReader(nv)
        try:
            self._gpus = self._visible_gpus()
        except Exception as exc:  # a misbehaving NVML costs the GPU fields, never the run
            self._gpus = []
            self.gpu_note = f"listing GPUs through NVML failed: {type(exc).__name__}: {exc}"
        if not self._gpus and self.gpu_note is None:
            self.gpu_note = "NVML lists no GPU this process can use"
        for g in self._gpus:
            value, why = self._reader.call("nvmlDeviceGetTemperatureThreshold", g.board, THRESHOLD_SLOWDOWN,
                                           convert=_number)
            g.slowdown_c, g.slowdown_reason = value, why

    def _visible_gpus(self) -> list[_Gpu]:
        """Boards (or MIG slices) in CUDA's numbering: CUDA_VISIBLE_DEVICES indices or GPU-/MIG-
        UUID prefixes, in its order; every board (each MIG slice of a board in MIG mode) otherwise."""
        r = self._reader
        assert r is not None
        count, why = r.call("nvmlDeviceGetCount", convert=_count)
        if why:
            self.gpu_note = f"nvmlDeviceGetCount: {why}"
            return []
        boards = []
        for i in range(count):
            h, why = r.call("nvmlDeviceGetHandleByIndex", i)
            if why:
                continue
            uuid, _ = r.call("nvmlDeviceGetUUID", h, convert=_text)
            mig, _ = r.call("nvmlDeviceGetMigMode", h, convert=lambda m: bool(_count(m[0])))
            slices = []
            if mig:
                limit, _ = r.call("nvmlDeviceGetMaxMigDeviceCount", h, convert=_count)
                for j in range(limit or 0):
                    mh, why = r.call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
                    if not why:
                        slices.append((mh, r.call("nvmlDeviceGetUUID", mh, convert=_text)[0]))
            boards.append((i, h, uuid, slices))
        spec = self.src.env.get("CUDA_VISIBLE_DEVICES")
        if spec is None:
            out: list[_Gpu] = []
            for _, h, uuid, slices in boards:
                for mh, muuid in (slices or [(h, uuid)]):
                    out.append(_Gpu(len(out), mh, h, muuid))
            return out
        chosen: list[_Gpu] = []
        for item in (s.strip() for s in spec.split(",") if s.strip()):
            found = None
            if item.lstrip("-").isdigit():
                if int(item) < 0:
                    break  # CUDA stops at the first invalid entry
                found = next(((h, h, uuid) for i, h, uuid, _ in boards if i == int(item)), None)
            else:
                for _, h, uuid, slices in boards:
                    if uuid and uuid.startswith(item):
                        found = (h, h, uuid)
                    for mh, muuid in slices:
                        if muuid and muuid.startswith(item):
                            found = (mh, h, muuid)
            if found is None:
                break
            chosen.append(_Gpu(len(chosen), *found))
        if not chosen:
            self.gpu_note = f"CUDA_VISIBLE_DEVICES={spec!r} hides every NVIDIA GPU"
        return chosen

    # ---- one reading -------------------------------------------------------------------------
    def sample(self) -> Sample:
        now = self._clock()
        host = self._host()
        gpus = tuple(self._gpu(g) for g in self._gpus)
        if not gpus:
            host.unavailable["gpus"] = f"no GPU sampled: {self.gpu_note}"
        return Sample(time=now, host=host, gpus=gpus)

    def _host(self) -> HostSample:
        ps = self.src.psutil
        why: dict[str, str] = dict(self._static)
        v: dict[str, Any] = {}
        vm = _guard(why, "ram_total_bytes", ps.virtual_memory, "psutil.virtual_memory")
        if vm is not None:
            v["ram_total_bytes"] = _guard(why, "ram_total_bytes", lambda: int(vm.total), "virtual_memory.total")
            v["ram_used_bytes"] = _guard(why, "ram_used_bytes", lambda: int(vm.total - vm.available),
                                         "virtual_memory.total - available")
        else:
            why["ram_used_bytes"] = why["ram_total_bytes"]
        v["swap_used_bytes"] = _guard(why, "swap_used_bytes", lambda: _swap_used(ps.swap_memory()),
                                      "psutil.swap_memory")
        if self._proc is not None:
            v["process_rss_bytes"] = _guard(why, "process_rss_bytes", lambda: int(self._proc.memory_info().rss),
                                            "psutil.Process.memory_info")
        if "cpu_percent" not in self._static:
            v["cpu_percent"] = _guard(why, "cpu_percent", lambda: float(ps.cpu_percent(interval=None)),
                                      "psutil.cpu_percent")
        if "cpu_temperature_c" not in self._static:
            v["cpu_temperature_c"] = _guard(why, "cpu_temperature_c", self._cpu_temperature, "CPU temperature")
        if "cpu_throttle_events" not in self._static:
            v["cpu_throttle_events"] = _guard(why, "cpu_throttle_events", self._throttle_count,
                                              "thermal_throttle counters")
        if "cpu_package_watts" not in self._static:
            v["cpu_package_watts"] = self._rapl_watts(why)
        self._power(v, why)
        for name in ("ram_used_bytes", "ram_total_bytes", "swap_used_bytes", "process_rss_bytes", "cpu_percent",
                     "cpu_temperature_c", "cpu_throttle_events", "cpu_package_watts", "on_ac", "battery_percent",
                     "battery_seconds_left"):
            if v.get(name) is None:
                why.setdefault(name, "not read")
            else:
                why.pop(name, None)
        return HostSample(**v, unavailable=why)

    def _cpu_temperature(self) -> float | None:
        if self._temp_chips:
            found = self.src.psutil.sensors_temperatures()
            values = [float(e.current) for chip in self._temp_chips for e in (found.get(chip) or [])
                      if e.current is not None]
            if values:
                return max(values)
            if not self._temp_zones:
                raise LookupError(f"psutil.sensors_temperatures lists no reading for {', '.join(self._temp_chips)}")
        values = [int(self.src.fs.read(p)) / 1000 for p in self._temp_zones]
        return max(values) if values else None

    def _throttle_count(self) -> int:
        return sum(int(self.src.fs.read(p)) for p in self._throttle_files)

    def _rapl_watts(self, why: dict[str, str]) -> float | None:
        try:
            now = self._mono()
            energy = [int(self.src.fs.read(path)) for path, _ in self._rapl]
        except PermissionError:
            # root-only since the 2020 PLATYPUS mitigation: it will not become readable mid-run
            self._static["cpu_package_watts"] = why["cpu_package_watts"] = \
                "no permission: RAPL energy_uj is root-only (2020 PLATYPUS mitigation)"
            return None
        except (OSError, ValueError) as exc:
            why["cpu_package_watts"] = f"RAPL energy_uj unreadable: {exc}"
            return None
        last, self._rapl_last = self._rapl_last, (now, energy)
        if last is None:
            why["cpu_package_watts"] = "first reading: package power is the energy used between two samples"
            return None
        elapsed = now - last[0]
        if elapsed <= 0:
            why["cpu_package_watts"] = "no time passed since the previous sample"
            return None
        total_uj = 0
        for (_, wrap), before, after in zip(self._rapl, last[1], energy):
            delta = after - before
            if delta < 0:  # the counter wrapped around max_energy_range_uj
                delta += wrap
            total_uj += max(0, delta)
        return round(total_uj / 1e6 / elapsed, 2)

    def _power(self, v: dict[str, Any], why: dict[str, str]) -> None:
        from trainfit.hardware.power import PowerReadings, read_battery

        r = PowerReadings()
        try:
            read_battery(self.src, r)
        except Exception as exc:
            for name in ("on_ac", "battery_percent", "battery_seconds_left"):
                why[name] = f"reading battery / AC failed: {type(exc).__name__}: {exc}"
            return
        v["on_ac"], v["battery_percent"], v["battery_seconds_left"] = r.on_ac, r.battery_percent, r.battery_seconds_left
        for name in ("on_ac", "battery_percent", "battery_seconds_left"):
            if name in r.reasons:
                why[name] = r.reasons[name]

    def _gpu(self, g: _Gpu) -> GpuSample:
        r = self._reader
        assert r is not None
        v: dict[str, Any] = {}
        why: dict[str, str] = {}

        def put(field: str, fn: str, *args: Any, convert: Callable[[Any], Any] = lambda x: x,
                handle: Any = g.board) -> None:
            value, reason = r.call(fn, handle, *args, convert=convert)
            v[field] = value
            if reason or value is None:
                why[field] = reason or f"{fn} gave no value"

        mem, reason = r.call("nvmlDeviceGetMemoryInfo", g.mem)
        try:
            if reason is None:
                v["memory_total_bytes"] = int(mem.total)
                v["memory_used_bytes"] = int(mem.total - mem.free)  # nvidia-smi's "used"
        except Exception as exc:
            reason = f"unexpected value from nvmlDeviceGetMemoryInfo: {type(exc).__name__}: {exc}"
            v.pop("memory_total_bytes", None)
        if reason:
            why["memory_total_bytes"] = why["memory_used_bytes"] = reason
        # A MIG slice reports its board's utilisation, power, temperature and clocks (NVML has
        # none per slice); its memory is the slice's.
        put("utilization_percent", "nvmlDeviceGetUtilizationRates", convert=lambda u: float(u.gpu))
        put("power_watts", "nvmlDeviceGetPowerUsage", convert=lambda mw: _number(mw) / 1000)
        put("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", convert=lambda mw: _number(mw) / 1000)
        put("temperature_c", "nvmlDeviceGetTemperature", TEMPERATURE_GPU, convert=_number)
        v["slowdown_temperature_c"] = g.slowdown_c
        if g.slowdown_c is None:
            why["slowdown_temperature_c"] = g.slowdown_reason or "nvmlDeviceGetTemperatureThreshold gave no value"
        put("sm_clock_mhz", "nvmlDeviceGetClockInfo", CLOCK_SM, convert=_number)
        mask, reason = r.call("nvmlDeviceGetCurrentClocksEventReasons", g.board, convert=_count)
        if mask is None and reason and reason.startswith("not provided"):  # drivers before 535
            mask, reason = r.call("nvmlDeviceGetCurrentClocksThrottleReasons", g.board, convert=_count)
        v["throttle_reasons"] = tuple(decode_clock_events(mask)) if mask is not None else ()
        if mask is None:
            why["throttle_reasons"] = reason or "no clock-event reasons"
        self._allocator(g, v, why)
        return GpuSample(index=g.index, **v, unavailable=why)

    def _allocator(self, g: _Gpu, v: dict[str, Any], why: dict[str, str]) -> None:
        """This process's torch CUDA allocator, without importing torch or creating a context."""
        try:
            torch = self.src.torch()
        except Exception:
            torch = None
        reason = None
        if torch is None:
            reason = "torch is not imported in this process"
        else:
            try:
                if not torch.cuda.is_initialized():
                    reason = "this process has not initialised CUDA (no tensor on a GPU yet)"
                else:
                    self._map_torch_indices(torch)
                    if g.torch_index is None:
                        reason = "not one of the GPUs this process's torch uses"
                    else:
                        reserved = int(torch.cuda.memory_reserved(g.torch_index))
                        if reserved == 0:  # e.g. rank 0 of a DDP run looking at rank 1's GPU
                            reason = "this process holds no memory on this GPU"
                        else:
                            v["allocated_bytes"] = int(torch.cuda.memory_allocated(g.torch_index))
                            v["reserved_bytes"] = reserved
            except Exception as exc:
                reason = f"torch.cuda memory statistics failed: {type(exc).__name__}: {exc}"
        if reason:
            why["allocated_bytes"] = why["reserved_bytes"] = reason

    def _map_torch_indices(self, torch: Any) -> None:
        """CUDA's device numbers for the sampled GPUs, by UUID (CUDA may order GPUs differently
        from NVML's PCI order); by position when torch gives no UUID."""
        if self._torch_mapped:
            return
        self._torch_mapped = True
        n = torch.cuda.device_count()
        by_uuid: dict[str, int] = {}
        for i in range(n):
            try:
                u = str(torch.cuda.get_device_properties(i).uuid)
            except Exception:
                continue
            by_uuid[u.lower().removeprefix("gpu-").removeprefix("mig-")] = i
        for g in self._gpus:
            key = (g.uuid or "").lower().removeprefix("gpu-").removeprefix("mig-")
            g.torch_index = by_uuid.get(key) if by_uuid else (g.index if g.index < n else None)

    # ---- lifetime ----------------------------------------------------------------------------
    def close(self) -> None:
        nv, self._nv, self._gpus = self._nv, None, []
        if nv is not None:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass  # shutting down a library that misbehaved must not fail the run's end
            self.gpu_note = "sampler closed"

    def __enter__(self) -> "Sampler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {type(value).__name__}")


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a non-negative integer, got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    return float(value)


def _swap_used(sw: Any) -> int:
    used = getattr(sw, "used", None)
    return int(used) if used is not None else int(sw.total - sw.free)


def _main(argv: list[str]) -> int:
    """Print samples of this machine and the time one sample() takes."""
    import json
    import statistics

    n = int(argv[0]) if argv else 3
    t0 = time.perf_counter()
    sampler = Sampler()
    setup = time.perf_counter() - t0
    times = []
    try:
        for i in range(max(n, 1)):
            t = time.perf_counter()
            s = sampler.sample()
            times.append(time.perf_counter() - t)
            if i < 2 or i == n - 1:
                print(json.dumps(s.to_record(), indent=None))
    finally:
        sampler.close()
    print(f"set-up {setup * 1000:.1f} ms; sample() median {statistics.median(times) * 1000:.3f} ms, "
          f"max {max(times) * 1000:.3f} ms over {len(times)}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_main(sys.argv[1:]))
