"""Shared test setup. Tests never touch the network or a model hub."""

import os
import tempfile

# No test may reach the model hub: loading code is tested on configs and random weights.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `trainfit plan` on this machine would spend seconds measuring real steps (trainfit.train.probe);
# the tests of the probe itself turn it back on.
os.environ.setdefault("TRAINFIT_NO_PROBE", "1")
# Caches (parsed catalogs, Hub metadata, disk measurements) go to a throwaway folder, not the
# user's ~/.cache/trainfit.
os.environ.setdefault("TRAINFIT_CACHE_DIR", tempfile.mkdtemp(prefix="trainfit-test-cache-"))
