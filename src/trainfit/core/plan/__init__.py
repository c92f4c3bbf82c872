"""The planner: one search engine over TrainingSetups and the policies built on it.

- hardware_rules: what a device can run (precisions, kernels, optimizers, quantisation, sharding).
- intent: an intent + hardware -> the TrainingSetup that runs (defaults filled in one place).
"""
