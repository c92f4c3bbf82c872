"""data.cache_dir outside --out: checked before any data is read, and a run refused before its
first checkpoint takes the Arrow cache files it wrote there out again (nothing left outside
--out)."""

from __future__ import annotations

import json

import pytest

from trainfit.cli.main import main

from .conftest import make_config


def _run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else None


def _wrong_columns(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps({"question": "q", "good": "a", "bad": "b"}) for _ in range(8)) + "\n")
    return data


@pytest.mark.parametrize("existing", [False, True])
def test_a_refused_run_leaves_no_cache_files_outside_out(tmp_path, capsys, existing):
    conf = tmp_path / "conf"
    conf.mkdir()
    elsewhere = tmp_path / "elsewhere"
    if existing:  # a cache folder the user shares between runs: its own files stay
        (elsewhere / "json").mkdir(parents=True)
        (elsewhere / "json" / "earlier.arrow").write_bytes(b"an earlier run's cache")
    before = _listing(elsewhere)
    cfg = make_config(conf, "dpo", data={"paths": [str(_wrong_columns(tmp_path))], "cache_dir": "../elsewhere"})
    code, err = _run(capsys, "train", str(cfg), "--out", str(tmp_path / "run"))
    assert code == 2 and "'prompt' (data.prompt_column)" in err  # refused after the data was loaded ...
    assert _listing(elsewhere) == before  # ... and the Arrow files loading wrote there are gone
    assert not (tmp_path / "run").exists()


def test_the_cache_files_are_written_there_when_the_run_goes_on(tmp_path, monkeypatch):
    """The clean-up is what makes the test above pass: without it the files would stay."""
    from trainfit.train.run_dir import FailedStartCleanup

    conf = tmp_path / "conf"
    conf.mkdir()
    cfg = make_config(conf, "dpo", data={"paths": [str(_wrong_columns(tmp_path))], "cache_dir": "../elsewhere"})
    monkeypatch.setattr(FailedStartCleanup, "__call__", lambda self, say: None)
    assert main(["train", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert any(p.suffix == ".arrow" for p in (tmp_path / "elsewhere").rglob("*"))


def test_a_cache_dir_that_cannot_be_one_is_refused_before_any_work(tmp_path, capsys):
    conf = tmp_path / "conf"
    conf.mkdir()
    (tmp_path / "a-file").write_text("x")
    cfg = make_config(conf, "sft", data={"cache_dir": "../a-file"})
    code, err = _run(capsys, "train", str(cfg), "--out", str(tmp_path / "run"))
    assert code == 2 and "data.cache_dir:" in err and "is a file" in err
    assert not (tmp_path / "run").exists() and (tmp_path / "a-file").read_text() == "x"


@pytest.mark.parametrize("deep", [False, True])
def test_folder_additions_remove_only_what_was_added(tmp_path, deep):
    """The one undo of the run directory (its own entries) and of a shared cache folder (any depth)."""
    from trainfit.files import FolderAdditions

    root = tmp_path / "kept"
    (root / "json").mkdir(parents=True)
    (root / "json" / "earlier.arrow").write_text("x")
    added = FolderAdditions(root, deep=deep)
    (root / "json" / "new.arrow").write_text("y")
    (root / "fresh" / "sub").mkdir(parents=True)
    (root / "fresh" / "sub" / "f").write_text("z")
    assert added.undo() == (["fresh", "json/new.arrow"] if deep else ["fresh"])
    assert _listing(root) == (["json", "json/earlier.arrow"] if deep else ["json", "json/earlier.arrow",
                                                                         "json/new.arrow"])
    created = FolderAdditions(tmp_path / "a" / "b", deep=deep)  # created by the attempt: goes whole
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    assert created.undo() == ["."] and not (tmp_path / "a").exists()
