"""Several nodes: the --hardware forms and refusals, the cited network catalog, the inter-node
communication term against a hand calculation, the sharding choice it drives, and the per-node
launch files."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.memory import estimate_memory
from trainfit.core.models.catalog import get_model
from trainfit.core.machines.network_catalog import NETWORK_EFFICIENCY, all_networks, get_network
from trainfit.core.plan.planner import PlanRequest, plan
from trainfit.core.machines.profile import HardwareProfile, missing_reasons
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed import predict_step
from trainfit.core.speed.comm import communication
from trainfit.core.speed.rates import device_rates
from trainfit.errors import BadInputError

REPO = Path(__file__).resolve().parents[2]
GB = 1e9


# ------------------------------------------------------------------ forms
@pytest.mark.parametrize("text", ["2 nodes x 8x h100-sxm", "2x 8x h100-sxm", "2 node of 8xh100-sxm",
                                  "2 NODES × 8x H100-SXM"])
def test_node_forms_give_every_gpu_and_one_node_host(text):
    p = resolve_hardware(text)
    one = resolve_hardware("8x h100-sxm")
    assert (p.gpu_count, p.node_count, p.gpus_per_node) == (16, 2, 8)
    assert p.nodes.network == "ib-ndr" and p.nodes.network_assumed  # Hopper + NVLink: DGX-class default
    assert [g.index for g in p.gpus] == list(range(16))
    assert p.gpus[9].nvlink_peers == [8, 10, 11, 12, 13, 14, 15]  # NVLink stays inside node 1
    assert p.memory == one.memory and p.cpu == one.cpu  # host figures are one node's
    assert missing_reasons(p) == []
    assert HardwareProfile.from_json(p.to_json()) == p


def test_over_names_the_network_and_its_bandwidth_per_node():
    p = resolve_hardware("2 nodes x 8x h100-sxm over 100gbe")
    assert (p.nodes.network, p.nodes.network_kind, p.nodes.network_assumed) == ("100gbe", "ethernet", False)
    assert p.nodes.network_gbps == pytest.approx(100 / 8)  # 100 Gb/s line rate = 12.5 GB/s
    # rail-optimised InfiniBand: a node of 4 GPUs trains over 4 of the 8 ports
    assert resolve_hardware("2 nodes x 4x h100-sxm over ib-ndr").nodes.network_gbps == pytest.approx(4 * 400 / 8)
    assert resolve_hardware("3 nodes x 8x a100-80gb").nodes.network == "ib-hdr"
    assert resolve_hardware("2 nodes x 2x l4").nodes.network == "100gbe"  # PCIe data-centre cards


def test_profile_per_node_files(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(resolve_hardware("8x h100-sxm").to_json())
    b.write_text(resolve_hardware("8x h100-sxm").to_json())
    p = resolve_hardware(f"{a},{b} over efa-p5")
    assert (p.gpu_count, p.node_count, p.nodes.network, p.nodes.network_gbps) == (16, 2, "efa-p5", 400.0)
    assert p.source.startswith("file:2 nodes x ")
    q = resolve_hardware(f"3 nodes x {a}")
    assert (q.gpu_count, q.node_count) == (24, 3)


def test_a_saved_profile_without_the_nodes_key_is_one_node(tmp_path):
    data = json.loads(resolve_hardware("2x a100-80gb").to_json())
    del data["nodes"]  # written before multi-node profiles existed
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    p = resolve_hardware(str(path))
    assert (p.node_count, p.gpu_count, p.nodes.network) == (1, 2, None)
    assert missing_reasons(p) == []


@pytest.mark.parametrize("text, words", [
    ("2 nodes x cpu", ["no GPU", "one process"]),
    ("2 nodes x m2-16gb", ["cannot train together"]),
    ("8x h100-sxm over ib-ndr", ["one machine"]),
    ("2 nodes x 8x h100-sxm over 40gbe", ["not a known inter-node network"]),
    ("0 nodes x 8x h100-sxm", ["node count must be 1..1024"]),
    ("a.json,,b.json", ["empty name"]),
])
def test_refused_forms_name_the_flag_and_why(text, words):
    with pytest.raises(BadInputError) as exc:
        resolve_hardware(text)
    message = exc.value.message
    assert "--hardware" in message and all(w in message for w in words), message


def test_nodes_that_differ_are_refused(tmp_path):
    a, b = tmp_path / "h100.json", tmp_path / "a100.json"
    a.write_text(resolve_hardware("8x h100-sxm").to_json())
    b.write_text(resolve_hardware("8x a100-80gb").to_json())
    with pytest.raises(BadInputError, match="node 1 differs from node 0"):
        resolve_hardware(f"{a},{b}")
    multi = tmp_path / "multi.json"
    multi.write_text(resolve_hardware("2 nodes x 8x h100-sxm").to_json())
    with pytest.raises(BadInputError, match="already a 2-node profile"):
        resolve_hardware(f"2 nodes x {multi}")


def test_cli_refuses_with_exit_code_2():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "trainfit", "plan", "qwen2.5-0.5b", "--hardware",
                           "2 nodes x 8x h100-sxm over carrier-pigeon"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--hardware" in proc.stderr and "ib-ndr" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ catalog
def test_every_network_is_cited_and_the_dgx_figure_is_8_x_400_gbit():
    for net in all_networks():
        assert "http" in net.source and "read 2026-11-23" in net.source, net.id
    text = (REPO / "src/trainfit/data/networks.yaml").read_text()
    entries = text.split("\n  - id: ")[1:]
    assert len(entries) == len(all_networks())
    for entry in entries:  # a comment with the URL and date sits right above each entry's figures
        above = entry.split("port_gbit:")[0]
        assert re.search(r"#.*https?://\S+", above) and "(read 2026-11-23)" in above, entry[:40]
    ndr = get_network("ndr")  # alias
    assert (ndr.id, ndr.port_gbit, ndr.ports_per_node) == ("ib-ndr", 400, 8)
    assert ndr.node_bandwidth_gbps(8) == 400.0  # 8 x 400 Gb/s = 3200 Gb/s = 400 GB/s
    assert get_network("efa-p5").node_bandwidth_gbps(8) == 400.0  # 3,200 Gbps per p5.48xlarge
    assert get_network("efa-p4d").node_bandwidth_gbps(8) == 50.0  # 400 Gbps per p4d.24xlarge
    assert get_network("ib-hdr").node_bandwidth_gbps(8) == 200.0  # DGX A100: 8 x 200 Gb/s


# ------------------------------------------------------------------ the inter-node term
def _rates(hw: str):
    return device_rates(resolve_hardware(hw), "cuda")


def test_ddp_all_reduce_across_nodes_matches_the_hand_calculation():
    """DDP over 2 nodes x 8 H100, 100 Gb/s Ethernet, nothing hidden (micro_s = 0)."""
    rates = _rates("2 nodes x 8x h100-sxm over 100gbe")
    setup = TrainingSetup(num_gpus=16, num_nodes=2, zero_stage=0, precision="bf16")
    trainable = 7.0e9
    got = communication(setup, rates, n_stored=trainable, trainable=trainable, micro_s=0.0, bwd_share=0.66,
                        network_bytes_per_s=rates.network_bytes_per_s)
    network = 100e9 / 8 * NETWORK_EFFICIENCY  # cited line rate x the stated efficiency = 10 GB/s
    assert rates.network_bytes_per_s == pytest.approx(network)
    latency = 2 * 15 * 20e-6
    ring = 2 * 15 / 16 * trainable * 2.0 / network  # 2(N-1)/N x bf16 gradients over the slowest link
    assert got.seconds == pytest.approx(ring + 2 * latency, rel=1e-12)
    assert got.seconds == pytest.approx(2.625, abs=0.01)  # 26.25e9 B / 10e9 B/s
    assert "bound by the network" in got.note


def test_full_shard_and_hybrid_volumes_match_the_hand_calculation():
    ndr = _rates("2 nodes x 8x h100-sxm over ib-ndr")
    p, n, m, g = 7.0e9, 16, 2, 8
    base = TrainingSetup(num_gpus=n, num_nodes=m, zero_stage=3, precision="bf16", grad_accum=1)
    net = 400e9 * NETWORK_EFFICIENCY  # 8 x 400 Gb/s = 400 GB/s line rate, 320 GB/s usable
    link = min(ndr.link_bytes_per_s, net)  # NVLink (900 GB/s bidirectional / 2 x 0.7 = 315 GB/s) is slower here
    assert link == pytest.approx(900e9 / 2 * 0.7)
    full = communication(base, ndr, n_stored=p, trainable=p, micro_s=0.0, bwd_share=0.66, network_bytes_per_s=net)
    per_micro = (n - 1) / n * (2 * p * 2.0 + p * 2.0) / link + 3 * 2 * (n - 1) * 20e-6
    assert full.seconds == pytest.approx(per_micro, rel=1e-12)  # no compute to hide behind (micro_s = 0)
    hybrid = communication(dataclasses.replace(base, hybrid_shard=True), ndr, n_stored=p, trainable=p, micro_s=0.0,
                           bwd_share=0.66, network_bytes_per_s=net)
    intra = (g - 1) / g * (2 * p * 2.0 + p * 2.0) / ndr.link_bytes_per_s + 2 * (g - 1) * 20e-6
    inter = 2 * (m - 1) / m * p * 2.0 / net + 2 * (m - 1) * 20e-6  # one all-reduce of the shards per step
    assert hybrid.inter_node_seconds == pytest.approx(inter, rel=1e-12)
    assert hybrid.seconds == pytest.approx(intra + inter, rel=1e-12)


def test_one_node_is_unchanged_by_the_network():
    one = _rates("8x h100-sxm")
    assert one.nodes == 1 and one.network_bytes_per_s == 0.0
    setup = TrainingSetup(num_gpus=8, zero_stage=3, precision="bf16")
    got = communication(setup, one, n_stored=1e9, trainable=1e9, micro_s=0.0, bwd_share=0.66, network_bytes_per_s=0.0)
    assert got.inter_node_seconds == 0.0 and got.note is None


def test_100gbe_against_ndr_changes_the_step_time():
    model = get_model("qwen2.5-7b")
    setup = TrainingSetup(num_gpus=16, num_nodes=2, zero_stage=3, precision="bf16-mixed", micro_batch=2,
                          seq_len=2048, grad_accum=2, attention="flash")
    ndr = predict_step(model, setup, resolve_hardware("2 nodes x 8x h100-sxm over ib-ndr"))
    eth = predict_step(model, setup, resolve_hardware("2 nodes x 8x h100-sxm over 100gbe"))
    assert eth.step_seconds > 5 * ndr.step_seconds
    assert eth.bottleneck == "communication" and ndr.bottleneck == "compute"


def test_hybrid_memory_is_sharding_over_one_node():
    model = get_model("qwen2.5-7b")
    full = TrainingSetup(num_gpus=16, num_nodes=2, zero_stage=3, precision="bf16-mixed", seq_len=2048)
    hybrid = dataclasses.replace(full, hybrid_shard=True)
    one_node = TrainingSetup(num_gpus=8, num_nodes=1, zero_stage=3, precision="bf16-mixed", seq_len=2048)
    part = lambda s, name: sum(c.bytes for c in estimate_memory(model, s).devices[0].components if c.name == name)  # noqa: E731
    for name in ("weights", "master_weights", "optimizer"):
        assert part(hybrid, name) == part(one_node, name) > part(full, name), name


# ------------------------------------------------------------------ the sharding choice
def _balanced(hw: str):
    req = PlanRequest(hardware=resolve_hardware(hw), method="full", model=get_model("qwen2.5-7b"),
                      modes=("balanced",), seq_len=2048, target_batch=64)
    return plan(req).modes[0]


def test_the_network_changes_the_sharding_choice():
    ndr = _balanced("2 nodes x 8x h100-sxm over ib-ndr")
    eth = _balanced("2 nodes x 8x h100-sxm over 100gbe")
    assert ndr.setup.num_nodes == eth.setup.num_nodes == 2 and ndr.setup.num_gpus == 16
    assert (ndr.setup.zero_stage, ndr.setup.hybrid_shard) == (3, False)  # full sharding over 16 GPUs
    assert (eth.setup.zero_stage, eth.setup.hybrid_shard) == (3, True)  # shard inside a node
    assert eth.speed.step_seconds > ndr.speed.step_seconds
    assert any(r.startswith("full sharding over all 16 GPUs") for r in ndr.reasons), ndr.reasons
    why = next(r for r in eth.reasons if r.startswith("hybrid sharding"))
    assert "100gbe" in why and "GiB per GPU" in why and "faster than full sharding" in why
    assert any("over 100gbe (ethernet, 12 GB/s per node" in r for r in eth.reasons)


# ------------------------------------------------------------------ the files for each node
def _plan_files(tmp_path: Path, network: str) -> Path:
    out = tmp_path / network
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "trainfit", "plan", "qwen2.5-7b", "--method", "full", "--mode",
                           "balanced", "--seq-len", "2048", "--target-batch", "64", "--hardware",
                           f"2 nodes x 8x h100-sxm over {network}", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "balanced"


def test_files_for_two_nodes_load_and_carry_the_node_fields(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    ds = _plan_files(tmp_path, "ib-ndr")  # full sharding: DeepSpeed ZeRO-3
    run = yaml.safe_load((ds / "run.yaml").read_text())
    assert run["training"]["num_nodes"] == 2 and run["training"]["num_gpus"] == 16
    assert run["training"]["hybrid_shard"] is False and run["distributed"]["strategy"] == "deepspeed"
    accel = yaml.safe_load((ds / "accelerate.yaml").read_text())
    assert (accel["num_machines"], accel["num_processes"], accel["machine_rank"]) == (2, 16, 0)
    assert accel["main_process_port"] == 29500 and accel["rdzv_backend"] == "static"
    assert load_config_from_file(str(ds / "accelerate.yaml")).num_machines == 2  # Accelerate reads it
    assert json.loads((ds / "deepspeed.json").read_text())["zero_optimization"]["stage"] == 3
    # DeepSpeed's hostfile grammar (deepspeed.launcher.runner._parse_hostfile): '#' lines are comments
    hosts = [re.match(r"^(\S+)\s+slots=(\d+)", ln.strip()).groups() for ln in (ds / "hostfile").read_text().splitlines()
             if ln.strip() and not ln.strip().startswith("#")]
    assert hosts == [("node-0", "8"), ("node-1", "8")]
    launch = (ds / "launch.sh").read_text()
    assert ('--machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"'
            in launch)

    hybrid = _plan_files(tmp_path, "100gbe")  # hybrid sharding: FSDP with a 2 x 8 device mesh
    run = yaml.safe_load((hybrid / "run.yaml").read_text())
    assert run["training"]["hybrid_shard"] is True and run["distributed"]["strategy"] == "fsdp"
    accel = yaml.safe_load((hybrid / "accelerate.yaml").read_text())
    assert accel["distributed_type"] == "FSDP" and accel["num_machines"] == 2
    assert accel["parallelism_config"] == {"parallelism_config_dp_replicate_size": 2,
                                           "parallelism_config_dp_shard_size": 8}
    assert not (hybrid / "hostfile").exists() and not (hybrid / "deepspeed.json").exists()


def test_launch_sh_refuses_to_start_without_its_node_settings(tmp_path):
    ds = _plan_files(tmp_path, "ib-ndr")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "NODE_RANK", "MASTER_PORT")}
    cases = [({}, "MASTER_ADDR"), ({"MASTER_ADDR": "10.0.0.1"}, "NODE_RANK"),
             ({"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "2"}, "NODE_RANK must be 0..1"),
             ({"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "x"}, "set NODE_RANK")]
    for extra, words in cases:
        proc = subprocess.run(["bash", str(ds / "launch.sh")], capture_output=True, text=True,
                              env={**env, **extra}, timeout=30)
        assert proc.returncode == 2 and words in proc.stderr, (extra, proc.stderr)
