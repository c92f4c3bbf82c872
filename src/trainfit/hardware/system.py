"""OS facts (container, WSL) and which compute backends the hardware offers."""

from __future__ import annotations

from trainfit.core.machines.profile import Backend, BackendsInfo, CpuInfo, GpuInfo, OsInfo
from trainfit.hardware.sources import Sources, read_text


def probe_os(src: Sources) -> OsInfo:
    p = src.platform
    in_wsl = p.system == "Linux" and ("microsoft" in p.release.lower() or src.fs.exists("/dev/dxg"))
    cgroup = read_text(src.fs, "/proc/1/cgroup") or ""
    in_container = p.system == "Linux" and (
        src.fs.exists("/.dockerenv") or src.fs.exists("/run/.containerenv")
        or any(k in cgroup for k in ("docker", "kubepods", "containerd", "libpod", "lxc"))
        or "container" in src.env)
    return OsInfo(p.system, p.release, p.hostname, p.python_version, in_container, in_wsl)


def backends(src: Sources, cpu: CpuInfo, gpus: list[GpuInfo], gpu_reasons: dict[str, str]) -> BackendsInfo:
    by_vendor = {v: [g for g in gpus if g.vendor == v] for v in ("nvidia", "amd", "apple", "intel")}

    def backend(vendor: str, version: str | None, missing: str) -> Backend:
        if by_vendor[vendor]:
            return Backend(True, version)
        return Backend(False, None, gpu_reasons.get(vendor, missing))

    nv = by_vendor["nvidia"]
    amd = by_vendor["amd"]
    cuda = backend("nvidia", nv[0].cuda_version if nv else None, "no NVIDIA GPU")
    rocm = backend("amd", amd[0].rocm_version if amd else None, "no AMD GPU")
    if amd and amd[0].rocm_version is None:
        rocm = Backend(False, None, "AMD GPU present but ROCm is not installed")
    mps = backend("apple", src.platform.release if by_vendor["apple"] else None, "not Apple silicon")
    xpu = backend("intel", None, "no Intel Arc / Data Center GPU")
    try:
        icds = [f for f in src.fs.listdir("/etc/OpenCL/vendors") if f.endswith(".icd")]
    except OSError:
        icds = []
    opencl = (Backend(True, None) if icds or src.platform.system == "Darwin"
              else Backend(False, None, "no OpenCL ICD in /etc/OpenCL/vendors"))
    f = cpu.flags
    return BackendsInfo(
        cuda=cuda, rocm=rocm, mps=mps, xpu=xpu, opencl=opencl, cpu=Backend(True, None),
        cpu_avx2=f.get("avx2", False), cpu_avx512=f.get("avx512f", False),
        cpu_amx=f.get("amx_bf16", False) or f.get("amx_tile", False), cpu_neon=f.get("neon", False),
        cpu_bf16=f.get("bf16", False),
    )
