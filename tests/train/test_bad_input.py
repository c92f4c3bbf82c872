"""Bad input: one clear line naming the key, exit 2, no traceback."""

from __future__ import annotations

import json

from trainfit.cli.main import main

from .conftest import REPO, make_config


def _run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_missing_data_file(tmp_path, capsys):
    cfg = make_config(tmp_path, "sft", data={"paths": ["nowhere.jsonl"]})
    code, err = _run(capsys, "train", str(cfg), "--out", str(tmp_path / "run"))
    assert code == 2 and "data.paths[0]" in err and "nowhere.jsonl does not exist" in err
    assert not (tmp_path / "run").exists()


def test_missing_config(tmp_path, capsys):
    code, err = _run(capsys, "train", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err


def test_wrong_columns(tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps({"question": "q", "good": "a", "bad": "b"}) for _ in range(8)) + "\n")
    cfg = make_config(tmp_path, "dpo", data={"paths": [str(data)]})
    code, err = _run(capsys, "train", str(cfg), "--out", str(tmp_path / "run"))
    assert code == 2 and "'prompt' (data.prompt_column)" in err and "question, good, bad" in err


def test_parquet_and_saved_dataset_load(tmp_path):
    import datasets

    from trainfit.train.data import check_columns, load_raw_dataset
    from trainfit.config.run_config import load_run_config

    rows = {"body": [f"line {i} of the corpus" for i in range(20)]}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "d.parquet"))
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    for path, streaming in (("d.parquet", False), ("saved", False), ("d.parquet", True)):
        cfg = load_run_config(make_config(tmp_path, "pretrain", data={
            "paths": [path], "text_column": "body", "streaming": streaming, "max_samples": None}))
        ds = load_raw_dataset(cfg)
        check_columns(cfg, ds)
        assert [r["body"] for r in ds][:2] == rows["body"][:2]


def test_shipped_corpora_regenerate_identically(tmp_path, monkeypatch):
    from trainfit.data.corpora import generate

    monkeypatch.setattr(generate, "HERE", tmp_path)
    generate.main()
    shipped = REPO / "src" / "trainfit" / "data" / "corpora"
    for name in ("tiny-corpus.txt", "tiny-chat.jsonl", "tiny-preferences.jsonl"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes()
