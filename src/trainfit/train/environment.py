"""The process a run trains in: the libraries' warnings and loggers quietened, the launcher's
rank and world size, the process group torn down at the end, the device resolved."""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager

from trainfit.config.run_config import RunConfig
from trainfit.errors import UnavailableError


# The libraries whose warnings `train` and `verify` hide (their FutureWarning / DeprecationWarning /
# UserWarning noise is about their own internals or upcoming API changes, nothing a user of trainfit
# can act on). Warnings raised from trainfit's own modules are not matched.
LIBRARY_MODULES = (r"(transformers|torch|accelerate|peft|trl|datasets|tokenizers|huggingface_hub|safetensors|"
                   r"bitsandbytes|deepspeed)(\.|$)")
_LIBRARY_LOGGERS = ("accelerate", "peft", "trl", "datasets", "torch.distributed")


@contextmanager
def quiet_libraries():
    """While the block runs: library FutureWarning / DeprecationWarning / UserWarning filtered out
    (by the module that warns, so trainfit's own warnings still show), Transformers' logging and
    the other libraries' loggers at ERROR. Leaves alone what the user asked for explicitly
    (python -W / PYTHONWARNINGS, TRANSFORMERS_VERBOSITY)."""
    import logging

    with warnings.catch_warnings():
        if not _user_set_warnings():
            for category in (FutureWarning, DeprecationWarning, UserWarning):
                warnings.filterwarnings("ignore", category=category, module=LIBRARY_MODULES)
        restore = []
        if "TRANSFORMERS_VERBOSITY" not in os.environ:
            hf_logging = sys.modules.get("transformers.utils.logging")
            if hf_logging is not None:
                before = hf_logging.get_verbosity()
                hf_logging.set_verbosity_error()
                restore.append(lambda: hf_logging.set_verbosity(before))
            else:  # not imported yet (importing it costs a second): it reads this when it is
                os.environ["TRANSFORMERS_VERBOSITY"] = "error"
                restore.append(_unset_transformers_verbosity)
            for name in _LIBRARY_LOGGERS:
                logger = logging.getLogger(name)
                level = logger.level
                logger.setLevel(max(level, logging.ERROR))
                restore.append(lambda logger=logger, level=level: logger.setLevel(level))
        try:
            yield
        finally:
            for undo in reversed(restore):
                undo()


def _unset_transformers_verbosity() -> None:
    os.environ.pop("TRANSFORMERS_VERBOSITY", None)
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:  # imported inside the block, at ERROR: back to its default
        hf_logging.set_verbosity_warning()


def _user_set_warnings() -> bool:
    return bool(sys.warnoptions)  # -W options and PYTHONWARNINGS both land here


def world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment (torchrun / accelerate / deepspeed)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def end_distributed() -> None:
    """At the end of a successful run under a launcher: wait for every rank, then tear the process
    group down. Left to the interpreter's exit, gloo's and NCCL's threads can be destroyed while
    still joinable, and a rank that finished its work aborts ("terminate called without an active
    exception") and fails the launch."""
    dist = sys.modules.get("torch.distributed")  # never imported: never initialised
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()


def resolve_device(cfg: RunConfig) -> str:
    import torch

    want = cfg.training.device
    if want == "auto":
        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise UnavailableError("training.device: cuda asked, but torch sees no CUDA device",
                               hint="use device: auto or cpu")
    mps = getattr(torch.backends, "mps", None)
    if want == "mps" and not (mps is not None and mps.is_available()):  # torch would quietly train on the CPU
        raise UnavailableError("training.device: mps asked, but torch sees no Apple GPU (MPS needs macOS on Apple "
                               "silicon)", hint="use device: auto or cpu")
    return want
