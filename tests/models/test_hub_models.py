"""Hub models (core/hub_models) against a fake Hugging Face Hub served on 127.0.0.1.

The fake answers the routes huggingface_hub calls (`/api/models/{repo}/revision/{rev}` and
`/{repo}/resolve/{rev}/{file}` with HEAD, GET and Range), so the real client runs unmocked.
Every test points HF_ENDPOINT at a local address and the caches at tmp_path: nothing reaches
the internet or the user's caches.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainfit.cli.main import main
from trainfit.core import hub_models
from trainfit.core.model_catalog import resolve_model
from trainfit.core.params import count_params
from trainfit.errors import BadInputError, UnavailableError

REPO = "acme/tiny-mistral"
GRANTED = "hf_granted"
CONFIG = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "vocab_size": 1000, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False, "hidden_act": "silu", "sliding_window": None,
          "torch_dtype": "float32"}  # the headers say BF16: the stored dtype must come from them
# A tensor beyond the config's shapes, so the count can only be right when read from the headers.
EXTRA = {"multi_modal_projector.weight": [7, 3]}
_ITEM = {"F32": 4, "BF16": 2, "F16": 2}


def mistral_tensors(cfg: dict = CONFIG) -> dict[str, list[int]]:
    h, i, v, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    t = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t.update({p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                  p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                  p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                  p + "mlp.down_proj.weight": [h, i], p + "input_layernorm.weight": [h],
                  p + "post_attention_layernorm.weight": [h]})
    return {**t, **EXTRA}


def n_params(tensors: dict[str, list[int]]) -> int:
    return sum(math.prod(s) for s in tensors.values())


def safetensors_bytes(tensors: dict[str, list[int]], dtype: str = "BF16", metadata: dict | None = None) -> bytes:
    """A real safetensors file (zero weights): 8-byte little-endian header length, JSON header, data."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = math.prod(shape) * _ITEM[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def raw_safetensors(header: bytes | dict, length: int | None = None, data: int = 64) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + bytes(data)


def single_file_repo(cfg: dict = CONFIG) -> dict[str, bytes]:
    return {"config.json": json.dumps(cfg).encode(), "model.safetensors": safetensors_bytes(mistral_tensors(cfg)),
            "README.md": b"# tiny"}


def sharded_repo() -> dict[str, bytes]:
    tensors = mistral_tensors()
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    files = {"config.json": json.dumps(CONFIG).encode()}
    weight_map = {}
    for shard, members in shards.items():
        files[shard] = safetensors_bytes({n: tensors[n] for n in members})
        weight_map.update({n: shard for n in members})
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    return files


class FakeHub:
    """Repositories in memory, and a log of every request: (method, path, Range header)."""

    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.endpoint = ""

    def add(self, repo_id: str, files: dict[str, bytes], *, gated: bool = False, lists_files: bool = True) -> str:
        sha = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = {"files": files, "gated": gated, "sha": sha, "revisions": {"main", "v1", sha},
                               "lists_files": lists_files}
        return sha

    def requests(self) -> list[tuple[str, str, str | None]]:
        with self.lock:
            return list(self.log)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub; every answer has a Content-Length

    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self._handle(head=True)

    def do_GET(self):
        self._handle(head=False)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool):
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)

    def _handle(self, head: bool):
        hub: FakeHub = self.server.hub  # type: ignore[attr-defined]
        path = urllib.parse.urlsplit(self.path).path
        with hub.lock:
            hub.log.append((self.command, urllib.parse.unquote(path), self.headers.get("Range")))
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            repo, revision = hub.repos.get(m.group(1)), urllib.parse.unquote(m.group(2) or "main")
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found", head)
            if revision not in repo["revisions"]:
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, head)
            doc = {"id": m.group(1), "sha": repo["sha"], "private": False,
                   "gated": "manual" if repo["gated"] else False, "downloads": 0, "likes": 0, "tags": [],
                   "lastModified": "2024-07-18T00:00:00.000Z"}
            if repo["lists_files"]:
                doc["siblings"] = [{"rfilename": f} for f in repo["files"]]
            return self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            repo = hub.repos.get(m.group(1))
            revision, filename = urllib.parse.unquote(m.group(2)), urllib.parse.unquote(m.group(3))
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found", head)
            if revision not in repo["revisions"]:
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, head)
            if repo["gated"] and self.headers.get("Authorization") != f"Bearer {GRANTED}":
                return self._error(401, "GatedRepo", "Access to model is restricted", head)
            if filename not in repo["files"]:
                return self._error(404, "EntryNotFound", "Entry not found", head)
            data = repo["files"][filename]
            headers = {"X-Repo-Commit": repo["sha"], "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if rng is None:
                return self._send(200, data, headers, head)
            start = int(rng.group(1))
            end = min(int(rng.group(2)) if rng.group(2) else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, data[start:end + 1], headers, head)
        return self._send(404, b"not found", {}, head)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    fake = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.hub = fake  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    yield fake
    server.shutdown()
    server.server_close()


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
    code = (f"import sys; from trainfit.core.model_catalog import resolve_model; resolve_model({REPO!r}); "
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
