"""Training runner, checkpoints, verify (needs the `train` extra)."""
