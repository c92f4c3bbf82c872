"""A multi-node run's run directory must be shared storage (trainfit.config.shared_storage): the
rule on paths and mount tables, and `trainfit train` refusing a node-local one with exit 2."""

from __future__ import annotations

import pytest
import yaml

from trainfit.cli.main import main
from trainfit.config.shared_storage import mount_of, node_local_reason

from .conftest import make_config

MOUNTS = """\
/dev/nvme0n1p1 / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw 0 0
fs-1.efs.us-east-1.amazonaws.com:/ /shared nfs4 rw,vers=4.1 0 0
10.0.0.5@tcp:/lustre /lustre lustre rw 0 0
gcsfuse-bucket /checkpoints fuse.gcsfuse rw 0 0
/dev/nvme1n1 /data xfs rw 0 0
overlay /workspace overlay rw 0 0
"""


@pytest.mark.parametrize("path,expected", [
    ("runs/x", "a relative path"),
    ("/tmp/runs/x", "/tmp is node-local"),
    ("/dev/shm/run", "/dev/shm is node-local"),
    ("/scratch-local/me/run", "/scratch-local is node-local"),
    ("/mnt/nvme0/run", "/mnt/nvme... is node-local"),
    ("/mnt/resource/run", "/mnt/resource is node-local"),
    ("/home/me/run", "on /, a ext4 filesystem"),
    ("/data/run", "on /data, a xfs filesystem"),
    ("/workspace/run", "on /workspace, a overlay filesystem"),
    ("/shared/runs/x", None),
    ("/lustre/proj/run", None),
    ("/checkpoints/runs/x", None),
])
def test_node_local_rule(path, expected):
    reason = node_local_reason(path, MOUNTS)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason, reason


def test_the_longest_mount_point_holds_the_path():
    assert mount_of("/shared/a/b", MOUNTS) == ("/shared", "nfs4")
    assert mount_of("/sharedx/a", MOUNTS) == ("/", "ext4")


def _two_node_config(tmp_path, **checkpointing):
    path = make_config(tmp_path, "pretrain", training={"num_nodes": 2, "device": "cpu"},
                       checkpointing={"every_steps": 4, **checkpointing})
    return path


def test_train_refuses_a_node_local_run_directory_for_several_nodes(tmp_path, capsys):
    config = _two_node_config(tmp_path)
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: training.num_nodes 2 needs the run directory (its checkpoints) on storage every node " \
           "mounts, and /tmp is node-local storage by convention" in err
    assert "checkpointing.allow_node_local: true" in err and "Traceback" not in err
    assert not out.exists()


def test_allow_node_local_is_a_run_config_key_that_does_not_change_the_hash(tmp_path):
    from trainfit.config.run_config import load_run_config, shared_storage_errors

    plain = load_run_config(_two_node_config(tmp_path))
    allowed_path = tmp_path / "allowed.yaml"
    raw = yaml.safe_load(_two_node_config(tmp_path).read_text())
    raw["checkpointing"]["allow_node_local"] = True
    allowed_path.write_text(yaml.safe_dump(raw))
    allowed = load_run_config(allowed_path)
    assert shared_storage_errors(allowed, str(tmp_path / "run")) == []
    assert shared_storage_errors(plain, str(tmp_path / "run")) != []
    assert plain.config_hash() == allowed.config_hash()
