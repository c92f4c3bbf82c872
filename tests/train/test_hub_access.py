"""`trainfit train` with weights from the Hub reads the environment as the rest of trainfit does
(trainfit.hub.models): TRANSFORMERS_OFFLINE is honoured like HF_HUB_OFFLINE, and an HF_ENDPOINT
that is no http(s) URL is exit 2 naming it. Nothing here reaches the network."""

from __future__ import annotations

import pytest

from trainfit.cli.main import main
from trainfit.errors import BadInputError
from trainfit.train import hub_access

from .conftest import make_config


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                 "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port: never the real Hub
    hub_access._unreachable.cache_clear()
    yield monkeypatch
    hub_access._unreachable.cache_clear()


@pytest.mark.parametrize("env, expected", [
    ({"TRANSFORMERS_OFFLINE": "1"}, "TRANSFORMERS_OFFLINE is set"),
    ({"HF_HUB_OFFLINE": "true"}, "HF_HUB_OFFLINE is set"),
    ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, "127.0.0.1:9 cannot be reached"),  # as huggingface_hub
    ({}, "127.0.0.1:9 cannot be reached"),
])
def test_offline_reason_reads_the_environment_as_huggingface_hub(hub_env, env, expected):
    for name, value in env.items():
        hub_env.setenv(name, value)
    assert expected in hub_access.offline_reason()


def test_a_bad_endpoint_is_bad_input(hub_env):
    hub_env.setenv("HF_ENDPOINT", "huggingface.co")  # no scheme: no host either
    with pytest.raises(BadInputError, match="HF_ENDPOINT"):
        hub_access.offline_reason()


@pytest.mark.parametrize("env, code, expected", [
    ({"TRANSFORMERS_OFFLINE": "1"}, 4, "TRANSFORMERS_OFFLINE is set"),
    ({"HF_ENDPOINT": "ftp://mirror.example"}, 2, "environment variable HF_ENDPOINT"),
])
def test_train_from_the_hub_honours_the_environment(hub_env, tmp_path, capsys, env, code, expected):
    for name, value in env.items():
        hub_env.setenv(name, value)
    cfg = make_config(tmp_path, "sft", model={"id": "Qwen/Qwen2-0.5B", "shape": None, "weights": "hub"})
    assert main(["train", str(cfg), "--out", str(tmp_path / "run")]) == code
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
