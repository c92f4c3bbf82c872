"""Runner deadlines, cgroup v1, network, the real disk test and the benchmark (tiny sizes)."""

import copy
import http.server
import threading
import time

import pytest

from trainfit.core.machines.profile import missing_reasons
from trainfit.errors import BadInputError
from trainfit.hardware.benchmark import run_benchmark
from trainfit.hardware.cgroup import cpu_quota_cores, memory_limit_bytes
from trainfit.hardware.fakes import FakeFs
from trainfit.hardware.network import probe_network
from trainfit.hardware.profiler import build_profile
from trainfit.hardware.runner import run_probes
from trainfit.hardware.live import live_sources
from trainfit.hardware.storage import measure_disk

from .conftest import fixture_data, sources_from_data


def test_runner_times_out_hung_probe_and_keeps_the_others():
    t0 = time.perf_counter()
    res = run_probes({"slow": lambda: time.sleep(5), "fast": lambda: 42, "bad": lambda: 1 / 0},
                     {"slow": 0.2, "fast": 1.0, "bad": 1.0})
    assert time.perf_counter() - t0 < 1.0
    assert res["slow"].error == "timed out after 0.2 s" and res["slow"].value is None
    assert res["fast"].value == 42 and res["fast"].error is None
    assert res["bad"].error.startswith("ZeroDivisionError")


def test_cgroup_v1_nested_limits():
    fs = FakeFs({
        "/proc/self/cgroup": "4:memory:/kubepods/pod1/ctr\n3:cpu,cpuacct:/kubepods/pod1/ctr\n",
        "/proc/self/mountinfo": ("35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                                 "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"),
        "/sys/fs/cgroup/memory/kubepods/pod1/ctr/memory.limit_in_bytes": "9223372036854771712",
        "/sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes": "8589934592",  # parent binds
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_quota_us": "150000",
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr/cpu.cfs_period_us": "100000",
    })
    assert memory_limit_bytes(fs) == 8 << 30
    assert cpu_quota_cores(fs) == 1.5


def test_cgroup_absent_means_no_limit():
    fs = FakeFs({"/proc/self/cgroup": "0::/\n", "/proc/self/mountinfo": ""})
    assert memory_limit_bytes(fs) is None and cpu_quota_cores(fs) is None


@pytest.fixture
def http_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"x" * (2 << 20)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/blob"
    server.shutdown()


def test_network_measures_a_configured_endpoint(http_server):
    src = sources_from_data(fixture_data("cpu-only-vm"))
    src.env["TRAINFIT_BANDWIDTH_URL"] = http_server
    info = probe_network(src)
    assert info.endpoint == http_server and info.download_mbps > 0 and info.unavailable == {}


def test_network_without_endpoint_or_with_a_dead_one():
    src = sources_from_data(fixture_data("cpu-only-vm"))
    assert "no endpoint configured" in probe_network(src).unavailable["download_mbps"]
    dead = probe_network(src, "http://127.0.0.1:9/", timeout_s=1.0)
    assert dead.download_mbps is None and "failed" in dead.unavailable["download_mbps"]
    assert missing_reasons(dead) == []


def test_real_disk_measurement(tmp_path):
    read_mbps, write_mbps = measure_disk(str(tmp_path), 4 << 20)
    assert read_mbps > 0 and write_mbps > 0
    assert list(tmp_path.iterdir()) == []  # the test file is removed


def test_benchmark_small_sizes_on_this_machine(tmp_path):
    src = live_sources()
    p = build_profile(quick=True, sources=src)
    b = run_benchmark(src, p.cpu, p.gpus, work_dir=str(tmp_path), disk_bytes=4 << 20, scale=0.05)
    assert b.memory_bandwidth_gbps > 0 and b.cpu_fp32_gflops > 0
    assert b.disk_read_mbps > 0 and missing_reasons(b) == []
    assert b.gpu_tflops == {} and b.unavailable["gpu_bandwidth_gbps"]


def test_quick_profile_is_fast_and_complete():
    build_profile(quick=True)  # warm imports
    t0 = time.perf_counter()
    p = build_profile(quick=True)
    assert time.perf_counter() - t0 < 0.3
    assert missing_reasons(p) == [] and "quick" in p.storage[0].unavailable["read_mbps"]


def test_live_profile_is_complete():
    p = build_profile()
    assert missing_reasons(p) == [] and p.source == "live" and p.memory.total_bytes > 0


@pytest.mark.parametrize("watts", [-5.0, 0.0, 1e9, float("nan")])
def test_absurd_psu_watts_rejected(watts):
    with pytest.raises(BadInputError, match="--psu-watts"):
        build_profile(psu_watts=watts, quick=True)


def test_psu_headroom_from_stated_watts():
    data = copy.deepcopy(fixture_data("desktop-rtx4090"))
    p = build_profile(sources=sources_from_data(data), psu_watts=850)
    # 170 W CPU (RAPL PL1) + 450 W GPU + 50 W rest = 670 W
    assert p.power.estimated_system_tdp_watts == 670
    assert p.power.psu_headroom_watts == 180 and p.power.psu_is_estimate is False
