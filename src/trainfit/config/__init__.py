"""The file schemas a user writes and trainfit writes: the run config (run_config), the pipeline
meta-config (pipeline), their refusals, and the multi-node shared-storage rule (shared_storage).
Below export/ and train/, which both read them; above core/. No hardware probe here: the machine
profile a rule needs (precision auto) is an argument the caller probed."""
