"""`trainfit train` honours the data keys: streamed datasets resume exactly, DataLoader workers and
prefetch reach the Trainer's DataLoader, keep_in_memory writes no cache file, cache_dir receives
them, SFT packing reaches TRL, and the combinations that cannot work are refused by key."""

from __future__ import annotations

import json

import pytest
from transformers import TrainerCallback

from trainfit.cli.main import main
from trainfit.config.run_config import load_run_config
from trainfit.errors import BadInputError
from trainfit.export.training_args import trainer_config
from trainfit.train.runner import run_training

from .conftest import loss_trajectory, make_config, tree_digest

# Few enough rows that the stream ends (and starts again) inside the 12 steps, and before the
# checkpoint the resume starts from: the case where the Trainer's own skip on resume was wrong.
SHORT_STREAM = {"streaming": True, "max_samples": 20}


class LoaderProbe(TrainerCallback):
    """Records the DataLoader the Trainer built (on_train_begin receives it)."""

    def __init__(self) -> None:
        self.loaders: list = []

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.loaders.append(train_dataloader)


def _args(cfg, tmp_path):
    return trainer_config(cfg, device="cpu", output_dir=str(tmp_path), world_size=1, transformers_major=5)[1]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["pretrain", "sft"])
def test_streamed_run_resumes_exactly(tmp_path, method):
    cfg = load_run_config(make_config(tmp_path, method, data=SHORT_STREAM))
    full = run_training(cfg, tmp_path / "full", quiet=True)
    assert full.global_step == 12
    run_dir = tmp_path / "run"
    run_training(cfg, run_dir, stop_after=6, quiet=True)
    # resumed with a DataLoader worker: the stream's order does not depend on the workers, and the
    # config hash leaves them out, so the run resumes; one worker reads the stream
    with_workers = load_run_config(make_config(tmp_path, method, name="workers.yaml",
                                               data={**SHORT_STREAM, "num_workers": 3, "prefetch_factor": 2}))
    probe, messages = LoaderProbe(), []
    resumed = run_training(with_workers, run_dir, resume=True, quiet=True, extra_callbacks=[probe],
                           log=messages.append)
    assert resumed.resumed_from.endswith("checkpoint-6")
    assert loss_trajectory(run_dir) == dict(full.losses)  # exact float equality on CPU
    assert [(dl.num_workers, dl.prefetch_factor) for dl in probe.loaders] == [(1, 2)]
    assert any("data.num_workers 3 -> 1" in m for m in messages)


def test_streamed_blocks_survive_pickling(tmp_path):
    """Workers started with spawn (macOS, Windows) receive the stream pickled: the same blocks."""
    import itertools
    import pickle

    from trainfit.train.data import build_train_dataset
    from trainfit.train.tokenizer import load_tokenizer

    cfg = load_run_config(make_config(tmp_path, "pretrain", data=SHORT_STREAM, schedule={"max_steps": 1}))
    run_training(cfg, tmp_path / "run", quiet=True)
    stream = build_train_dataset(cfg, load_tokenizer(tmp_path / "run" / "tokenizer"))
    first = [b["input_ids"] for b in itertools.islice(stream, 40)]  # past the end of one pass: repeated
    again = [b["input_ids"] for b in itertools.islice(pickle.loads(pickle.dumps(stream)), 40)]
    assert first == again and len(first) == 40 and all(len(b) == cfg.training.seq_len for b in first)


def test_streamed_sft_reads_in_process_where_workers_spawn(tmp_path, monkeypatch):
    """TRL's tokenising steps of a stream cannot be pickled into spawned workers: 0 workers, said."""
    from trainfit.train import data

    monkeypatch.setattr(data, "_worker_start_method", lambda: "spawn")
    cfg = load_run_config(make_config(tmp_path, "sft", data={**SHORT_STREAM, "num_workers": 1},
                                      schedule={"max_steps": 2}))
    probe, messages = LoaderProbe(), []
    assert run_training(cfg, tmp_path / "run", quiet=True, extra_callbacks=[probe], log=messages.append).global_step == 2
    assert [dl.num_workers for dl in probe.loaders] == [0]
    assert any("data.num_workers 1 -> 0: DataLoader workers start with spawn" in m for m in messages)
    # the config in force changed: a config_change event says which key, from what, to what, and why
    recs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (change,) = [r for r in recs if r.get("event") == "config_change"]
    assert change["source"] == "data" and "start with spawn" in change["reason"]
    assert change["changes"] == {"data.num_workers": {"from": 1, "to": 0}}


def test_map_style_losses_do_not_depend_on_workers(tmp_path):
    runs = []
    for workers in (0, 2):
        cfg = load_run_config(make_config(tmp_path, "pretrain", name=f"w{workers}.yaml",
                                          data={"num_workers": workers}, schedule={"max_steps": 4}))
        runs.append(run_training(cfg, tmp_path / f"w{workers}", quiet=True).losses)
    assert runs[0] == runs[1] and len(runs[0]) == 4


def test_workers_prefetch_and_packing_reach_the_trainer(tmp_path):
    cfg = load_run_config(make_config(tmp_path, "sft", data={"num_workers": 2, "prefetch_factor": 3,
                                                             "packing": True}, schedule={"max_steps": 2}))
    args = _args(cfg, tmp_path)
    assert (args["dataloader_num_workers"], args["dataloader_prefetch_factor"], args["packing"]) == (2, 3, True)
    probe = LoaderProbe()
    run_training(cfg, tmp_path / "run", quiet=True, extra_callbacks=[probe])
    (loader,) = probe.loaders
    assert (loader.num_workers, loader.prefetch_factor) == (2, 3)
    # TRL packed the conversations: rows of several examples, with their lengths kept apart
    packed = loader.dataset
    assert "seq_lengths" in packed.column_names
    assert max(len(row["seq_lengths"]) for row in packed) > 1
    assert all(len(row["input_ids"]) <= cfg.training.seq_len for row in packed)


def test_defaults_keep_the_old_trainer_arguments(tmp_path):
    args = _args(load_run_config(make_config(tmp_path, "sft")), tmp_path)
    assert args["dataloader_num_workers"] == 0 and args["packing"] is False
    assert "dataloader_prefetch_factor" not in args


def _arrow_files(root):
    return sorted(p.name for p in root.rglob("*.arrow")) if root.exists() else []


@pytest.mark.parametrize("method", ["pretrain", "sft"])
def test_keep_in_memory_writes_no_cache_file(tmp_path, method):
    cache = tmp_path / "cache"
    cfg = load_run_config(make_config(tmp_path, method, data={"cache_dir": str(cache), "keep_in_memory": True},
                                      schedule={"max_steps": 1}))
    run_training(cfg, tmp_path / "run", quiet=True)
    assert _arrow_files(cache) == []
    # the same run without keep_in_memory fills the cache directory (the check above can fail)
    cfg = load_run_config(make_config(tmp_path, method, name="cached.yaml", data={"cache_dir": str(cache)},
                                      schedule={"max_steps": 1}))
    run_training(cfg, tmp_path / "cached", quiet=True)
    assert _arrow_files(cache)


def test_cache_dir_receives_every_cache_file(tmp_path):
    """A save_to_disk dataset trained by SFT: the copy and TRL's tokenising maps land in cache_dir,
    and the user's dataset directory is left as it was."""
    import datasets

    from trainfit.config.run_config import resolve_data_path

    saved = tmp_path / "chat-saved"
    rows = datasets.load_dataset("json", data_files=[resolve_data_path("builtin:tiny-chat")], split="train",
                                 cache_dir=str(tmp_path / "hf"))
    rows.select(range(40)).save_to_disk(str(saved))
    before = tree_digest(saved)
    cache = tmp_path / "cache"
    cfg = load_run_config(make_config(tmp_path, "sft", data={"paths": [str(saved)], "format": "chat",
                                                             "cache_dir": str(cache)},
                                      schedule={"max_steps": 1}))
    run_training(cfg, tmp_path / "run", quiet=True)
    assert tree_digest(saved) == before
    files = _arrow_files(cache)
    assert any(f.startswith("trainfit-source-") for f in files)
    assert len(files) >= 3, files  # the copy and TRL's maps (chat template, tokenising, truncation)


def test_pretrain_maps_land_in_cache_dir(tmp_path):
    cache = tmp_path / "cache"
    cfg = load_run_config(make_config(tmp_path, "pretrain", data={"cache_dir": str(cache)},
                                      schedule={"max_steps": 1}))
    run_training(cfg, tmp_path / "run", quiet=True)
    maps = [f for f in _arrow_files(cache) if f.startswith("cache-")]
    assert len(maps) >= 2, _arrow_files(cache)  # tokenising and packing (beside the loaded file's cache)


def test_streamed_dpo_trains(tmp_path):
    cfg = load_run_config(make_config(tmp_path, "dpo", data={"streaming": True, "max_samples": 8},
                                      schedule={"max_steps": 3}, training={"micro_batch": 2, "seq_len": 32}))
    result = run_training(cfg, tmp_path / "run", quiet=True)
    assert result.global_step == 3 and len(result.losses) == 3


def _hash(tmp_path, method="sft", name="h.yaml", **data):
    return load_run_config(make_config(tmp_path, method, name=name, data=data)).config_hash()


def test_config_hash_counts_the_maths_not_the_speed(tmp_path):
    base = _hash(tmp_path)
    # speed only: a resumed run may change these
    assert _hash(tmp_path, num_workers=4, prefetch_factor=8) == base
    assert _hash(tmp_path, keep_in_memory=True) == base
    assert _hash(tmp_path, cache_dir=str(tmp_path / "c")) == base
    assert _hash(tmp_path, packing=False) == base  # the SFT default, written out
    # the batches change
    assert _hash(tmp_path, packing=True) != base
    assert _hash(tmp_path, streaming=True) != base
    assert _hash(tmp_path, "pretrain", packing=True) == _hash(tmp_path, "pretrain")
    assert _hash(tmp_path, "dpo", packing=False) == _hash(tmp_path, "dpo")  # dpo never packs: accepted


@pytest.mark.parametrize("method, data, extra, needle", [
    ("pretrain", {"prefetch_factor": 4}, {}, "data.prefetch_factor: only applies with DataLoader workers"),
    ("dpo", {"packing": True}, {}, "data.packing: method dpo cannot pack"),
    ("pretrain", {"packing": False}, {}, "data.packing: pretrain always packs"),
    ("sft", {"streaming": True}, {"schedule": {"max_steps": None, "epochs": 1}},
     "schedule.max_steps: data.streaming reads an IterableDataset, which has no length"),
    ("pretrain", {"streaming": True, "keep_in_memory": True}, {}, "data.keep_in_memory: a streamed dataset"),
    ("dpo", {"streaming": True}, {"training": {"dpo_reference": "precomputed"}},
     "data.streaming: training.dpo_reference 'precomputed'"),
    ("sft", {"num_workers": -1}, {}, "data.num_workers: must be an integer from 0 to 1,024, got -1"),
    ("sft", {"num_workers": 2, "prefetch_factor": 0}, {}, "data.prefetch_factor: must be an integer from 1"),
    ("sft", {"packing": "yes"}, {}, "data.packing"),
])
def test_refused_combinations_name_the_key(tmp_path, method, data, extra, needle):
    path = make_config(tmp_path, method, data=data, **extra)
    with pytest.raises(BadInputError) as info:
        load_run_config(path)
    assert needle in info.value.message


def test_refusal_is_exit_2_before_anything_runs(tmp_path, capsys):
    path = make_config(tmp_path, "dpo", data={"packing": True})
    code = main(["train", str(path), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "data.packing" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
