"""Probes: one adapter per source, each time-bounded, each returning values or reasons."""
