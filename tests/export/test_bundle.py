"""render_files' file set and headers; publish.write_tree's all-or-nothing behaviour with one folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainfit.errors import EXIT_BAD_INPUT, BadInputError, UnavailableError
from trainfit.export import publish as publish_mod
from trainfit.export.bundle import render_files
from trainfit.export.publish import write_tree

from .conftest import HEADER, make_cfg


def render(cfg, procs=1, device="cpu", **kw):
    return render_files(cfg, header_lines=HEADER, num_processes=procs, device=device,
                        run_config_text="version: 1\nmethod: x\n", **kw)


def write_files(out_dir, files, *, force):
    """One folder's files written the way plan --out writes each mode's."""
    return write_tree(out_dir, {"": files}, force=force)[""]


def listing(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("method,strategy,expected", [
    ("pretrain", "auto", {"run.yaml", "training_args.yaml", "accelerate.yaml", "launch.sh"}),
    ("lora", "auto", {"run.yaml", "training_args.yaml", "lora.yaml", "accelerate.yaml", "launch.sh"}),
    ("sft", "deepspeed", {"run.yaml", "training_args.yaml", "accelerate.yaml", "deepspeed.json", "launch.sh"}),
])
def test_file_set_and_headers(method, strategy, expected):
    files = render(make_cfg(method, distributed={"strategy": strategy}, training={"zero_stage": 2}), 2, "cuda")
    assert set(files) == expected
    for name, text in files.items():
        if name.endswith(".json"):
            assert all(h in text for h in HEADER)
        else:
            body = text.split("\n", 1)[1] if text.startswith("#!") else text
            assert body.startswith("".join(f"# {h}\n" for h in HEADER)), name
    assert files["run.yaml"].endswith("version: 1\nmethod: x\n")


def test_multi_line_header_lines_stay_comments():
    files = render_files(make_cfg("pretrain"), header_lines=["two\nlines", ""], num_processes=1, device="cpu",
                         run_config_text="")
    assert files["accelerate.yaml"].startswith("# two\n# lines\n#\n")


def test_mps_cannot_run_several_processes():
    with pytest.raises(BadInputError):
        render(make_cfg("pretrain"), 2, "mps")


# ---------------------------------------------------------------------------------------------
def test_creates_parents_and_leaves_no_temp_files(tmp_path):
    files = render(make_cfg("lora"))
    out = tmp_path / "a" / "b"
    written = write_files(out, files, force=False)
    assert [p.name for p in written] == list(files) and sorted(os.listdir(out)) == sorted(files)
    assert all((out / n).read_text() == t for n, t in files.items())
    assert os.access(out / "launch.sh", os.X_OK) and not os.access(out / "run.yaml", os.X_OK)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]


def test_refuses_existing_files_without_force_and_touches_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "launch.sh").write_text("mine\n")
    (out / "other.txt").write_text("keep\n")
    before = listing(out)
    with pytest.raises(BadInputError) as err:
        write_files(out, render(make_cfg("pretrain")), force=False)
    assert err.value.exit_code == EXIT_BAD_INPUT and "launch.sh" in str(err.value) and "--force" in str(err.value)
    assert listing(out) == before


def test_force_overwrites(tmp_path):
    out = tmp_path / "out"
    write_files(out, render(make_cfg("pretrain")), force=False)
    (out / "other.txt").write_text("keep\n")
    files = render(make_cfg("lora"))
    write_files(out, files, force=True)
    assert listing(out) == {**{n: t.encode() for n, t in files.items()}, "other.txt": b"keep\n"}


def test_refuses_a_file_as_out_dir(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(BadInputError, match="not a directory"):
        write_files(target, {"a.yaml": "a: 1\n"}, force=True)
    assert target.read_text() == "x"


def test_refuses_a_directory_in_the_way_and_bad_names(tmp_path):
    (tmp_path / "run.yaml").mkdir()
    with pytest.raises(BadInputError, match="directory is in the way"):
        write_files(tmp_path, {"a.yaml": "", "run.yaml": ""}, force=True)
    for bad in ("../x", "sub/x", ".", ""):
        with pytest.raises(BadInputError):
            write_files(tmp_path, {bad: ""}, force=True)
    assert sorted(os.listdir(tmp_path)) == ["run.yaml"]


def test_a_failure_half_way_leaves_nothing_new(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.yaml").write_text("mine\n")
    files = render(make_cfg("lora"))
    real_rename = os.rename
    placed = []

    def flaky_rename(src, dst):
        if Path(dst).parent == out:  # a move into place
            if Path(dst).name == "accelerate.yaml":
                raise OSError(28, "No space left on device")
            placed.append(Path(dst).name)
        return real_rename(src, dst)

    monkeypatch.setattr(publish_mod.os, "rename", flaky_rename)
    with pytest.raises(UnavailableError, match="No space left.*nothing was written"):
        write_files(out, files, force=True)
    assert placed == ["run.yaml", "training_args.yaml", "lora.yaml", "run.yaml"]  # placed, then undone
    assert listing(out) == {"run.yaml": b"mine\n"}  # the replaced file is back, no staging folder left


def test_a_failure_before_the_rename_leaves_no_new_folder(tmp_path, monkeypatch):
    out = tmp_path / "new" / "out"

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish_mod.os, "rename", no_rename)
    with pytest.raises(UnavailableError, match="nothing was written"):
        write_files(out, render(make_cfg("lora")), force=False)
    assert os.listdir(tmp_path) == []  # neither the folders it created nor its staging folder


@pytest.mark.parametrize("existing", [False, True])
def test_each_staged_file_and_folder_is_fsynced_once(tmp_path, monkeypatch, existing):
    import stat

    out = tmp_path / "out"
    if existing:
        out.mkdir()
    real_fsync = os.fsync
    synced = []

    def counting_fsync(fd):
        info = os.fstat(fd)
        synced.append(("file" if stat.S_ISREG(info.st_mode) else "dir", info.st_ino))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    files = render(make_cfg("lora"))
    write_tree(out, {"a": files, "b/c": files}, force=False)
    inodes = {os.stat(out / f / n).st_ino for f in ("a", "b/c") for n in files}
    file_syncs = [ino for kind, ino in synced if kind == "file" and ino in inodes]
    assert sorted(file_syncs) == sorted(inodes)  # every file once, none twice
    folders = {os.stat(out / f).st_ino for f in ("a", "b", "b/c")}  # staged, then moved into place
    assert sorted(ino for kind, ino in synced if kind == "dir" and ino in folders) == sorted(folders)
