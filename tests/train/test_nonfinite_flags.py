"""The optimizer step's two non-finite flags (a micro-batch's loss, the gradient norm) come back to the
host in one transfer: one device sync per optimizer step, whatever the trainer returns for the norm."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trainfit.train.trainer_ext import with_trainfit


class _Base:  # stands in for Trainer: only the attributes the flags use
    pass


@pytest.fixture
def trainer(tmp_path: Path):
    return with_trainfit(_Base, ckpt_dir=tmp_path, keep_last=1, log=lambda message: None)()


@pytest.fixture
def reads(monkeypatch):
    """Counts every device->host read of a tensor (item, tolist, bool)."""
    count = {"n": 0}
    for name in ("item", "tolist", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            count["n"] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return count


@pytest.mark.parametrize("loss, norm, expected", [
    (torch.tensor(False), torch.tensor(1.5), (False, False)),
    (torch.tensor(True), torch.tensor(1.5), (True, False)),
    (torch.tensor(False), torch.tensor(math.nan), (False, True)),
    (torch.tensor(True), torch.tensor(math.inf), (True, True)),
    (torch.tensor(False), math.nan, (False, True)),  # a host float (DeepSpeed)
    (None, torch.tensor(math.inf), (False, True)),
    (torch.tensor(True), None, (True, False)),
])
def test_both_flags_in_one_read_and_reset(trainer, reads, loss, norm, expected):
    trainer._tf_nonfinite, trainer._tf_grad_norm = loss, norm
    assert trainer._tf_take_nonfinite() == expected
    assert reads["n"] == 1
    assert trainer._tf_nonfinite is None and trainer._tf_grad_norm is None
    assert trainer._tf_take_nonfinite() == (False, False)  # reset: the next step starts clean
    assert reads["n"] == 1  # nothing to read
