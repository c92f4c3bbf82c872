"""What the planner's search tries: image tokens of vision-language models, shorter sequences when the
mode's own do not fit, and a workload from the examples' length distribution (issue 33 items 2, 3, 8)."""

import json

import pytest

from trainfit.cli.main import main


def _plan_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["plan", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


# -- item 8: vision-language models ------------------------------------------------------------
def test_plan_counts_image_tokens_of_a_vision_language_model(capsys):
    """`plan --image-size` adds each image's tokens to the sequence, as `estimate` does: more memory
    and a longer step than the text-only plan of the same setting."""
    argv = ["qwen2-vl-2b", "--hardware", "rtx-4090", "--method", "lora", "--mode", "balanced", "--seq-len", "1024"]
    code, text_only = _plan_json(capsys, *argv)
    assert code == 0
    code, with_images = _plan_json(capsys, *argv, "--image-size", "448", "--images-per-example", "2")
    assert code == 0
    t, i = text_only["modes"][0], with_images["modes"][0]
    assert i["setup"]["image_size"] == 448 and i["setup"]["images_per_example"] == 2
    # 2 images x (448/28)^2 = 512 tokens join the 1024 text tokens
    assert i["memory_used_bytes"] > t["memory_used_bytes"]
    assert any("512 image tokens" in n for n in i["speed"]["notes"])


def test_plan_image_size_alone_means_one_image(capsys):
    code, doc = _plan_json(capsys, "qwen2-vl-2b", "--hardware", "rtx-4090", "--method", "lora", "--mode",
                           "conservative", "--image-size", "448")
    assert code == 0 and doc["modes"][0]["setup"]["images_per_example"] == 1


@pytest.mark.parametrize("argv, needle", [
    (["llama-3.2-1b", "--image-size", "448"], "no vision tower"),
    (["qwen2-vl-2b", "--image-size", "448", "--images-per-example", "0"], "--images-per-example >= 1"),
    (["qwen2-vl-2b", "--images-per-example", "-1"], "--images-per-example"),
    (["qwen2-vl-2b", "--image-size", "nan"], "--image-size"),
    (["--method", "pretrain", "--image-size", "448"], "--image-size"),
])
def test_plan_refuses_bad_image_flags_like_estimate(capsys, argv, needle):
    try:
        code = main(["plan", *argv, "--hardware", "rtx-4090"])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err


# -- item 3: --examples is N rows of a length distribution, not N x seq_len ----------------------
def test_examples_are_sized_by_a_typical_length_not_the_sequence_length(capsys):
    """10,000 chat examples are ~7.8M tokens (the typical SFT length, cited in typical_lengths.yaml),
    in every mode: not 10,000 x 1024 in one mode and 10,000 x 2048 in the next. Only what a mode's
    shorter sequence cuts off differs, and the plan says how much."""
    from trainfit.core.plan.lengths import typical_lengths

    mean = typical_lengths()["sft"].mean_tokens
    code, doc = _plan_json(capsys, "Qwen/Qwen2.5-1.5B-Instruct", "--method", "lora", "--hardware", "a10g",
                           "--examples", "10000")
    assert code == 0
    shares = {}
    for m in doc["modes"]:
        sized, run = m["data_lengths"], m["run"]
        assert sized["rows"] == 10000 and sized["seq_len"] == m["setup"]["seq_len"]
        assert sized["epoch_tokens"] <= 10000 * mean * 1.01  # never N x seq_len (10.2M / 20.5M / 41M)
        assert run["tokens"] == pytest.approx(sized["epoch_tokens"], rel=0.03)  # packed: within the last step
        assert any(r.startswith("data: 10,000 examples") and "truncates" in r for r in m["reasons"])
        shares[m["setup"]["seq_len"]] = sized["truncated_share"]
    # a longer sequence truncates fewer examples
    ordered = [shares[k] for k in sorted(shares)]
    assert ordered == sorted(ordered, reverse=True) and ordered[0] > 0


def test_dpo_pairs_count_two_sequences_at_the_pairs_length(capsys):
    code, doc = _plan_json(capsys, "qwen2.5-0.5b", "--method", "dpo", "--hardware", "a100-80gb", "--examples",
                           "1000", "--mode", "balanced")
    m = doc["modes"][0]
    s, sized = m["setup"], m["data_lengths"]
    assert code == 0 and sized["rows"] == 1000
    # two sequences per pair, each about half the pair's ~800 tokens: ~800K, not 1000 x 2 x 2048
    assert 600_000 < m["run"]["tokens"] == sized["epoch_tokens"] < 1000 * 2 * s["seq_len"] / 2


def test_data_sample_lengths_say_which_share_is_truncated(tmp_path, capsys):
    """--data: the sampled row lengths (100 short rows, 10 of ~2,000 tokens) give the truncated share."""
    rows = [{"text": "word " * 80}] * 100 + [{"text": "x" * 8000}] * 10
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code, doc = _plan_json(capsys, "qwen2.5-0.5b", "--method", "lora", "--hardware", "a100-80gb", "--data",
                           str(data), "--seq-len", "1024", "--mode", "balanced")
    sized = doc["modes"][0]["data_lengths"]
    assert code == 0 and sized["rows"] == 110
    assert sized["truncated_share"] == pytest.approx(10 / 110)
    assert sized["epoch_tokens"] == 100 * 100 + 10 * 1024
    assert "sampled" in sized["how"]


# -- item 2: shorter sequences before "nothing fits" --------------------------------------------
def test_dpo_8b_on_a_12gb_card_finds_a_shorter_sequence(capsys):
    """Llama-3-8B DPO on an RTX 3060 (12 GB): none of the modes' own sequence lengths fits, 1024 does
    (QLoRA, ~84 % of extreme's budget); the plan says why and what 1024 tokens truncate."""
    code, doc = _plan_json(capsys, "meta-llama/Meta-Llama-3-8B-Instruct", "--method", "dpo", "--hardware",
                           "rtx-3060", "--examples", "1000")
    assert code == 0
    extreme = next(m for m in doc["modes"] if m["mode"] == "extreme")
    assert extreme["fits"] and extreme["setup"]["seq_len"] == 1024 and extreme["setup"]["quant"] != "none"
    assert any(r.startswith("seq 1024: none of extreme's 4096 / 2048 tokens fits") and "truncates" in r
               for r in extreme["reasons"])
    assert extreme["data_lengths"]["truncated_share"] > 0


def test_a_given_seq_len_is_kept_and_the_advice_names_one_that_fits(capsys):
    code, doc = _plan_json(capsys, "meta-llama/Meta-Llama-3-8B-Instruct", "--method", "dpo", "--hardware",
                           "rtx-3060", "--examples", "1000", "--seq-len", "2048")
    assert code == 3 and not any(m["fits"] for m in doc["modes"])
    extreme = next(m for m in doc["modes"] if m["mode"] == "extreme")
    assert any(w.startswith("--seq-len 1024 fits") and "truncates" in w for w in extreme["warnings"])


def test_qlora_8b_on_an_8gb_card_fits_at_the_guides_setting(capsys):
    """Seed 002's 'Llama 3 8B QLoRA from 8 GB': extreme finds it at 512 tokens with adapters on the
    attention projections (all-linear adapters do not fit 95 % of an RTX 3070)."""
    code, doc = _plan_json(capsys, "meta-llama/Meta-Llama-3-8B", "--method", "qlora", "--hardware", "rtx-3070")
    assert code == 0
    extreme = next(m for m in doc["modes"] if m["mode"] == "extreme")
    assert extreme["fits"] and extreme["setup"]["seq_len"] == 512
    assert extreme["setup"]["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert extreme["memory_used_bytes"] <= extreme["memory_budget_bytes"]
    # no data size given: what 512 tokens cut off is said at the typical chat lengths
    assert any(r.startswith("seq 512: none of extreme's 4096 / 2048 tokens fits") and "truncates" in r
               and "at typical lengths" in r for r in extreme["reasons"])
    balanced = next(m for m in doc["modes"] if m["mode"] == "balanced")
    assert not balanced["fits"] and any(w.startswith("also tried, and none fits: sequences down to 512")
                                        for w in balanced["warnings"])


def test_a_mode_that_fits_keeps_its_own_sequence_lengths(capsys):
    code, doc = _plan_json(capsys, "qwen2.5-0.5b", "--method", "lora", "--hardware", "a100-80gb")
    assert code == 0
    for m in doc["modes"]:
        assert m["setup"]["seq_len"] in m["targets"]["seq_lens"]
        assert m["setup"]["lora"]["target_modules"] != ["q_proj", "k_proj", "v_proj", "o_proj"]
        assert not any(r.startswith("seq ") for r in m["reasons"])


def test_typical_lengths_are_cited_and_a_bad_catalog_is_refused():
    from trainfit.core.plan.lengths import LengthCatalogError, parse_lengths, typical_lengths

    table = typical_lengths()
    assert set(table) == {"sft", "dpo", "pretrain"}
    assert all("http" in t.source and 100 < t.mean_tokens < 5000 for t in table.values())
    with pytest.raises(LengthCatalogError):
        parse_lengths("tasks:\n  - task: sft\n    rows: 0\n")


def test_hub_sizes_give_the_mean_and_the_sample_follows_it():
    """--dataset: the Hub's bytes per row set the mean (the spread is the task's assumed one)."""
    from trainfit.core.plan.data_io import DatasetInfo
    from trainfit.core.plan.lengths import data_lengths, with_lengths
    from trainfit.core.setup import TrainingSetup

    info = with_lengths(DatasetInfo("hub", "owner/set", rows=1000, tokens=500_000), "lora", None)
    sample = info.row_tokens_sample
    assert sum(sample) / len(sample) == pytest.approx(500, rel=0.05) and info.tokens == 500_000
    long_seq = data_lengths(info, TrainingSetup(method="lora", seq_len=8192))
    short_seq = data_lengths(info, TrainingSetup(method="lora", seq_len=256))
    assert long_seq.truncated_share < 0.01 < short_seq.truncated_share
    assert short_seq.epoch_tokens < long_seq.epoch_tokens <= 500_000 * 1.05
