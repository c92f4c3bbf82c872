"""Machines: GPU, host, network and multi-node specs, their catalogs, and the hardware profile."""
