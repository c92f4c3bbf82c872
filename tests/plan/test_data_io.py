"""The data I/O plan (core/plan/data_io.py) and the dataset sizes behind it (dataset_size.py):
stream or download, where the tokenised cache goes, workers, the input bottleneck, token budgets
and packing, on fixture machines whose storage and network are set per test."""

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from trainfit.core.models.catalog import resolve_model
from trainfit.core.plan.data_io import DatasetInfo, padding_waste
from trainfit.core.plan.planner import PlanRequest, plan
from trainfit.core.machines.profile import NetworkInfo, StorageInfo
from trainfit.dataset_size import hub_dataset_info, local_dataset_info

GIB = 1 << 30
QWEN = resolve_model("qwen2.5-0.5b")


def disk(kind, read_mbps, free_gib, role="work", path="/work"):
    why = {} if read_mbps else {"read_mbps": "not measured (quick profile)", "write_mbps": "not measured (quick profile)",
                                "measured_at": "not measured (quick profile)"}
    return StorageInfo(role, path, "sda", kind, "set by the test", 4 << 40, int(free_gib * GIB), read_mbps, read_mbps,
                       why)


def machine(base, *storage, download_mbps=None):
    net = NetworkInfo("https://example.invalid/blob", download_mbps,
                      {} if download_mbps else {"download_mbps": "no endpoint configured"})
    return dataclasses.replace(base, storage=list(storage), network=net)


def one_mode(hw, *, method="lora", mode="balanced", **kw):
    model = kw.pop("model", QWEN)
    req = PlanRequest(hardware=hw, method=method, model=model, modes=(mode,), seq_len=kw.pop("seq_len", 1024), **kw)
    mp = plan(req).modes[0]
    assert mp.fits and mp.data_io is not None
    return mp


def tokens_info(tokens, **kw):
    return DatasetInfo("local", "/work/corpus", stored_bytes=int(tokens * 4), tokens=tokens, rows=kw.pop("rows", None),
                       path="/work/corpus", **kw)


@pytest.fixture
def laptop_hdd(fixture_machine):
    """An RTX 3060 laptop whose only disk spins (120 MB/s sequential)."""
    return machine(fixture_machine("laptop-rtx3060-battery"), disk("hdd", 120.0, 400),
                   disk("hdd", 120.0, 400, role="cache", path="/home/user/.cache/huggingface"))


@pytest.fixture
def workstation_nvme(fixture_machine):
    return machine(fixture_machine("desktop-rtx4090"), disk("nvme", 3150.0, 570),
                   disk("hdd", 180.0, 2800, role="cache", path="/mnt/archive"))


@pytest.fixture
def cloud_vm_network(fixture_machine):
    """8x H100 cloud VM whose work and cache dirs are on NFS (250 MB/s)."""
    return machine(fixture_machine("8x-h100-sxm"), disk("network", 250.0, 5000, path="/mnt/nfs"),
                   disk("network", 250.0, 5000, role="cache", path="/mnt/nfs/hf"))


# ---------------------------------------------------------------------------------------------
# where the tokenised cache goes
def test_laptop_hdd_small_dataset_cached_in_ram(laptop_hdd):
    dp = one_mode(laptop_hdd, dataset=tokens_info(20_000_000)).data_io
    assert dp.keep_in_memory and dp.cache_on == "ram" and dp.cache_dir is None
    assert dp.reasons["cache"].startswith("RAM: tokenised 0.09 GiB") and "balanced's 75%" in dp.reasons["cache"]
    assert dp.data_bound is False and "in RAM" in dp.reasons["bottleneck"]


def test_laptop_hdd_large_dataset_warns_with_the_stall(laptop_hdd):
    mp = one_mode(laptop_hdd, dataset=tokens_info(20_000_000_000))  # 100 GB tokenised, 14 GiB of RAM
    dp = mp.data_io
    assert not dp.keep_in_memory and dp.cache_on == "hdd" and dp.cache_dir == "/work/.trainfit-data-cache"
    assert "not RAM: tokenised 93.13 GiB" in dp.reasons["cache"]
    per_step = dp.trainer_tokens_per_second * mp.speed.step_seconds if not dp.data_bound else None
    stall_warning = next(w for w in dp.warnings if w.startswith("tokenised cache on hdd storage"))
    assert "expected stall" in stall_warning and stall_warning in mp.warnings
    # bytes per step / read speed, at 5 B/token (input_ids int32 + attention_mask int8)
    tokens_per_step = mp.setup.global_batch * mp.setup.seq_len
    assert dp.data_seconds_per_step == pytest.approx(tokens_per_step * 5 / 120e6)
    assert per_step is None or per_step == pytest.approx(tokens_per_step, rel=0.01)
    assert dp.prefetch_factor == 4 and "slow source" in dp.reasons["workers"]


def test_workstation_puts_the_cache_on_nvme_not_the_archive_hdd(workstation_nvme):
    dp = one_mode(workstation_nvme, dataset=tokens_info(30_000_000_000)).data_io  # 140 GiB tokenised > 57 GiB RAM
    assert dp.cache_on == "nvme" and dp.cache_dir == "/work/.trainfit-data-cache" and not dp.keep_in_memory
    assert dp.reasons["cache"].startswith("memory-mapped Arrow on nvme at /work")
    assert dp.data_bound is False and dp.reasons["bottleneck"].startswith("no: the nvme disk delivers 630,000,000 tokens/s (3,150 MB/s / 5 B/token)")
    # 32 usable cores, one training process: 4 workers (the cap for tokenised ids), default prefetch
    assert (dp.num_workers, dp.prefetch_factor) == (4, 2) and "32 usable cores - 1" in dp.reasons["workers"]
    assert not any("storage" in w or "bottleneck" in w for w in dp.warnings)


def test_workstation_nvme_too_full_falls_back_to_the_hdd(workstation_nvme):
    full = dataclasses.replace(workstation_nvme.storage[0], free_bytes=50 * GIB)
    hw = dataclasses.replace(workstation_nvme, storage=[full, workstation_nvme.storage[1]])
    dp = one_mode(hw, dataset=tokens_info(30_000_000_000)).data_io
    assert dp.cache_on == "hdd" and dp.cache_dir == "/mnt/archive/datasets"
    assert any("tokenised cache on hdd storage" in w for w in dp.warnings)


def test_cloud_vm_on_network_storage(cloud_vm_network):
    # 2 TB tokenised: over balanced's share of the 1.8 TiB of RAM, within the 5000 GiB of NFS
    mp = one_mode(cloud_vm_network, method="full", dataset=tokens_info(400_000_000_000))
    dp = mp.data_io
    assert dp.cache_on == "network" and dp.cache_dir == "/mnt/nfs/.trainfit-data-cache"
    assert any(w.startswith("tokenised cache on network storage") for w in dp.warnings)
    # 8 training processes on 224 cores: 4 workers each, prefetch 4 for the slow source
    assert (dp.num_workers, dp.prefetch_factor) == (4, 4) and "8 for the training process(es)" in dp.reasons["workers"]
    # 10 TB tokenised fits neither RAM nor the disk: the local files are streamed instead of converted
    dp = one_mode(cloud_vm_network, method="full", dataset=tokens_info(2_000_000_000_000)).data_io
    assert dp.streaming and dp.cache_on == "none (streamed)" and dp.reasons["cache"].startswith("none: no disk has")
    assert dp.input_tokens_per_second == pytest.approx(250e6 / 4)  # raw text read in place


def test_cpu_training_reads_in_the_training_process(fixture_machine):
    hw = machine(fixture_machine("cpu-only-vm"), disk("ssd", 1800.0, 70))
    dp = one_mode(hw, model=resolve_model("shape:25m"), method="pretrain", dataset=tokens_info(300_000_000)).data_io
    assert dp.num_workers == 0 and dp.prefetch_factor is None and "CPU training" in dp.reasons["workers"]
    assert dp.packing is None and "pretraining always packs" in dp.reasons["packing"]


# ---------------------------------------------------------------------------------------------
# stream or download (Hub data), by the network
def hub(download_gb, arrow_gb, tokens):
    return DatasetInfo("hub", "owner/corpus", stored_bytes=int(arrow_gb * 1e9), download_bytes=int(download_gb * 1e9),
                       tokens=tokens, rows=tokens // 500)


def test_node_on_10gbps_downloads_first_on_100mbps_streams(workstation_nvme):
    """Balanced's 6 h train ~1 % of a 30B-token corpus: on 10 Gb/s the whole download takes a
    minute, on 100 Mb/s 80 minutes that streaming the 1 % overlaps with training."""
    data = hub(60, 150, 30_000_000_000)  # 60 GB of Parquet, 150 GB as Arrow
    fast = one_mode(machine(workstation_nvme, *workstation_nvme.storage, download_mbps=1250.0), dataset=data).data_io
    slow = one_mode(machine(workstation_nvme, *workstation_nvme.storage, download_mbps=12.5), dataset=data).data_io
    assert fast.download_first and not fast.streaming and fast.download_seconds == pytest.approx(48.0)
    assert fast.reasons["source"].startswith("download first: 60.00 GB at 1,250 MB/s = 48 s")
    assert "the download is small against the run" in fast.reasons["source"]
    assert slow.streaming and not slow.download_first and slow.download_seconds == pytest.approx(4800.0)
    assert slow.reasons["source"].startswith("stream: 60.00 GB at 12.5 MB/s = 80 min")
    assert slow.cache_on == "none (streamed)" and not slow.keep_in_memory and slow.cache_dir is None
    assert (slow.num_workers, slow.prefetch_factor) == (1, 4) and "read in order by one worker" in slow.reasons["workers"]
    # the stream is read at the network's rate, in the download's bytes per token (60 GB / 30B tokens)
    assert slow.input_tokens_per_second == pytest.approx(12.5e6 / 2.0)
    assert slow.reasons["bottleneck"].startswith(("no: the network delivers", "yes: the network delivers"))


def test_hub_dataset_that_does_not_fit_the_disk_streams(workstation_nvme):
    small = [dataclasses.replace(s, free_bytes=100 * GIB) for s in workstation_nvme.storage]
    hw = machine(workstation_nvme, *small, download_mbps=1250.0)
    dp = one_mode(hw, dataset=hub(600, 1500, 300_000_000_000)).data_io
    assert dp.streaming and dp.reasons["source"].startswith("stream: downloading needs")
    assert "no disk has" in dp.reasons["source"]


# ---------------------------------------------------------------------------------------------
# the input pipeline as the bottleneck
def test_slow_disk_makes_the_step_data_bound(workstation_nvme):
    data = tokens_info(30_000_000_000)
    fast = one_mode(workstation_nvme, dataset=data, examples=200_000)
    consumed_mbps = fast.data_io.trainer_tokens_per_second * 5 / 1e6
    slow_disk = disk("hdd", consumed_mbps / 4, 2000)  # delivers a quarter of what the trainer consumes
    slow = one_mode(machine(workstation_nvme, slow_disk), dataset=data, examples=200_000)
    assert fast.data_io.data_bound is False and fast.speed.bottleneck != "data loading"
    assert slow.data_io.data_bound is True and slow.speed.bottleneck == "data loading"
    assert slow.data_io.reasons["bottleneck"].startswith("yes: the hdd disk delivers")
    # with workers the reads overlap compute: the step takes the reading time, 4x the compute
    assert slow.speed.step_seconds == pytest.approx(4 * fast.speed.step_seconds, rel=0.02)
    # per step the run takes 4x the time and energy (the mode's hours may then cut the run's steps)
    assert slow.run.hours / slow.run.steps == pytest.approx(4 * fast.run.hours / fast.run.steps, rel=0.02)
    assert slow.power.energy_kwh / slow.run.steps == pytest.approx(4 * fast.power.energy_kwh / fast.run.steps, rel=0.02)
    assert any(w.startswith("the input pipeline is the bottleneck") for w in slow.warnings)
    assert slow.speed.seconds_by_part["data loading"] == pytest.approx(3 * fast.speed.step_seconds, rel=0.02)


def test_unknown_measurements_say_not_measured(workstation_nvme):
    hw = machine(workstation_nvme, disk("nvme", None, 570))
    dp = one_mode(hw, dataset=tokens_info(30_000_000_000)).data_io
    assert dp.data_bound is None and dp.input_tokens_per_second is None
    assert dp.reasons["bottleneck"] == "not known: disk read speed not measured: measure it with `trainfit profile --benchmark`"
    assert "read speed not measured (not measured (quick profile))" in dp.reasons["cache"]
    dp = one_mode(machine(workstation_nvme, *workstation_nvme.storage), dataset=hub(60, 150, 30_000_000_000)).data_io
    assert dp.download_first and "network bandwidth not measured" in dp.reasons["source"]
    assert "trainfit profile --bandwidth-url" in dp.reasons["source"]


def test_catalog_machine_has_no_storage_and_no_measuring_advice():
    from trainfit.core.machines.hardware_spec import resolve_hardware

    hw = resolve_hardware("rtx-4090")
    dp = one_mode(hw, dataset=tokens_info(30_000_000_000)).data_io
    assert dp.reasons["bottleneck"] == "not known: storage not measured (a catalog machine)"
    assert "--benchmark" not in json.dumps(dp.reasons) and dp.cache_dir is None


# ---------------------------------------------------------------------------------------------
# token budgets
def test_token_budget_capped_by_the_modes_time(workstation_nvme):
    mp = one_mode(workstation_nvme, examples=5_000_000, epochs=3.0, mode="conservative")
    b = mp.data_io.budget
    assert b.capped_by == "time"
    assert b.tokens == b.tokens_in_time < b.tokens_requested
    # the run shown is the cut run the files run: its steps, about the mode's 2 h
    assert mp.run.steps == b.steps and mp.run.hours == pytest.approx(2.0, rel=0.01)
    assert any(w.startswith("the data asked for takes") for w in mp.warnings)
    assert b.epochs == pytest.approx(3.0 * b.tokens / b.tokens_requested)
    assert mp.data_io.reasons["budget"].startswith("token budget cut to") and "conservative's 2 h" in \
        mp.data_io.reasons["budget"]
    assert b.steps * mp.setup.global_batch * mp.setup.seq_len >= b.tokens


def test_token_budget_capped_by_dollars(workstation_nvme):
    mp = one_mode(workstation_nvme, examples=200_000, usd_per_hour=2.0, budget_usd=0.5)
    b = mp.data_io.budget
    assert b.capped_by == "budget" and b.tokens == b.tokens_in_budget < b.tokens_requested
    # $0.50 at $2/h = 15 minutes of this plan's tokens/s
    assert b.tokens_in_budget == pytest.approx(mp.speed.tokens_per_second * 900, rel=1e-6)
    assert "by the $0.5 budget at $2.00/h" in mp.data_io.reasons["budget"]


def test_pretraining_keeps_its_tokens_per_parameter(fixture_machine):
    hw = machine(fixture_machine("desktop-rtx4090"), disk("nvme", 3150.0, 570))
    mp = plan(PlanRequest(hardware=hw, method="pretrain", modes=("conservative",), vocab_size=4096)).modes[0]
    b = mp.data_io.budget
    assert b.tokens == mp.pretrain["tokens"] and b.capped_by is None
    assert mp.data_io.reasons["budget"].startswith("pretraining:")


# ---------------------------------------------------------------------------------------------
# packing from a local JSONL's length distribution
def test_padding_waste_pads_each_micro_batch_to_its_longest_row():
    assert padding_waste((100, 400), seq_len=512, micro_batch=2) == pytest.approx(1 - 500 / 800)
    assert padding_waste((100, 900), seq_len=512, micro_batch=2) == pytest.approx(1 - 612 / 1024)  # cut at seq_len
    assert padding_waste((100, 400), seq_len=512, micro_batch=1) == 0.0
    assert padding_waste((), 512, 4) is None


def _jsonl(path, lengths_chars):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "x" * n}]}) + "\n"
                            for n in lengths_chars))
    return path


def test_local_jsonl_is_measured(tmp_path):
    f = _jsonl(tmp_path / "chat.jsonl", [400, 2000] * 50)  # 100 and 500 tokens (+1 for the role "user")
    info = local_dataset_info([str(f)])
    assert info.rows == 100 and info.stored_bytes == f.stat().st_size
    assert sorted(set(info.row_tokens_sample)) == [101, 501] and info.tokens == 50 * 101 + 50 * 501


def test_large_jsonl_rows_extrapolated_from_the_sample(tmp_path):
    f = _jsonl(tmp_path / "big.jsonl", [400] * 3000)  # past the 2,000-row sample
    info = local_dataset_info([str(f)])
    assert len(info.row_tokens_sample) == 2000 and info.rows == 3000 and info.tokens == 3000 * 101
    assert "2,000 rows sampled" in info.tokens_how


def test_save_to_disk_and_parquet_are_measured(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"text": ["abcd" * k for k in range(1, 101)]})  # k tokens each
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    for path in (tmp_path / "saved", tmp_path / "rows.parquet"):
        info = local_dataset_info([str(path)])
        assert info.rows == 100 and info.tokens == 5050 and info.row_tokens_sample[:3] == (1, 2, 3)
        assert info.stored_bytes > 0


def test_packing_on_for_short_ragged_rows_off_for_full_rows(tmp_path, workstation_nvme):
    ragged = local_dataset_info([str(_jsonl(tmp_path / "a.jsonl", [400, 3600] * 200))])  # 101 / 901 tokens
    full = local_dataset_info([str(_jsonl(tmp_path / "b.jsonl", [3800, 4000] * 200))])  # 951 / 1001 tokens
    on = one_mode(workstation_nvme, dataset=ragged, target_batch=32).data_io
    off = one_mode(workstation_nvme, dataset=full, target_batch=32).data_io
    assert on.packing is True and on.padding_waste > 0.2 and on.reasons["packing"].startswith("on:")
    assert off.packing is False and off.padding_waste < 0.05 and off.reasons["packing"].startswith("off:")
    # packed, the epoch's steps count real tokens, not rows: 400 rows x 501 tokens in 1024-token rows,
    # 32 per step = 7 steps (one row per sequence would take 13)
    assert one_mode(workstation_nvme, dataset=ragged, target_batch=32).run.steps == 7


def test_dpo_and_pretraining_leave_packing_to_the_method(workstation_nvme, tmp_path):
    info = local_dataset_info([str(_jsonl(tmp_path / "p.jsonl", [400] * 20))])
    dp = one_mode(workstation_nvme, method="dpo", dataset=info).data_io
    assert dp.packing is None and "no packing" in dp.reasons["packing"]


# ---------------------------------------------------------------------------------------------
# Hub metadata offline (the tests' environment sets HF_DATASETS_OFFLINE=1)
def test_hub_offline_gives_a_reason_not_a_crash():
    info = hub_dataset_info("owner/some-corpus")
    assert info.stored_bytes is None and "Hub metadata not read" in info.unavailable["size"]


# ---------------------------------------------------------------------------------------------
# the CLI: --json carries the section, run.yaml the data keys trainfit train reads
def trainfit(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True, timeout=300)


def test_cli_json_section_and_run_yaml_data_keys(tmp_path):
    data = _jsonl(tmp_path / "chat.jsonl", [400, 3600] * 100)
    out = tmp_path / "out"
    r = trainfit("plan", "qwen2.5-0.5b", "--method", "lora", "--hardware", "rtx-4090", "--mode", "balanced",
                 "--seq-len", "1024", "--data", str(data), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    dp = json.loads(r.stdout)["modes"][0]["data_io"]
    assert dp["source"] == "local" and dp["packing"] is True and dp["keep_in_memory"] is True
    assert set(dp["reasons"]) >= {"source", "cache", "workers", "bottleneck", "packing", "budget"}
    assert dp["budget"]["tokens"] > 0 and dp["budget"]["capped_by"] is None
    cfg = yaml.safe_load((out / "balanced" / "run.yaml").read_text())
    # chat rows (a `messages` column) give format chat, which the run config needs for SFT
    assert cfg["data"] == {"paths": [str(data)], "format": "chat", "streaming": False, "cache_dir": None,
                           "keep_in_memory": True, "num_workers": 4, "prefetch_factor": 2, "packing": True}


def test_cli_hub_dataset_offline_still_plans(tmp_path):
    r = trainfit("plan", "qwen2.5-0.5b", "--method", "lora", "--hardware", "rtx-4090", "--mode", "balanced",
                 "--dataset", "owner/some-corpus", "--examples", "1000", "--json")
    assert r.returncode == 0, r.stderr
    dp = json.loads(r.stdout)["modes"][0]["data_io"]
    assert dp["source"] == "hub" and "Hub metadata not read" in dp["reasons"]["size"]
    assert dp["budget"]["tokens"] > 0
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--dataset", "not a hub id")
    assert r.returncode == 2 and "--dataset" in r.stderr
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--dataset", "a/b", "--data", str(tmp_path))
    assert r.returncode == 2 and "not both" in r.stderr


def test_time_capped_budget_sets_run_yaml_max_steps(tmp_path):
    out = tmp_path / "out"
    r = trainfit("plan", "qwen2.5-0.5b", "--method", "lora", "--hardware", "rtx-4090", "--mode", "conservative",
                 "--examples", "5000000", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)["modes"][0]["data_io"]["budget"]
    assert b["capped_by"] == "time"
    text = (out / "conservative" / "run.yaml").read_text()
    assert yaml.safe_load(text)["schedule"]["max_steps"] == b["steps"]
    assert f"# max_steps {b['steps']:,}: token budget cut to" in text



def test_unreadable_local_data_is_bad_input(tmp_path):
    bad = tmp_path / "rows.parquet"
    bad.write_bytes(b"PAR1 not really")
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--data", str(bad))
    assert r.returncode == 2 and "--data: cannot read" in r.stderr and "Traceback" not in r.stderr
    notjson = _jsonl(tmp_path / "x.jsonl", [10])
    notjson.write_text(notjson.read_text() + "{broken\n")
    r = trainfit("plan", "qwen2.5-0.5b", "--hardware", "rtx-4090", "--data", str(notjson))
    assert r.returncode == 2 and "line 2 is not JSON" in r.stderr


def test_streamed_plan_exports_a_run_config_trainfit_train_accepts(tmp_path, cloud_vm_network):
    """A local corpus too big for RAM and disk streams: run.yaml says streaming with max_steps
    (a stream has no length) and passes the run-config validation `trainfit train` applies."""
    from trainfit.export.plan_files import plan_files

    f = _jsonl(tmp_path / "corpus.jsonl", [400] * 50)
    info = dataclasses.replace(local_dataset_info([str(f)]), tokens=2_000_000_000_000, rows=4_000_000_000)
    req = PlanRequest(hardware=cloud_vm_network, method="full", model=QWEN, modes=("balanced",), seq_len=1024,
                      dataset=info)
    mp = plan(req).modes[0]
    assert mp.data_io.streaming
    files = plan_files(mp, req, "trainfit plan ...", [str(f)], base_dir=tmp_path)
    cfg = yaml.safe_load(files["run.yaml"])
    assert cfg["data"]["streaming"] is True and cfg["data"]["keep_in_memory"] is False
    assert cfg["data"]["num_workers"] == 1 and cfg["schedule"]["max_steps"] == mp.data_io.budget.steps
