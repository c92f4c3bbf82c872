"""Hub models (trainfit.hub.models) against a fake Hugging Face Hub served on 127.0.0.1.

The fake (bench/_fake_hub.py) answers the routes the Hub client calls
(`/api/models/{repo}/revision/{rev}` and `/{repo}/resolve/{rev}/{file}` with HEAD, GET and Range),
so the real client runs unmocked, against honest and hostile answers.
Every test points HF_ENDPOINT at a local address and the caches at tmp_path: nothing reaches
the internet or the user's caches.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from _fake_hub import (CONFIG, EXTRA, GRANTED, REPO, drip, drip_headers, encoded, endless_chunked, gzip_bomb,
                       ignores_range, mistral_tensors, n_params, nested, raw_safetensors, redirect_loop,
                       safetensors_bytes, safetensors_header, serve, sharded_repo, single_file_repo, sized,
                       slow_ranges, unused_port)

from trainfit.cli.main import main
from trainfit.core.models.params import count_params
from trainfit.errors import BadInputError, UnavailableError
from trainfit.hub import models as hub_models
from trainfit.hub import resolve_model

_unused_port = unused_port


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Caches in tmp_path, online mode, and an endpoint on 127.0.0.1 where nothing listens: no test
    can reach the internet, even one that forgets the fake hub."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_unused_port()}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path / "trainfit-cache"))
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # tests/conftest.py turns it on for the rest of the suite
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_DOWNLOAD_TIMEOUT", raising=False)
    # huggingface_hub reads HF_HUB_OFFLINE once, at import (under conftest's "1" here).
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub(monkeypatch):
    with serve() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        yield fake


def _estimate(capsys, ref: str, *extra: str) -> tuple[int, str, str]:
    rc = main(["estimate", ref, "--hardware", "cpu", "--json", *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


# -- works ---------------------------------------------------------------------------------------


def test_estimate_of_a_non_catalog_hub_model_end_to_end(hub, capsys):
    hub.add(REPO, single_file_repo())
    rc, out, err = _estimate(capsys, REPO)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["model_id"] == REPO
    assert doc["params_total"] == n_params(mistral_tensors())  # exact, from the header
    # Only headers were read: every request for the weights file asked for a byte range.
    weights = [r for r in hub.requests() if r[1].endswith("model.safetensors")]
    assert weights and all(method == "GET" and rng and rng.startswith("bytes=0-") for method, _, rng in weights)


def test_spec_exact_params_dtype_and_source(hub):
    sha = hub.add(REPO, single_file_repo())
    spec = resolve_model(REPO)
    computed = count_params(spec).total
    assert computed == n_params(mistral_tensors()) - n_params(EXTRA)  # the fake checkpoint is a real layout
    assert spec.exact_params == computed + n_params(EXTRA)
    assert spec.stored_dtype == "bfloat16"  # from the headers, not the config's float32
    assert spec.id == REPO and spec.architecture == "mistral" and spec.num_kv_heads == 2
    assert "Hugging Face Hub" in spec.source and "revision main" in spec.source and sha in spec.source
    assert spec.source.startswith(f"{hub.endpoint}/{REPO}/")


def test_sharded_index(hub):
    hub.add(REPO, sharded_repo())
    spec = resolve_model(REPO)
    assert spec.exact_params == n_params(mistral_tensors()) and spec.stored_dtype == "bfloat16"
    ranged = {path.rsplit("/", 1)[-1] for method, path, rng in hub.requests() if rng}
    assert ranged == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}


@pytest.mark.parametrize("files,expected", [
    (single_file_repo(), n_params(mistral_tensors())),
    (sharded_repo(), n_params(mistral_tensors())),
    ({"config.json": json.dumps(CONFIG).encode()}, None),
], ids=["single", "sharded", "config-only"])
def test_an_endpoint_that_lists_no_files(hub, files, expected):
    hub.add(REPO, files, lists_files=False)
    assert resolve_model(REPO).exact_params == expected


def test_header_longer_than_the_first_range_is_fetched_whole(hub):
    files = single_file_repo()
    files["model.safetensors"] = safetensors_bytes(mistral_tensors(), metadata={"pad": "x" * 150_000})
    hub.add(REPO, files)
    assert resolve_model(REPO).exact_params == n_params(mistral_tensors())
    assert len([r for r in hub.requests() if r[2]]) == 2  # the first 100 kB, then the rest of the header


def test_second_call_is_served_from_the_cache(hub, tmp_path):
    hub.add(REPO, sharded_repo())
    first = resolve_model(REPO)
    before = len(hub.requests())
    assert before > 0
    assert resolve_model(REPO) == first
    assert len(hub.requests()) == before  # no new request
    cached = list((tmp_path / "trainfit-cache").rglob("*.json"))
    assert len(cached) == 1 and cached[0].stat().st_size < 50_000


def test_offline_with_the_model_cached_works(hub, capsys, monkeypatch):
    hub.add(REPO, single_file_repo())
    assert _estimate(capsys, REPO)[0] == 0
    before = len(hub.requests())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, out, err = _estimate(capsys, REPO)
    assert rc == 0, err
    assert json.loads(out)["params_total"] == n_params(mistral_tensors())
    assert len(hub.requests()) == before


def test_a_revision_is_fetched_and_cached_on_its_own(hub):
    sha = hub.add(REPO, single_file_repo())
    spec = resolve_model(f"{REPO}@v1")
    assert spec.id == REPO and "revision v1" in spec.source and sha in spec.source
    assert any(path == f"/api/models/{REPO}/revision/v1" for _, path, _ in hub.requests())
    assert "revision main" in resolve_model(REPO).source
    with pytest.raises(BadInputError, match="revision 'nope' not found"):
        resolve_model(f"{REPO}@nope")


def test_a_catalog_id_needs_no_request(hub):
    assert resolve_model("Qwen/Qwen2.5-7B").family
    assert hub.requests() == []


def test_quantized_checkpoint_keeps_the_computed_count(hub):
    cfg = {**CONFIG, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    hub.add(REPO, single_file_repo(cfg))
    spec = resolve_model(REPO)
    assert spec.exact_params is None and spec.stored_dtype == "int4"


def test_cli_in_a_fresh_process_and_huggingface_hub_not_imported_on_a_cache_hit(hub, tmp_path):
    hub.add(REPO, single_file_repo())
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0"}
    r = subprocess.run([sys.executable, "-m", "trainfit", "estimate", REPO, "--hardware", "cpu", "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["params_total"] == n_params(mistral_tensors())
    code = (f"import sys; from trainfit.hub import resolve_model; resolve_model({REPO!r}); "
            "print('huggingface_hub' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**env, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


# -- errors --------------------------------------------------------------------------------------


def test_offline_and_not_cached_is_exit_4(hub, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, out, err = _estimate(capsys, REPO)
    assert rc == 4 and out == ""
    assert "offline" in _one_line_error(err) and "cache" in err
    assert hub.requests() == []


def test_unknown_repo_is_exit_2_with_did_you_mean(hub, capsys):
    rc, out, err = _estimate(capsys, "Qwen/Qwen2.5-7B-Instrukt")
    assert rc == 2 and out == ""
    assert "unknown model" in _one_line_error(err) and "Qwen/Qwen2.5-7B-Instruct" in err and "HF_TOKEN" in err


def test_gated_repo_says_to_accept_the_licence_and_set_hf_token(hub, capsys, monkeypatch):
    hub.add(REPO, single_file_repo(), gated=True)
    rc, out, err = _estimate(capsys, REPO)
    assert rc == 4 and out == ""
    assert "gated" in _one_line_error(err) and "HF_TOKEN" in err and "licence" in err
    monkeypatch.setenv("HF_TOKEN", GRANTED)
    assert resolve_model(REPO).exact_params == n_params(mistral_tensors())


def test_hub_down_is_exit_4_quickly(capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_unused_port()}")
    start = time.monotonic()
    rc, out, err = _estimate(capsys, REPO)
    assert rc == 4 and out == "" and time.monotonic() - start < 5
    assert "cannot reach the Hugging Face Hub" in _one_line_error(err)


def test_hub_that_never_answers_times_out(monkeypatch):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete in the kernel's backlog; nothing ever answers
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
        start = time.monotonic()
        with pytest.raises(UnavailableError, match="no answer within 1 s"):
            resolve_model(REPO)
        assert time.monotonic() - start < 8
    finally:
        silent.close()


def test_weight_map_entry_outside_the_repo_is_refused_before_any_request(hub):
    files = sharded_repo()
    index = json.loads(files["model.safetensors.index.json"])
    index["weight_map"]["model.norm.weight"] = "../../etc/passwd"
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    hub.add(REPO, files)
    with pytest.raises(BadInputError, match="not a file name inside"):
        resolve_model(REPO)
    assert not any("passwd" in path or rng for _, path, rng in hub.requests())


def test_index_listing_a_missing_shard(hub):
    files = sharded_repo()
    del files["model-00002-of-00002.safetensors"]
    hub.add(REPO, files)
    with pytest.raises(BadInputError, match="does not have"):
        resolve_model(REPO)


@pytest.mark.parametrize("weights", [
    raw_safetensors(b"{not json"),
    raw_safetensors({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}),
    raw_safetensors({"w": {"dtype": "F16", "shape": [-2], "data_offsets": [0, 4]}}),
    raw_safetensors({"w": {"dtype": "F16", "shape": [2], "data_offsets": 5}}),
    raw_safetensors({"w": []}),
    raw_safetensors(b"{}", length=2**40),
    b"\x01\x02",
], ids=["not-json", "unknown-dtype", "negative-dim", "offsets-not-a-list", "entry-not-an-object",
        "huge-length", "too-short"])
def test_malformed_header_is_exit_2(hub, capsys, weights):
    hub.add(REPO, {**single_file_repo(), "model.safetensors": weights})
    rc, out, err = _estimate(capsys, REPO)
    assert rc == 2 and out == ""
    assert "model.safetensors" in _one_line_error(err)
    assert not list(hub_models.cache_dir().rglob("*.json"))  # nothing bad is cached


def test_remote_code_config_is_refused_before_any_header(hub):
    cfg = {**CONFIG, "model_type": "weirdnet",
           "auto_map": {"AutoModelForCausalLM": "modeling_weird.WeirdForCausalLM"}}
    hub.add(REPO, single_file_repo(cfg))
    with pytest.raises(BadInputError, match="trust_remote_code"):
        resolve_model(REPO)
    assert not any(rng for _, _, rng in hub.requests())


def test_repo_without_config_json(hub):
    hub.add(REPO, {"model.gguf": b"GGUF"})
    with pytest.raises(BadInputError, match="has no config.json"):
        resolve_model(REPO)


def test_corrupt_cache_file_is_fetched_again(hub):
    hub.add(REPO, single_file_repo())
    resolve_model(REPO)
    (cached,) = hub_models.cache_dir().rglob("*.json")
    cached.write_text("{truncated")
    assert resolve_model(REPO).exact_params == n_params(mistral_tensors())
    assert json.loads(cached.read_text())["repo_id"] == REPO


# -- references ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ref,expected", [
    ("mistralai/Mistral-Nemo-Instruct-2407", ("mistralai/Mistral-Nemo-Instruct-2407", None)),
    ("owner/name@main", ("owner/name", "main")),
    ("owner/name@refs/pr/1", ("owner/name", "refs/pr/1")),
    ("owner/name.v2_x@0123abcd", ("owner/name.v2_x", "0123abcd")),
    ("gpt2", None), ("a/b/c", None), ("./x/y", None), ("owner/config.json", None), ("owner/-bad", None),
    ("owner/a--b", None), ("owner/a..b", None), ("owner/name@", None), ("owner/na me", None),
    ("owner/name@../../x", None),
])
def test_parse_ref(ref, expected):
    assert hub_models.parse_ref(ref) == expected


# -- a hostile Hub: one deadline, every answer capped, shapes refused ------------------------------


def _limits(monkeypatch, **changes):
    monkeypatch.setattr(hub_models, "LIMITS", dataclasses.replace(hub_models.LIMITS, **changes))


def _timed_estimate(capsys, ref: str = REPO) -> tuple[int, str, float]:
    start = time.monotonic()
    rc, out, err = _estimate(capsys, ref)
    assert out == "" or rc == 0
    return rc, _one_line_error(err) if rc else err, time.monotonic() - start


def _cached_files() -> list:
    return list((hub_models.cache_dir() / "hub").rglob("*.json")) if (hub_models.cache_dir() / "hub").exists() else []


def test_a_refused_model_is_not_cached_nor_served_offline(hub, capsys, monkeypatch):
    files = single_file_repo()
    files["model.safetensors"] = safetensors_header({**mistral_tensors(), "huge.weight": [2**40, 2**40]}) + bytes(64)
    hub.add(REPO, files)
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 2 and "1.21e+24 parameters" in err
    assert _cached_files() == []  # cached only after every check passed
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 4 and "offline" in err  # not served from the cache: it was never cached


def test_a_byte_every_so_often_meets_the_deadline(hub, capsys, monkeypatch):
    # Each read is quick (0.1 s, far under the 10 s per-read timeout); the whole would take 40 s.
    hub.add(REPO, {**single_file_repo(), "config.json": drip(json.dumps(CONFIG).encode(), 0.1)})
    monkeypatch.setenv("TRAINFIT_HUB_DEADLINE", "1.5")
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == 4 and "1.5 s deadline" in err and "TRAINFIT_HUB_DEADLINE" in err and "config.json" in err
    assert seconds < 1.5 + 1.0


def test_headers_dribbled_forever_meet_the_deadline(hub, capsys, monkeypatch):
    hub.add(REPO, single_file_repo(), info=drip_headers(0.05))
    monkeypatch.setenv("TRAINFIT_HUB_DEADLINE", "1")
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == 4 and "1 s deadline" in err
    assert seconds < 1 + 1.0


def test_slow_shards_meet_the_deadline(hub, capsys, monkeypatch):
    files = sharded_repo(12)
    for name in [f for f in files if f.endswith(".safetensors")]:
        files[name] = slow_ranges(files[name], 0.5)
    hub.add(REPO, files)
    _limits(monkeypatch, parallel_requests=2)  # 6 rounds of 0.5 s: over the deadline
    monkeypatch.setenv("TRAINFIT_HUB_DEADLINE", "1.5")
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == 4 and "1.5 s deadline" in err
    assert seconds < 1.5 + 1.0


def test_an_index_of_3000_shards_is_refused_before_any_header(hub, capsys):
    weight_map = {f"w{i}": f"model-{i + 1:05d}-of-03000.safetensors" for i in range(3000)}
    files = {"config.json": json.dumps(CONFIG).encode(),
             "model.safetensors.index.json": json.dumps({"weight_map": weight_map}).encode()}
    hub.add(REPO, {**files, **{name: b"" for name in weight_map.values()}})
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 2 and "lists 3,000 shard files" in err and "at most 1,024" in err
    assert not any(rng for _, _, rng in hub.requests())


def test_an_endless_chunked_config_is_cut_at_its_cap(hub, capsys):
    hub.add(REPO, {**single_file_repo(), "config.json": endless_chunked()})
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == 2 and "config.json is larger than 1 MiB" in err
    assert seconds < 10


def test_a_500_mb_config_is_refused_from_its_content_length(hub, capsys):
    hub.add(REPO, {**single_file_repo(), "config.json": sized(500_000_000)})
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == 2 and "config.json is larger than 1 MiB" in err and "announces 500,000,000 bytes" in err
    assert seconds < 10


def test_a_server_ignoring_range_is_read_only_as_far_as_the_header(hub, capsys):
    # 3 GB "weights" after a valid header: the first 100 kB are read, then the connection dropped.
    files = single_file_repo()
    files["model.safetensors"] = ignores_range(safetensors_header(mistral_tensors()), 3 * 10**9)
    hub.add(REPO, files)
    rc, out, err = _estimate(capsys, REPO)
    assert rc == 0, err
    assert json.loads(out)["params_total"] == n_params(mistral_tensors())


@pytest.mark.parametrize("where,code,message", [
    ("config.json", 2, "config.json is larger than 1 MiB (after decompressing)"),
    ("info", 4, "model info from http://127.0.0.1:"),
    ("model.safetensors", 2, "safetensors header of 50,000,000 bytes is larger than 8 MiB"),
])
def test_gzip_bombs_are_cut_after_decompressing(hub, capsys, where, code, message):
    files = single_file_repo()
    if where == "info":
        hub.add(REPO, files, info=gzip_bomb(10**10, b'{"id": "'))
    else:  # a safetensors file claiming a 50 MB header, then 10 GB of zeros, gzipped (~10 MB sent at most)
        files[where] = gzip_bomb(10**10, (5 * 10**7).to_bytes(8, "little") if where != "config.json" else b'{"a":"')
        hub.add(REPO, files)
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == code and message in err, err
    assert seconds < 10


@pytest.mark.parametrize("info", [b"[1, 2, 3]", b'"a string"', b"null", b"{not json", nested(5000), nested(100),
                                  b'{"id": "acme/x", "siblings": {"rfilename": "config.json"}}',
                                  b'{"siblings": [{"rfilename": 5}]}', b'{"x": 1' + b"1" * 5000 + b"}"],
                         ids=["list", "string", "null", "not-json", "nested-5000", "nested-100", "siblings-object",
                              "sibling-name-not-a-string", "5000-digit-number"])
def test_model_info_of_the_wrong_shape_is_exit_4(hub, capsys, info):
    hub.add(REPO, single_file_repo(), info=info)
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 4 and "model info" in err


@pytest.mark.parametrize("config", [nested(5000), nested(100), b"[1]"], ids=["nested-5000", "nested-100", "list"])
def test_a_config_of_the_wrong_shape_is_exit_2(hub, capsys, config):
    hub.add(REPO, {**single_file_repo(), "config.json": config})
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 2 and "config.json" in err


@pytest.mark.parametrize("variable", ["HF_HUB_DOWNLOAD_TIMEOUT", "TRAINFIT_HUB_DEADLINE"])
@pytest.mark.parametrize("value", ["nan", "abc", "-1", "0", "inf", "1e999"])
def test_a_bad_timeout_in_the_environment_is_exit_2_before_any_request(hub, capsys, monkeypatch, variable, value):
    hub.add(REPO, single_file_repo())
    monkeypatch.setenv(variable, value)
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 2 and f"environment variable {variable}" in err
    assert hub.requests() == []


@pytest.mark.parametrize("variable,value,message", [
    ("HF_HUB_DOWNLOAD_TIMEOUT", "nan", "environment variable HF_HUB_DOWNLOAD_TIMEOUT"),
    ("HF_HUB_ETAG_TIMEOUT", "abc", "huggingface_hub refused the environment"),
])
def test_a_bad_hub_setting_in_a_fresh_process_is_one_line(hub, variable, value, message):
    # huggingface_hub reads these with int() when it is imported (here: not yet imported).
    hub.add(REPO, single_file_repo())
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", variable: value}
    r = subprocess.run([sys.executable, "-m", "trainfit", "estimate", REPO, "--hardware", "cpu"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and message in r.stderr


@pytest.mark.parametrize("token", ["hf_caf\u00e9", "hf_a\x01b"])
def test_a_token_http_cannot_carry_is_exit_2(hub, capsys, monkeypatch, token):
    hub.add(REPO, single_file_repo())
    monkeypatch.setenv("HF_TOKEN", token)
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 2 and "HF_TOKEN" in err
    assert hub.requests() == []


@pytest.mark.parametrize("behaviour,message", [
    (redirect_loop(), "more than 5 redirects"),
    (encoded(json.dumps(CONFIG).encode(), "br"), "Content-Encoding 'br'"),
    (encoded(json.dumps(CONFIG).encode(), "gzip, gzip"), "Content-Encoding 'gzip, gzip'"),
    (sized(10**10, status=500), "answered HTTP 500"),
    (lambda h, head: h.answer(302, b"", {}, head), "HTTP 302 without a redirect to follow"),
    (lambda h, head: h.answer(304, b"", {"Location": "/x"}, head), "HTTP 304 without a redirect to follow"),
    (lambda h, head: h.answer(302, b"", {"Location": "file:///etc/passwd"}, head), "not http(s)"),
], ids=["redirect-loop", "brotli", "double-gzip", "error-with-10-GB-body", "302-without-location", "304",
        "redirect-to-a-file-url"])
def test_protocol_abuse_is_exit_4(hub, capsys, behaviour, message):
    hub.add(REPO, {**single_file_repo(), "config.json": behaviour})
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == 4 and message in err
    assert seconds < 10


def test_the_total_bytes_of_a_lookup_are_capped(hub, capsys, monkeypatch):
    hub.add(REPO, sharded_repo(4))
    _limits(monkeypatch, total_bytes=4000)
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 2 and "more than 0.00381" in err and "in all" in err
    assert _cached_files() == []


def test_the_token_goes_to_the_endpoint_only_not_where_a_redirect_points(hub, monkeypatch):
    seen: dict[str, str | None] = {}

    def recording(label: str, body: bytes):
        def send(h, head):
            seen[label] = h.headers.get("Authorization")
            h.answer(200, body, {"Content-Type": "application/json"}, head)
        return send

    with serve() as cdn:
        def to_cdn(h, head):  # what the Hub does for large files: a redirect to another host
            h.start(302, {"Location": f"{cdn.endpoint}/{REPO}/resolve/main/config.json", "Content-Length": "0"})

        def same_host(h, head):  # a renamed repository: a relative redirect on the same host
            h.start(307, {"Location": f"/{REPO}/resolve/main/real.safetensors", "Content-Length": "0"})

        cdn.add(REPO, {"config.json": recording("cdn", json.dumps(CONFIG).encode())})
        files = single_file_repo()
        hub.add(REPO, {"config.json": to_cdn, "model.safetensors": same_host,
                       "real.safetensors": recording("same-host", files["model.safetensors"])})
        monkeypatch.setenv("HF_TOKEN", GRANTED)
        assert resolve_model(REPO).exact_params == n_params(mistral_tensors())
    assert seen == {"cdn": None, "same-host": f"Bearer {GRANTED}"}


def test_a_partial_answer_from_the_wrong_offset_is_exit_4(hub, capsys):
    data = single_file_repo()["model.safetensors"]

    def shifted(h, head):  # 206 for bytes 0-..., but from byte 8: the length would be read from JSON
        h.answer(206, data[8:100_009], {"Content-Range": f"bytes 8-100008/{len(data)}"}, head)

    hub.add(REPO, {**single_file_repo(), "model.safetensors": shifted})
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 4 and "does not start at byte 0" in err


@pytest.mark.parametrize("endpoint", ["ftp://x", "http://[bad", "x", "http://127.0.0.1:99999", "http://:80"])
def test_an_endpoint_that_is_not_an_http_url_is_exit_2(capsys, monkeypatch, endpoint):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    rc, err, _ = _timed_estimate(capsys)
    assert rc == 2 and "HF_ENDPOINT" in err


@pytest.mark.parametrize("proxy,code", [("ftp://proxy", 2), ("socks5://127.0.0.1:1", 4)])
def test_proxy_settings_the_client_cannot_use_are_one_line(hub, capsys, monkeypatch, proxy, code):
    hub.add(REPO, single_file_repo())
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    rc, err, _ = _timed_estimate(capsys)
    assert rc == code and "proxy" in err


def test_a_refused_shard_is_reported_at_once_while_another_still_drips(hub, capsys, monkeypatch):
    files = sharded_repo(2)
    first, second = sorted(f for f in files if f.endswith(".safetensors"))
    files[first] = raw_safetensors({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})
    files[second] = drip(files[second], 0.2)
    hub.add(REPO, files)
    monkeypatch.setenv("TRAINFIT_HUB_DEADLINE", "30")
    rc, err, seconds = _timed_estimate(capsys)
    assert rc == 2 and "unknown dtype" in err and first in err
    assert seconds < 5


def test_the_core_makes_no_request_for_a_hub_id():
    """core.models.catalog.resolve_model hands Hub ids to the loader it is given (trainfit.hub's);
    without one it refuses them in one line, before any request."""
    from trainfit.core.models.catalog import resolve_model as core_resolve

    with pytest.raises(UnavailableError, match="Hugging Face Hub id"):
        core_resolve(REPO)
    asked = []
    spec = core_resolve(f"{REPO}@v2", hub_loader=lambda repo, rev, suggestions: asked.append((repo, rev)) or "spec")
    assert spec == "spec" and asked == [(REPO, "v2")]
    assert core_resolve("Qwen/Qwen2.5-7B").family  # catalog ids need no loader
