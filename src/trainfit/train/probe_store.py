"""What a plan's probe learned, kept with this machine's calibration (train/calibration.py): the
measured step times as `probe_steps` (a later plan of the same model and settings reuses them,
when recent and not taken on a busy machine), the decisions as `probe_decisions`, and the
balanced pick's measured / predicted ratio as a calibration sample."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainfit.core.setup import TrainingSetup

STORED_MAX_AGE_SECONDS = 30 * 24 * 3600
MAX_STORED_STEPS = 200


def store_measurements(req, result, fingerprint: str, key: str, path: Path | None, decisions: list) -> str:
    """This probe's measurements (each setting's median and spread) as `probe_steps`, its decisions
    as `probe_decisions`, and the balanced (else first) pick's measured / predicted ratio as a
    calibration sample (a busy machine's flagged and never applied: calibration.py)."""
    from trainfit.core.speed import predict_step
    from trainfit.train import calibration as cal

    load = cal.check_load()
    mine = [m for m in req.measured_steps if m.source == "probe"]
    where = record_probe_steps(fingerprint, key, mine, load, path, decisions=decisions)
    measured = {(m.model_id, m.setup): m for m in req.measured_steps}
    picks = sorted((mp for mp in result.modes if mp.fits and mp.setup is not None),
                   key=lambda mp: mp.mode != "balanced")
    for mp in picks:
        m = measured.get((mp.model_id, mp.setup))
        if m is None or m.lower_bound:
            continue
        predicted = predict_step(mp.model, mp.setup, req.hardware).step_seconds
        cal.record_verify_sample(fingerprint, key, {
            "model": mp.model_id, "method": mp.setup.method, "memory_ratio": None,
            "step_time_ratio": m.step_seconds / predicted, "micro_batch": mp.setup.micro_batch,
            "seq_len": mp.setup.seq_len, "source": "plan probe"}, path, load=load)
        break
    return str(where) + (f" (busy machine: {load.reason})" if load.contended else "")


def record_probe_steps(fingerprint: str, key: str, steps: list, load, path: Path | None = None,
                       decisions: list = ()) -> Path:
    from trainfit.core.serde import to_jsonable
    from trainfit.files import write_atomic
    from trainfit.train import calibration as cal

    path = path or cal.calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = cal.read_calibration(path)
    rec = data["machines"].setdefault(fingerprint, {}).setdefault(key, {"samples": []})
    now = time.time()
    entries = [{"time": now, "model": m.model_id, "setup": to_jsonable(m.setup), "step_seconds": m.step_seconds,
                "predicted_step_seconds": m.predicted_step_seconds, "lower_bound": m.lower_bound,
                "spread": m.spread, "samples_seconds": list(m.samples or (m.step_seconds,)),
                "load_average_1m": load.load_average_1m, "cores": load.cores, "contended": load.contended}
               for m in steps]
    rec["probe_steps"] = (rec.get("probe_steps", []) + entries)[-MAX_STORED_STEPS:]
    if decisions:  # why each pick is what it is, with the evidence (read by people, not by the planner)
        rec["probe_decisions"] = (rec.get("probe_decisions", []) + [
            {"time": now, "mode": d.mode, "action": d.action, "text": d.text, "faster_by": d.faster_by,
             "spread": d.spread, "repeats": d.repeats, "contended": load.contended} for d in decisions]
        )[-MAX_STORED_STEPS:]
    return write_atomic(path, json.dumps(data, indent=2) + "\n")


def load_probe_steps(fingerprint: str, key: str, path: Path | None = None) -> list:
    """An earlier plan's probe measurements on this machine (recent, taken while it was not busy)."""
    from trainfit.core.plan.measured import MeasuredStep
    from trainfit.core.serde import from_jsonable
    from trainfit.train import calibration as cal

    rec = cal.read_calibration(path or cal.calibration_path())["machines"].get(fingerprint, {}).get(key, {})
    out: dict[tuple, Any] = {}
    for e in rec.get("probe_steps", []) if isinstance(rec, dict) else []:
        try:
            if e.get("contended") or time.time() - e["time"] > STORED_MAX_AGE_SECONDS:
                continue
            setup = from_jsonable(TrainingSetup, e["setup"])
            samples = tuple(float(x) for x in e.get("samples_seconds", ()))
            out[(e["model"], setup)] = MeasuredStep(e["model"], setup, float(e["step_seconds"]),
                                                     float(e["predicted_step_seconds"]), bool(e["lower_bound"]),
                                                     source="stored", spread=float(e.get("spread", 0.0)),
                                                     samples=samples)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # an entry from another version: ignored, never fatal
    return list(out.values())
