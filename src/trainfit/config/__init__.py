"""The file schemas a user writes and trainfit writes: the run config (run_config), the pipeline
meta-config (pipeline) and their refusals. Below export/ and train/, which both read them; above
core/. Nothing here probes the machine: the hardware a rule needs is an argument."""
