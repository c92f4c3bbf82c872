"""The Plan as the JSON document `plan --json` prints (and `analyze`, and each phase of a pipeline)."""

from __future__ import annotations


def cluster_document(hw) -> dict | None:
    """A multi-node plan's rendezvous, interface and fabric variables (core.run.cluster_env) and the
    shared-storage rule for its checkpoints; None on one node."""
    if hw.node_count <= 1:
        return None
    from dataclasses import asdict

    from trainfit.core.run.cluster_env import cluster_env
    from trainfit.core.machines.network_catalog import get_network

    network = get_network(hw.nodes.network) if hw.nodes.network else None
    return {"network": network.id if network else None, "env": [asdict(v) for v in cluster_env(network)],
            "checkpoint_dir": "TRAINFIT_CHECKPOINT_DIR: the run directory (checkpoints) must be on storage every "
                              "node mounts; trainfit train refuses a node-local one (relative, /tmp, /local, "
                              "/scratch-local, ..., or a local filesystem type)"}


def plan_document(result, files: dict[str, list[str]] | None = None) -> dict:
    """The Plan JSON (DESIGN: per mode the setup, its estimate, reasons, warnings, files)."""
    from trainfit.cli.output import device_memory_json
    from trainfit.core.serde import to_jsonable

    modes = []
    for mp in result.modes:
        d = to_jsonable(mp)
        d.pop("model", None)
        if mp.memory is not None:
            d["memory"] = {"devices": [device_memory_json(dev) for dev in mp.memory.devices], "params_total": mp.memory.params_total,
                           "params_trainable": mp.memory.params_trainable}
        d["files"] = (files or {}).get(mp.mode, [])
        modes.append(d)
    return {"method": result.method, "hardware": result.hardware, "device": result.device, "modes": modes,
            "notes": result.notes, "host_ram_usable_bytes": result.host_ram_usable_bytes, "rates": result.rates,
            "units": {"*_bytes": "bytes", "*_seconds": "seconds", "*_watts": "watts", "hours": "hours"}}
