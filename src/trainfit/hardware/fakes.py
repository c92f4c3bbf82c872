"""Fake sources built from recorded machine data (YAML/JSON), and a recorder for real machines.

A fixture file holds: platform, env, cwd, psutil answers, files (path -> text, a list of
successive texts, or {error: EACCES|ENOENT}), links (sysfs symlinks), commands (argv[0] ->
{rc, stdout} or {hang: true}), nvml (null = library missing, {init_error: code}, or devices),
amdsmi (null) and disk_bench ({read_mbps, write_mbps} or {error: ...}).

Faults in the fake NVML: `nvml.count` replaces what nvmlDeviceGetCount answers (any YAML value,
e.g. "2" or "two"); per device, `errors: {field: nvmlReturn code}` raises an NVMLError,
`raises: {field: RuntimeError}` raises that builtin exception (not an NVMLError), and
`name_bytes: "<hex>"` makes nvmlDeviceGetName answer raw bytes (e.g. not UTF-8).

`python -m trainfit.hardware.fakes record OUT.yaml` runs the live probes through recording
wrappers and writes exactly the files and answers they read.
"""

from __future__ import annotations

import builtins
import errno
import posixpath
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from trainfit.hardware.sources import Commands, Fs, PlatformFacts, Sources
from trainfit.yaml_io import load_yaml

_ERRORS = {"EACCES": (PermissionError, errno.EACCES), "ENOENT": (FileNotFoundError, errno.ENOENT),
           "EIO": (OSError, errno.EIO)}


class FakeFs(Fs):
    def __init__(self, files: dict[str, Any], links: dict[str, str] | None = None):
        super().__init__("/")
        self.files = {k.rstrip("/"): v for k, v in files.items()}
        self.links = {k.rstrip("/"): v.rstrip("/") for k, v in (links or {}).items()}
        self._reads: dict[str, int] = {}

    def _resolve(self, path: str) -> str:
        path = posixpath.normpath(path)
        for _ in range(16):
            for link in sorted(self.links, key=len, reverse=True):
                if path == link or path.startswith(link + "/"):
                    path = self.links[link] + path[len(link):]
                    break
            else:
                return path
        return path

    def _key(self, path: str) -> str:
        """Recorded data may sit under the literal path or under the symlink's target."""
        literal = posixpath.normpath(path)
        return literal if literal in self.files else self._resolve(path)

    def read(self, path: str) -> str:
        real = self._key(path)
        value = self.files.get(real)
        if value is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if isinstance(value, dict):
            cls, code = _ERRORS[value["error"]]
            raise cls(code, value["error"], path)
        if isinstance(value, list):  # successive reads (counters): the last one repeats
            n = self._reads.get(real, 0)
            self._reads[real] = n + 1
            return str(value[min(n, len(value) - 1)])
        return str(value)

    def _children(self, path: str) -> set[str]:
        prefix = path.rstrip("/") + "/"
        names = set()
        for key in list(self.files) + list(self.links):
            if key.startswith(prefix):
                names.add(key[len(prefix):].split("/")[0])
        return names

    def listdir(self, path: str) -> list[str]:
        real = self._key(path)
        value = self.files.get(real)
        if isinstance(value, dict) and "error" in value:
            cls, code = _ERRORS[value["error"]]
            raise cls(code, value["error"], path)
        names = self._children(real) | self._children(posixpath.normpath(path))
        if not names:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return sorted(names)

    def exists(self, path: str) -> bool:
        found = False
        for p in (posixpath.normpath(path), self._resolve(path)):
            found |= p in self.files or p in self.links or bool(self._children(p))
        return found

    def realpath(self, path: str) -> str:
        return self._resolve(path)


class FakeCommands(Commands):
    def __init__(self, answers: dict[str, Any]):
        self.answers = answers

    def run(self, argv: list[str], timeout_s: float = 2.0) -> tuple[int, str]:
        answer = self.answers.get(" ".join(argv)) or self.answers.get(argv[0])
        if answer is None:
            return 127, ""
        if answer.get("hang"):
            raise TimeoutError(f"{argv[0]} timed out after {timeout_s:g} s")
        return int(answer.get("rc", 0)), str(answer.get("stdout", ""))


class FakeNvmlError(Exception):
    """Carries an nvmlReturn_t code in .value, like pynvml.NVMLError."""

    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The pynvml functions the NVML probe calls, answered from recorded device data."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.devices = data.get("devices", [])

    def _dev(self, h: Any) -> dict[str, Any]:
        return h

    def _field(self, h: dict[str, Any], name: str, value: Any) -> Any:
        unexpected = (h.get("raises") or {}).get(name)
        if unexpected is not None:  # a builtin exception with no NVML return code
            raise getattr(builtins, unexpected)(f"fake {unexpected} from the {name} call")
        code = h.get("errors", {}).get(name)
        if code is not None:
            raise FakeNvmlError(int(code))
        if value is None:
            raise FakeNvmlError(3)  # not recorded = not supported on that board
        return value

    def nvmlInit(self) -> None:
        if self.data.get("hang_seconds"):
            time.sleep(float(self.data["hang_seconds"]))
        if self.data.get("init_error"):
            raise FakeNvmlError(int(self.data["init_error"]))

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.data["driver_version"]

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return int(self.data["cuda_version"])

    def nvmlDeviceGetCount(self) -> Any:
        return self.data["count"] if "count" in self.data else len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self.devices):
            raise FakeNvmlError(2)  # NVML_ERROR_INVALID_ARGUMENT: no GPU at that index
        return self.devices[i]

    def nvmlDeviceGetName(self, h):
        raw = bytes.fromhex(h["name_bytes"]) if "name_bytes" in h else h.get("name")
        return self._field(h, "name", raw)
    def nvmlDeviceGetUUID(self, h): return self._field(h, "uuid", h.get("uuid"))
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=self._field(h, "pci", h.get("bus_id")))
    nvmlMemory_v2 = 0x02000028  # pynvml's value; the fake only checks that one is passed

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        mem = self._field(h, "memory", h.get("memory"))
        if version is not None:  # v2: the driver's own share apart; not recorded = not supported
            return SimpleNamespace(total=mem["total"], free=mem["free"],
                                   reserved=self._field(h, "memory", mem.get("reserved")))
        return SimpleNamespace(total=mem["total"], free=mem["free"], used=mem["total"] - mem["free"])
    def nvmlDeviceGetCudaComputeCapability(self, h): return tuple(self._field(h, "cc", h.get("cc")))
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return self._field(h, "power_limit", h.get("power_limit_mw"))
    def nvmlDeviceGetPowerUsage(self, h): return self._field(h, "power", h.get("power_mw"))
    def nvmlDeviceGetTemperature(self, h, sensor): return self._field(h, "temperature", h.get("temperature_c"))
    def nvmlDeviceGetTemperatureThreshold(self, h, kind): return self._field(h, "slowdown", h.get("slowdown_c"))
    def nvmlDeviceGetClockInfo(self, h, clock):
        return self._field(h, "clocks", (h.get("clocks") or {}).get({1: "sm", 2: "mem"}[clock]))
    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._field(h, "clocks", (h.get("clocks") or {}).get({1: "sm_max", 2: "mem_max"}[clock]))
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return self._field(h, "pcie", (h.get("pcie") or {}).get("gen"))
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return self._field(h, "pcie", (h.get("pcie") or {}).get("width"))
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return self._field(h, "pcie", (h.get("pcie") or {}).get("gen_max"))
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): return self._field(h, "pcie", (h.get("pcie") or {}).get("width_max"))
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self._field(h, "clock_events", h.get("clock_events"))
    def nvmlDeviceGetMigMode(self, h): return tuple(self._field(h, "mig", h.get("mig_mode")))
    def nvmlDeviceGetMaxMigDeviceCount(self, h): return len(h.get("mig_devices", []))
    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j): return h["mig_devices"][j]

    def _link(self, h: dict[str, Any], link: int) -> dict[str, Any]:
        links = h.get("nvlinks")
        if links is None:
            raise FakeNvmlError(3)
        if link >= len(links):
            raise FakeNvmlError(2)  # invalid argument: past the last link
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h, link): return self._link(h, link).get("state", 1)
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link): return self._link(h, link).get("remote_type", 0)
    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self._link(h, link)["remote_bus_id"])


class FakePsutil:
    def __init__(self, data: dict[str, Any]):
        self.data = data

    def virtual_memory(self): return SimpleNamespace(**self.data["virtual_memory"])
    def swap_memory(self): return SimpleNamespace(**self.data.get("swap_memory", {"total": 0, "free": 0}))
    def cpu_count(self, logical: bool = True): return self.data["cpu_count"]["logical" if logical else "physical"]

    def disk_usage(self, path: str):
        table = self.data.get("disk_usage", {})
        best = max((p for p in table if path == p or path.startswith(p.rstrip("/") + "/") or p == "/"),
                   key=len, default=None)
        if best is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return SimpleNamespace(**table[best])

    def sensors_battery(self):
        bat = self.data.get("sensors_battery")
        return SimpleNamespace(**bat) if bat else None

    def sensors_temperatures(self):
        return {chip: [SimpleNamespace(label=e.get("label", ""), current=e["current"],
                                       high=e.get("high"), critical=e.get("critical")) for e in entries]
                for chip, entries in (self.data.get("sensors_temperatures") or {}).items()}


def _unavailable(what: str):
    def load() -> Any:
        raise ImportError(f"{what} is not installed on this fixture machine")
    return load


def sources_from_data(data: dict[str, Any], name: str = "fixture") -> Sources:
    nvml_data = data.get("nvml")
    bench = data.get("disk_bench") or {"error": "EACCES"}

    def disk_bench(path: str, size: int) -> tuple[float, float]:
        if "error" in bench:
            cls, code = _ERRORS[bench["error"]]
            raise cls(code, bench["error"], path)
        return float(bench["read_mbps"]), float(bench["write_mbps"])

    return Sources(
        fs=FakeFs(data.get("files", {}), data.get("links")),
        commands=FakeCommands(data.get("commands", {})),
        platform=PlatformFacts(**data["platform"]),
        env=dict(data.get("env", {})),
        cwd=data.get("cwd", "/root"),
        nvml=(lambda: FakeNvml(nvml_data)) if nvml_data is not None else _unavailable("libnvidia-ml"),
        amdsmi=_unavailable("amdsmi"),
        psutil=FakePsutil(data["psutil"]),
        disk_bench=disk_bench,
        sleep=lambda s: None,
        name=data.get("name", name),
    )


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("nvml", "disk_bench"):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _expand_cpu(data: dict[str, Any]) -> None:
    """Shorthand `cpu:` block -> /proc/cpuinfo, topology and cache files (a 64-thread cpuinfo
    written out by hand would bury the values that matter)."""
    cpu = data.pop("cpu", None)
    if not cpu:
        return
    files = data.setdefault("files", {})
    sockets, cores, threads = cpu.get("sockets", 1), cpu["cores_per_socket"], cpu.get("threads_per_core", 1)
    logical = sockets * cores * threads
    blocks = []
    for n in range(logical):
        # Linux numbers the first thread of every core first, then the siblings
        thread, rest = divmod(n, sockets * cores)
        socket, core = divmod(rest, cores)
        files.setdefault(f"/sys/devices/system/cpu/cpu{n}/topology/physical_package_id", str(socket))
        files.setdefault(f"/sys/devices/system/cpu/cpu{n}/topology/core_id", str(core))
        lines = [f"processor\t: {n}", f"vendor_id\t: {cpu['vendor']}", f"model name\t: {cpu['model']}",
                 f"physical id\t: {socket}", f"core id\t\t: {core}", f"flags\t\t: {cpu['flags']}"]
        if cpu.get("arm"):
            lines = [f"processor\t: {n}", f"Features\t: {cpu['flags']}", f"CPU implementer\t: {cpu['vendor']}"]
        blocks.append("\n".join(lines))
    files.setdefault("/proc/cpuinfo", "\n\n".join(blocks) + "\n")
    files.setdefault("/proc/self/status", f"Cpus_allowed_list:\t0-{logical - 1}\n")
    for i, (level, kind, size, shared) in enumerate(cpu.get("caches", [])):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{i}"
        for name, value in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            files.setdefault(f"{base}/{name}", value)  # explicit files (faults) win
    for key in ("base_frequency", "cpuinfo_max_freq"):
        if key in cpu:
            files.setdefault(f"/sys/devices/system/cpu/cpu0/cpufreq/{key}", str(cpu[key]))


def _load_raw(path: Path) -> dict[str, Any]:
    data = load_yaml(path.read_text())
    parent = data.pop("extends", None)
    return _merge(_load_raw(path.parent / parent), data) if parent else data


def load_fixture_data(path: str | Path) -> dict[str, Any]:
    """Fixture data with `extends: other.yaml` resolved and the `cpu:` shorthand expanded."""
    path = Path(path)
    data = _load_raw(path)
    data["name"] = path.stem
    _expand_cpu(data)
    return data


def load_fixture(path: str | Path) -> Sources:
    return sources_from_data(load_fixture_data(path))


# ---- recorder ------------------------------------------------------------------------------

class _RecordingFs(Fs):
    def __init__(self) -> None:
        super().__init__("/")
        self.files: dict[str, Any] = {}
        self.links: dict[str, str] = {}

    def read(self, path: str) -> str:
        try:
            text = super().read(path)
        except PermissionError:
            self.files[path] = {"error": "EACCES"}
            raise
        if path == "/proc/self/status":  # keep only the affinity line (no pids, no names)
            text = "".join(ln + "\n" for ln in text.splitlines() if ln.startswith("Cpus_allowed"))
        self.files[path] = text
        return text

    def listdir(self, path: str) -> list[str]:
        names = super().listdir(path)
        for n in names:  # record the entries so the fake can list them
            self.files.setdefault(f"{path}/{n}/.present", "")
        return names

    def exists(self, path: str) -> bool:
        found = super().exists(path)
        if found:
            self.files.setdefault(path if not Path(path).is_dir() else f"{path}/.present", "")
        return found

    def realpath(self, path: str) -> str:
        real = super().realpath(path)
        if real != path:
            self.links[path] = real
        return real


def record_machine(out: str) -> None:
    """Profile this machine through recording wrappers and write the fixture to `out`."""
    import os
    import platform
    import psutil

    from trainfit.hardware.profiler import build_profile
    from trainfit.hardware.live import live_sources

    src = live_sources()
    fs = _RecordingFs()
    src.fs = fs
    calls: dict[str, Any] = {}

    class _Ps:
        def virtual_memory(self):
            vm = psutil.virtual_memory()
            calls["virtual_memory"] = {"total": vm.total, "available": vm.available}
            return vm

        def swap_memory(self):
            sw = psutil.swap_memory()
            calls["swap_memory"] = {"total": sw.total, "free": sw.free}
            return sw

        def cpu_count(self, logical=True):
            calls["cpu_count"] = {"logical": psutil.cpu_count(True), "physical": psutil.cpu_count(False)}
            return psutil.cpu_count(logical)

        def disk_usage(self, path):
            du = psutil.disk_usage(path)
            calls.setdefault("disk_usage", {})[path] = {"total": du.total, "free": du.free}
            return du

        def sensors_battery(self):
            bat = psutil.sensors_battery()
            calls["sensors_battery"] = None if bat is None else {
                "percent": bat.percent, "secsleft": int(bat.secsleft), "power_plugged": bat.power_plugged}
            return bat

        def sensors_temperatures(self):
            temps = psutil.sensors_temperatures()
            calls["sensors_temperatures"] = {c: [{"label": e.label, "current": e.current, "critical": e.critical}
                                                 for e in es] for c, es in temps.items()}
            return temps

    src.psutil = _Ps()
    bench: dict[str, float] = {}

    def disk(path: str, size: int) -> tuple[float, float]:
        from trainfit.hardware.storage import measure_disk
        r, w = measure_disk(path, size)
        bench.update(read_mbps=round(r, 1), write_mbps=round(w, 1))
        return r, w

    src.disk_bench = disk
    build_profile(sources=src)
    calls.setdefault("cpu_count", {"logical": psutil.cpu_count(True), "physical": psutil.cpu_count(False)})
    data = {
        "name": Path(out).stem,
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
                     "hostname": "recorded", "python_version": platform.python_version()},
        "env": {k: os.environ[k] for k in ("HOME", "HF_HOME", "DISPLAY", "CUDA_VISIBLE_DEVICES") if k in os.environ},
        "cwd": src.cwd, "psutil": calls, "files": fs.files, "links": fs.links, "nvml": None,
        "disk_bench": bench or {"error": "EACCES"},
    }
    Path(out).write_text(yaml.safe_dump(data, sort_keys=True, width=200))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "record":
        raise SystemExit("usage: python -m trainfit.hardware.fakes record OUT.yaml")
    record_machine(sys.argv[2])
