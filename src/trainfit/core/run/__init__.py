"""A run's figures beyond memory and speed: power and energy, run prediction (time, energy, cost), the
checkpoint cadence, the safety thresholds of each mode, and the cluster launch environment."""
