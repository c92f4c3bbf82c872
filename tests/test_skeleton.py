import json
import subprocess
import sys

from trainfit.core.machines.profile import SCHEMA_VERSION, HardwareProfile
from trainfit.core.serde import SerdeError, from_jsonable, to_jsonable
from trainfit.core.setup import LoraSettings, TrainingSetup


def test_setup_round_trips_through_json():
    setup = TrainingSetup(method="lora", lora=LoraSettings(rank=8), micro_batch=4)
    data = json.loads(json.dumps(to_jsonable(setup)))
    assert from_jsonable(TrainingSetup, data) == setup


def test_serde_names_the_bad_key():
    try:
        from_jsonable(TrainingSetup, {"method": "lora", "micro_batch": "four"})
    except SerdeError as exc:
        assert "micro_batch" in str(exc)
    else:
        raise AssertionError("a string batch size must be rejected")
    try:
        from_jsonable(TrainingSetup, {"method": "bogus"})
    except SerdeError as exc:
        assert "'lora'" in str(exc)
    else:
        raise AssertionError("an unknown method must be rejected")


def test_profile_rejects_other_schema_versions():
    try:
        HardwareProfile.from_dict({"schema_version": SCHEMA_VERSION + 1})
    except ValueError as exc:
        assert "schema_version" in str(exc)
    else:
        raise AssertionError


def test_help_and_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "trainfit", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "COMMAND" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "trainfit", "no-such-command"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
