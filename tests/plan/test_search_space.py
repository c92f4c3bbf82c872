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
