"""`plan --launcher slurm|skypilot|kubernetes`: each spec is accepted by its engine's own parser.

* Slurm: `bash -n`, and every #SBATCH line parsed as sbatch parses it (only the comment block
  before the first command counts) against the long options sbatch documents
  (data/sbatch_options.txt, from the man page; bench/_sbatch_options_from_man.py).
* SkyPilot: `sky.Task.from_yaml` (its schema check rejects unknown keys and bad values); skipped
  where skypilot is not installed (it takes ~1.5 min to install, so it is not a test dependency:
  `make test-launchers` runs these tests in a venv that has it; bench/results/launcher_parsers.txt).
* Kubernetes: the PyTorchJob against the OpenAPI v3 schema of Kubeflow training-operator v1.9.0's
  CRD (data/pytorchjob_v1_openapi_schema.json.gz, descriptions stripped), made strict as
  `kubectl apply --validate=strict` is (an unknown field is an error), with jsonschema; the
  ConfigMap, the PersistentVolumeClaim and the pod templates through the Kubernetes client's model
  classes, round-tripped (a key the model does not know would be lost). Skipped without
  jsonschema / kubernetes, as above.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from trainfit.cli.main import main

DATA = Path(__file__).parent / "data"
DONE_WHEN = ["plan", "shape:125m", "--method", "pretrain", "--dataset-tokens", "2e9", "--hardware",
             "2 nodes x 8x h100-sxm", "--launcher", "slurm", "--launcher", "skypilot", "--launcher", "kubernetes",
             "--mode", "balanced", "--no-probe"]
SPOT = ["plan", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--examples", "2000", "--flavor", "a3-highgpu-1g", "--spot",
        "--launcher", "skypilot", "--launcher", "slurm", "--launcher", "kubernetes", "--mode", "balanced", "--no-probe"]
SPEC_FILES = ("slurm.sbatch", "skypilot.yaml", "skypilot-job.yaml", "pytorchjob.yaml")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "out"
    assert main([*DONE_WHEN, "--out", str(out)]) == 0
    return out / "balanced"


@pytest.fixture(scope="module")
def spot_plan(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("spot") / "out"
    assert main([*SPOT, "--out", str(out)]) == 0
    return out / "balanced"


def test_plan_writes_every_spec_with_the_plan_in_its_header(two_nodes):
    for name in SPEC_FILES:
        text = (two_nodes / name).read_text()
        assert "trainfit 0.1.0 plan, mode balanced: shape:125m (pretrain) on 16 x cuda" in text, name
        assert "reproduce: trainfit plan shape:125m" in text and "--launcher kubernetes" in text, name
        assert "cluster: MASTER_ADDR MASTER_PORT=29500 NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_DISABLE=0 " \
               "NCCL_IB_HCA=mlx5" in text, name
    launch = (two_nodes / "launch.sh").read_text()
    assert 'export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5}"' in launch
    assert '--out "$TRAINFIT_CHECKPOINT_DIR"/runs/balanced' in launch


# ---------------------------------------------------------------------------------------------- Slurm
def documented_sbatch_options() -> dict[str, str]:
    out = {}
    for line in (DATA / "sbatch_options.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            out[name] = value
    return out


VALUE_FORMATS = {  # the forms the sbatch man page gives for the options trainfit writes
    "nodes": r"[1-9][0-9]*", "ntasks-per-node": r"[1-9][0-9]*", "gpus-per-node": r"([a-z0-9_-]+:)?[1-9][0-9]*",
    "cpus-per-task": r"[1-9][0-9]*", "mem": r"[0-9]+[KMGT]?", "time": r"([0-9]+-)?[0-9]+:[0-5][0-9]:[0-5][0-9]",
    "signal": r"([RB]:)?[A-Z0-9]+(@[0-9]+)?", "open-mode": r"append|truncate", "job-name": r"[A-Za-z0-9._-]+",
    "output": r"\S+",
}


def sbatch_problems(text: str, documented: dict[str, str]) -> tuple[dict[str, str | None], list[str]]:
    """The #SBATCH options as sbatch reads them (up to the first command) and every problem."""
    options: dict[str, str | None] = {}
    problems = []
    seen_command = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            seen_command = True
            continue
        if seen_command:
            problems.append(f"line {number}: #SBATCH after the first command is ignored by sbatch")
        m = re.fullmatch(r"#SBATCH\s+--([a-z0-9-]+)(?:=(\S+))?", stripped)
        if m is None:
            problems.append(f"line {number}: not '--option[=value]': {stripped}")
            continue
        name, value = m.group(1), m.group(2)
        kind = documented.get(name)
        if kind is None:
            problems.append(f"line {number}: --{name} is not a documented sbatch option")
        elif kind == "required" and value is None:
            problems.append(f"line {number}: --{name} needs a value")
        elif kind == "none" and value is not None:
            problems.append(f"line {number}: --{name} takes no value")
        if value is not None and name in VALUE_FORMATS and not re.fullmatch(VALUE_FORMATS[name], value):
            problems.append(f"line {number}: --{name}={value} is not of the documented form")
        options[name] = value
    return options, problems


def test_sbatch_script_is_valid_bash_with_documented_options(two_nodes):
    path = two_nodes / "slurm.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    options, problems = sbatch_problems(path.read_text(), documented_sbatch_options())
    assert problems == []
    assert options["nodes"] == "2" and options["gpus-per-node"] == "8" and options["ntasks-per-node"] == "1"
    assert "requeue" in options and options["signal"] == "B:USR1@300"
    # 2e9 tokens: the plan's predicted hours x 1.2 + 15 min, whole minutes
    assert re.fullmatch(r"0-00:[0-9]{2}:00", options["time"]) and options["mem"].endswith("G")
    text = path.read_text()
    assert 'HOSTS="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"' in text
    assert 'MASTER_ADDR="${HOSTS%%$\'\\n\'*}"' in text
    assert 'NODE_RANK="$SLURM_NODEID" exec ./launch.sh --resume --out "$TRAINFIT_CHECKPOINT_DIR/runs/balanced"' in text


def test_the_sbatch_parser_catches_what_sbatch_would_refuse():
    documented = documented_sbatch_options()
    bad = "#!/bin/bash\n#SBATCH --nodez=2\n#SBATCH --time\n#SBATCH --no-requeue=now\n#SBATCH --mem=lots\necho x\n#SBATCH --nodes=2\n"
    _, problems = sbatch_problems(bad, documented)
    assert len(problems) == 5, problems


# ---------------------------------------------------------------------------------------------- SkyPilot
def test_skypilot_task_and_managed_job_load_in_skypilot(two_nodes, spot_plan):
    sky = pytest.importorskip("sky", reason="skypilot is not a test dependency (~1.5 min to install): "
                                            "make test-launchers runs this")
    for folder, spot in ((two_nodes, False), (spot_plan, True)):
        for name, managed in (("skypilot.yaml", False), ("skypilot-job.yaml", True)):
            task = sky.Task.from_yaml(str(folder / name))
            (res,) = list(task.resources)
            assert res.use_spot is spot
            assert (res.job_recovery is not None) is managed
            assert task.storage_mounts["/checkpoints"].mode.value == "MOUNT_CACHED"
            assert task.envs["TRAINFIT_CHECKPOINT_DIR"] == "/checkpoints"
            if folder is two_nodes:
                assert task.num_nodes == 2 and res.accelerators == {"H100": 8}
            else:
                assert task.num_nodes == 1 and res.accelerators == {"H100": 1} and str(res.cloud) == "GCP"
    task = yaml.safe_load((two_nodes / "skypilot.yaml").read_text())
    task["resources"]["acceleratorz"] = task["resources"].pop("accelerators")
    with pytest.raises(Exception, match="acceleratorz"):
        sky.Task.from_yaml_config(task)


# ---------------------------------------------------------------------------------------------- Kubernetes
def strict(schema):
    """The CRD schema as `kubectl --validate=strict` applies it: unknown fields are errors."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def pytorchjob_schema() -> dict:
    return strict(json.loads(gzip.decompress((DATA / "pytorchjob_v1_openapi_schema.json.gz").read_bytes())))


def _documents(folder: Path) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all((folder / "pytorchjob.yaml").read_text())}


def test_pytorchjob_is_valid_against_the_crd_schema(two_nodes, spot_plan):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the test extra (pyproject [test])")
    validator = jsonschema.Draft7Validator(pytorchjob_schema())
    for folder in (two_nodes, spot_plan):
        job = _documents(folder)["PyTorchJob"]
        assert [e.message for e in validator.iter_errors(job)] == []
    job = _documents(two_nodes)["PyTorchJob"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
    assert specs["Master"]["restartPolicy"] == "OnFailure"
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert 'NODE_RANK="${PET_NODE_RANK:-$RANK}"' in container["command"][-1]
    broken = copy.deepcopy(job)
    broken["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    broken["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert len(list(validator.iter_errors(broken))) == 2


def test_configmap_claim_and_pod_templates_round_trip_through_the_kubernetes_models(two_nodes):
    kubernetes = pytest.importorskip("kubernetes", reason="kubernetes comes with the test extra (pyproject [test])")
    client = kubernetes.client.ApiClient()
    docs = _documents(two_nodes)
    pieces = [(docs["ConfigMap"], "V1ConfigMap"), (docs["PersistentVolumeClaim"], "V1PersistentVolumeClaim")]
    for spec in docs["PyTorchJob"]["spec"]["pytorchReplicaSpecs"].values():
        pieces.append((spec["template"], "V1PodTemplateSpec"))
    for doc, model in pieces:
        obj = client._ApiClient__deserialize(doc, model)  # the client's own loader (models validate values)
        assert client.sanitize_for_serialization(obj) == doc, model
    files = docs["ConfigMap"]["data"]
    assert {"run.yaml", "launch.sh", "accelerate.yaml"} <= set(files)
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv,message", [
    (["--launcher", "nomad"], "--launcher: 'nomad' is not one of slurm, skypilot, kubernetes"),
    (["--launcher", "slurm", "--no-out"], "--launcher: writes a job spec next to launch.sh; give --out DIR too"),
], ids=["unknown-engine", "without-out"])
def test_bad_launcher_is_refused_before_planning(tmp_path, capsys, argv, message):
    args = ["plan", "shape:125m", "--method", "pretrain", "--hardware", "2 nodes x 8x h100-sxm", "--no-probe"]
    extra = [a for a in argv if a != "--no-out"]
    if "--no-out" not in argv:
        extra += ["--out", str(tmp_path / "o")]
    assert main([*args, *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------- network
def test_plan_names_the_cluster_variables_for_the_network_in_json_and_launch_sh(tmp_path, capsys):
    args = ["plan", "shape:125m", "--method", "pretrain", "--hardware", "2 nodes x 8x h100-sxm over efa-p5",
            "--mode", "balanced", "--no-probe", "--json"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    doc = json.loads(capsys.readouterr().out)
    env = {v["name"]: v["value"] for v in doc["cluster"]["env"]}
    assert doc["cluster"]["network"] == "efa-p5"
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1" and env["NCCL_IB_DISABLE"] == "1"
    assert env["MASTER_PORT"] == "29500" and env["MASTER_ADDR"] is None and "GLOO_SOCKET_IFNAME" in env
    assert "shared" in doc["cluster"]["checkpoint_dir"] or "every node" in doc["cluster"]["checkpoint_dir"]
    launch = (tmp_path / "o" / "balanced" / "launch.sh").read_text()
    assert 'export FI_PROVIDER="${FI_PROVIDER:-efa}"' in launch and "NCCL_IB_HCA" not in launch
    assert main(["plan", "shape:125m", "--method", "pretrain", "--hardware", "8x h100-sxm", "--mode", "balanced",
                 "--no-probe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"] is None


def test_launch_sh_sets_the_interfaces_from_the_default_route_unless_given(two_nodes, tmp_path):
    """The preamble alone (up to the launcher command), run with fake `ip` output."""
    launch = (two_nodes / "launch.sh").read_text()
    preamble = launch[:launch.index("accelerate launch")] + 'echo "$NCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME"\n'
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ip").write_text("#!/bin/sh\necho 'default via 10.0.0.1 dev ens5 proto dhcp'\n")
    (fake / "ip").chmod(0o755)
    (tmp_path / "pre.sh").write_text(preamble)
    base = {"PATH": f"{fake}:/usr/bin:/bin", "MASTER_ADDR": "10.0.0.2", "NODE_RANK": "1",
            "TRAINFIT_CHECKPOINT_DIR": "/shared/x"}
    run = subprocess.run(["bash", str(tmp_path / "pre.sh")], env=base, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ens5 ens5", run.stderr
    run = subprocess.run(["bash", str(tmp_path / "pre.sh")], env={**base, "GLOO_SOCKET_IFNAME": "ib0"},
                         capture_output=True, text=True)
    assert run.stdout.strip() == "ens5 ib0"
