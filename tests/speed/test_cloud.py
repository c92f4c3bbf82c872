"""Cloud catalog, ranking, recommendation, seeds' time/cost figures and the CLI's bad inputs."""

import json
import subprocess
import sys

import pytest

from trainfit.cli.cmd_cloud import cloud
from trainfit.core.cloud.catalog import COLUMNS, load_cloud_catalog
from trainfit.core.plan.cloud_rank import cost_class
from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.run.power import estimate_power
from trainfit.core.setup import TrainingSetup
from trainfit.core.speed import Workload, predict_step
from trainfit.errors import BadInputError

from .conftest import LLAMA2_7B

HF_FLAVORS = ["cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1", "l4x4", "a10g-small", "a10g-large",
              "a10g-largex2", "a10g-largex4", "a100-large"]  # fmt: skip
# Seed 004's own hourly prices, to reproduce its worked examples exactly.
SEED004_PRICES = "id,usd_per_hour\nt4-small,0.75\na10g-small,3.50\na10g-large,5.00\na100-large,10.00\n"


@pytest.fixture
def seed_prices(tmp_path):
    path = tmp_path / "seed004.csv"
    path.write_text(SEED004_PRICES)
    return str(path)


def test_catalog_has_seed_flavors_with_sources():
    cat = load_cloud_catalog()
    ids = {f.id for f in cat.flavors}
    assert set(HF_FLAVORS) <= ids
    for needed in ("g5.xlarge", "g5.2xlarge", "p4d.24xlarge", "n1-standard-8+t4", "n1-standard-8+v100",
                   "a2-highgpu-2g", "a2-megagpu-16g", "Standard_NC6s_v3", "Standard_ND96amsr_A100_v4",
                   "p5.48xlarge", "h200", "g6e.xlarge", "runpod-rtx-3090", "runpod-rtx-4090"):  # fmt: skip
        assert needed in ids, needed
    for f in cat.flavors:
        assert f.source.startswith("https://") and f.as_of, f.id
    tpus = [f for f in cat.flavors if f.kind == "tpu"]
    assert {t.id for t in tpus} == {"v5e-1x1", "v5e-2x2", "v5e-2x4"} and not any(t.usable for t in tpus)


def test_price_file_overrides_and_adds(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("flavors:\n  - {id: t4-small, usd_per_hour: 9.5}\n"
                    "  - {id: my-box, provider: home, kind: gpu, gpu: rtx-4090, gpu_count: 2, usd_per_hour: 0.3}\n")  # fmt: skip
    cat = load_cloud_catalog(path)
    assert cat.get("t4-small").usd_per_hour == 9.5 and cat.get("t4-small").gpu == "t4"
    assert cat.get("my-box").gpu_count == 2


@pytest.mark.parametrize(
    "text,needle",
    [
        ("id,usd_per_hr\nt4-small,1\n", "unknown column 'usd_per_hr'"),
        ("usd_per_hour\n1\n", "missing column 'id'"),
        ("id,provider,kind,gpu,gpu_count\nnew,x,gpu,t4,1\n", "missing column 'usd_per_hour'"),
        ("id,provider,kind,gpu,gpu_count,usd_per_hour\nnew,x,gpu,t5,1,1.0\n", "unknown GPU 't5'"),
        ("id,usd_per_hour\nt4-small,cheap\n", "must be a number"),
    ],
)
def test_bad_price_files(tmp_path, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(BadInputError) as err:
        load_cloud_catalog(path)
    assert needle in str(err.value)
    if "column" in needle and "unknown" in needle:
        assert all(c in str(err.value) for c in COLUMNS)


def test_cost_classes_follow_seed_004():
    assert [cost_class(x) for x in (0.19, 7, 30, 80, 500)] == ["under $5", "$5-20", "$20-50", "$50-200", "over $200"]


def test_ranking_recommends_cheapest_and_fastest_within_limits():
    r = cloud("Qwen/Qwen2.5-7B-Instruct", method="lora", examples=10000, seq_len=1024)
    ok = [x for x in r.results if x.fits]
    assert r.cheapest == min(ok, key=lambda x: x.cost_usd).flavor
    assert r.fastest == min(ok, key=lambda x: x.hours).flavor
    assert r.results[0].flavor == r.cheapest and "rent" in r.recommendation
    strict = cloud("Qwen/Qwen2.5-7B-Instruct", method="lora", examples=10000, seq_len=1024, allow_fallback=False,
                   flavors=["t4-small", "a100-large"])  # fmt: skip
    by = {x.flavor: x for x in strict.results}
    assert not by["t4-small"].fits and "memory" in by["t4-small"].why  # bf16 7B weights alone are ~14 GiB
    assert strict.results[0].flavor == "a100-large"
    # Budget below the fastest flavor's cost: the fastest within budget changes, never exceeds it.
    r2 = cloud("Qwen/Qwen2.5-7B-Instruct", method="lora", examples=10000, seq_len=1024, budget=2.0, max_hours=3)
    fast = next(x for x in r2.results if x.flavor == r2.fastest)
    assert fast.cost_usd <= 2.0 and fast.hours <= 3


def test_fallback_to_lora_only_when_allowed():
    r = cloud("Qwen/Qwen2.5-7B-Instruct", method="full", examples=1000, seq_len=512, flavors=["a10g-large"])
    assert r.results[0].fits and r.results[0].method in ("lora", "qlora")
    strict = cloud("Qwen/Qwen2.5-7B-Instruct", method="full", examples=1000, seq_len=512, flavors=["a10g-large"],
                   allow_fallback=False)  # fmt: skip
    assert not strict.results[0].fits and strict.cheapest is None and strict.closest == "a10g-large"


def test_precision_follows_gpu_capability():
    r = cloud("Qwen/Qwen2.5-0.5B", method="lora", examples=100, seq_len=256, flavors=["t4-small", "a10g-small"])
    by = {x.flavor: x for x in r.results}
    # LoRA keeps the frozen base in 16-bit (no fp32 master copy): fp16 on Turing, bf16 from Ampere on.
    assert by["t4-small"].precision == "fp16" and by["a10g-small"].precision == "bf16"
    full = cloud("Qwen/Qwen2.5-0.5B", method="full", examples=100, seq_len=256, flavors=["t4-small", "a10g-small"])
    by = {x.flavor: x for x in full.results}
    assert by["t4-small"].precision == "fp16-mixed" and by["a10g-small"].precision == "bf16-mixed"


def test_seed004_quick_demo_t4_small(seed_prices):
    """Seed 004: quick demo on t4-small, 50-100 examples, 5-10 steps, ~10-15 min, $0.19 at $0.75/h.

    Assumed: Qwen2.5-0.5B full fine-tune, 100 examples x 512 tokens, 1 epoch (6-7 optimizer steps
    of 16). Training itself takes well under a minute on a T4; the seed's 10-15 minutes is the
    job's setup (image, pip install, weight download), which the default 10 setup minutes carry.
    """
    r = cloud("Qwen/Qwen2.5-0.5B", method="full", examples=100, seq_len=512, flavors=["t4-small"], prices=seed_prices)
    x = r.results[0]
    assert x.fits and x.precision == "fp16-mixed"
    assert 10 / 60 <= x.hours <= 15 / 60
    assert 0.12 <= x.cost_usd <= 0.19 and x.cost_class == "under $5"


def test_seed004_development_and_production(seed_prices):
    """Seed 004 development: 1K examples, 1 epoch, '~30-60 minutes' on a10g-small; production:
    a10g-large 6 h / $30 at $5/h.

    Assumed: Qwen2.5-3B LoRA (all linear layers, r=16). Development 1K x 2048 tokens -> 30-60 min
    (the seed's cost example of 2 h / $7 at $3.50/h is 2-4x its own 30-60 minute row; we reproduce
    the row). Production: 10K examples x 1024 tokens x 3 epochs on a10g-large -> ~6 h, ~$30.
    The seed's examples fill their sequences, so they are given as tokens (--examples sizes rows at
    the typical chat length instead).
    """
    dev = cloud("Qwen/Qwen2.5-3B", method="lora", dataset_tokens=1000 * 2048, seq_len=2048, flavors=["a10g-small"],
                prices=seed_prices, allow_fallback=False).results[0]  # fmt: skip
    assert dev.fits and 0.5 <= dev.hours <= 1.0 and dev.cost_usd <= 3.5
    prod = cloud("Qwen/Qwen2.5-3B", method="lora", dataset_tokens=10000 * 1024, seq_len=1024, epochs=3, flavors=["a10g-large"],
                 prices=seed_prices, allow_fallback=False).results[0]  # fmt: skip
    # The seed names no model or dataset for this row: the tolerance is the +-35 % used for published figures.
    assert prod.fits and 6 * 0.65 <= prod.hours <= 6 * 1.35 and 30 * 0.65 <= prod.cost_usd <= 30 * 1.35


def test_seed000_dpo_qwen7b_on_a100(tmp_path):
    """Seed 000: Qwen2.5-7B DPO, 10K preference pairs, 3 epochs, batch 4 x accumulation 8 on an
    A100 (40GB): '12-24 hours'. Assumed: 2048 tokens per response (prompt + completion), LoRA
    policy with the base as reference (full DPO of 7B does not fit 40 GB), global batch 32."""
    path = tmp_path / "a100.csv"
    path.write_text("id,provider,kind,gpu,gpu_count,usd_per_hour\nseed-a100,seed,gpu,a100-40gb,1,1.0\n")
    x = cloud("Qwen/Qwen2.5-7B-Instruct", method="dpo", examples=10000, seq_len=2048, epochs=3,
              prices=str(path), flavors=["seed-a100"], global_batch=32).results[0]  # fmt: skip
    assert x.fits and x.method in ("dpo+lora", "dpo+qlora")
    assert 12 <= x.hours <= 24


def test_power_estimate_for_a_run():
    hw = resolve_hardware("8x a100-80gb")
    setup = TrainingSetup(method="pretrain", micro_batch=2, seq_len=4096, num_gpus=8, zero_stage=3, attention="flash")
    speed = predict_step(LLAMA2_7B, setup, hw, Workload(dataset_tokens=10**9))
    p = estimate_power(hw, speed, price_per_kwh=0.2)
    limit = hw.gpus[0].power_limit_watts or hw.gpus[0].tdp_watts
    assert 0.8 * limit <= p.gpu_watts_each <= limit  # compute-bound: near the power limit
    assert p.energy_kwh == pytest.approx(p.total_watts * speed.total_seconds / 3.6e6)
    assert p.electricity_cost == pytest.approx(p.energy_kwh * 0.2)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", "cloud", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["Qwen/Qwen2.5-0.5B", "--examples", "100", "--flavor", "t9-huge"], "unknown cloud flavor"),
        (["Qwen/Qwen2.5-0.5B", "--dataset-tokens", "0"], "must be an integer from 1"),
        (["Qwen/Qwen2.5-0.5B", "--examples", "10", "--budget", "-5"], "--budget"),
        (["Qwen/Qwen2.5-0.5B", "--examples", "10", "--method", "inference"], "invalid choice"),
        (["Qwen/Qwen2.5-0.5B"], "--dataset-tokens"),
    ],
)
def test_cli_bad_input_exits_2(args, needle):
    done = _cli(*args)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_cli_bad_price_file_and_gpu(tmp_path):
    bad = tmp_path / "p.csv"
    bad.write_text("id,price\nt4-small,1\n")
    done = _cli("Qwen/Qwen2.5-0.5B", "--examples", "10", "--prices", str(bad))
    assert done.returncode == 2 and "unknown column 'price'" in done.stderr and "usd_per_hour" in done.stderr
    gpu = tmp_path / "g.csv"
    gpu.write_text("id,provider,kind,gpu,gpu_count,usd_per_hour\nx,me,gpu,rtx-9999,1,1\n")
    done = _cli("Qwen/Qwen2.5-0.5B", "--examples", "10", "--prices", str(gpu))
    assert done.returncode == 2 and "unknown GPU 'rtx-9999'" in done.stderr


def test_cli_json_and_exit_3_when_over_budget():
    done = _cli("Qwen/Qwen2.5-7B-Instruct", "--examples", "10000", "--flavor", "a100-large", "--budget", "0.01", "--json")
    assert done.returncode == 3
    doc = json.loads(done.stdout)
    assert doc["cheapest"] is None and doc["closest"] == "a100-large"
    assert "closest" in done.stderr
