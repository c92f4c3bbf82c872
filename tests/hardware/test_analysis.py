"""Score, warnings and suggestions derived from fixture machines."""

from trainfit.hardware.analysis import analyze_profile


def test_score_orders_machines_sensibly(profiles):
    score = {name: analyze_profile(p).score for name, p in profiles.items()}
    assert score["8x-h100-sxm"] == 10.0
    assert score["8x-h100-sxm"] > score["amd-mi300x"] > score["2x-rtx4090"] > score["desktop-rtx4090"]
    assert score["desktop-rtx4090"] > score["laptop-rtx3060-battery"]
    assert score["cpu-only-vm"] < 2 and score["container-4gib"] < score["cpu-only-vm"]


def test_laptop_on_battery_warnings_and_penalty(profiles):
    a = analyze_profile(profiles["laptop-rtx3060-battery"])
    assert any(w.startswith("On battery (64 %, about 90 min left)") for w in a.warnings)
    assert any("sw_power_cap" in w for w in a.warnings)
    assert any(r.startswith("-1 on battery") for r in a.reasoning)
    assert any("LoRA/QLoRA" in s for s in a.suggestions)


def test_container_and_mig_warnings(profiles):
    a = analyze_profile(profiles["container-4gib"])
    assert any("Container memory limit 4.0 GiB" in w for w in a.warnings)
    assert any("Little RAM" in w for w in a.warnings)
    m = analyze_profile(profiles["a100-mig-container"])
    assert any("MIG slice (1g.10gb)" in w for w in m.warnings)


def test_multi_gpu_suggestions_follow_the_interconnect(profiles):
    assert any("No NVLink" in s for s in analyze_profile(profiles["2x-rtx4090"]).suggestions)
    assert any("all-to-all" in s for s in analyze_profile(profiles["8x-h100-sxm"]).suggestions)


def test_hdd_cache_and_driver_mismatch_warned(profiles):
    a = analyze_profile(profiles["desktop-rtx4090"])
    assert any("cache dir /mnt/data/hf is on hdd" in w for w in a.warnings)
    f = analyze_profile(profiles["fault-driver-mismatch"])
    assert any("NVIDIA GPU unusable: Driver/library version mismatch" in w for w in f.warnings)
