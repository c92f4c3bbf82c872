"""A fake Hugging Face Hub on 127.0.0.1, honest or hostile, for the Hub tests and bench/hub_hostile.py.

It answers the routes trainfit's Hub client calls (`/api/models/{repo}/revision/{rev}` and
`/{repo}/resolve/{rev}/{file}` with HEAD, GET and Range), so the real client runs unmocked. A
file's content (or the model info) may instead be a *behaviour*: a function that writes the whole
HTTP answer itself, slowly, endlessly, compressed or wrong (`drip`, `endless_chunked`,
`ignores_range`, `gzip_bomb`, ...). Every behaviour stops when the server is stopped, so a client
that gave up leaves no thread behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import socket
import struct
import threading
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
_CHUNK = 64 << 10


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


def safetensors_header(tensors: dict[str, list[int]], dtype: str = "BF16", metadata: dict | None = None) -> bytes:
    """The first bytes of a safetensors file: 8-byte little-endian length, then the JSON header."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = math.prod(shape) * _ITEM[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def safetensors_bytes(tensors: dict[str, list[int]], dtype: str = "BF16", metadata: dict | None = None) -> bytes:
    """A real safetensors file (zero weights)."""
    data = sum(math.prod(s) * _ITEM[dtype] for s in tensors.values())
    return safetensors_header(tensors, dtype, metadata) + bytes(data)


def raw_safetensors(header: bytes | dict, length: int | None = None, data: int = 64) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + bytes(data)


def single_file_repo(cfg: dict = CONFIG) -> dict:
    return {"config.json": json.dumps(cfg).encode(), "model.safetensors": safetensors_bytes(mistral_tensors(cfg)),
            "README.md": b"# tiny"}


def sharded_repo(n_shards: int = 2) -> dict:
    tensors = mistral_tensors()
    names = list(tensors)
    files: dict = {"config.json": json.dumps(CONFIG).encode()}
    weight_map = {}
    for k in range(n_shards):
        shard = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        members = names[k * len(names) // n_shards:(k + 1) * len(names) // n_shards]
        files[shard] = safetensors_bytes({n: tensors[n] for n in members})
        weight_map.update({n: shard for n in members})
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    return files


# -- hostile behaviours: each writes the whole answer (status, headers, body) itself -------------

Behaviour = Callable[["_Handler", bool], None]


def drip(body: bytes, every_seconds: float) -> Behaviour:
    """A correct answer, one byte every `every_seconds` (each read is quick; the whole is not)."""
    def send(h: _Handler, head: bool) -> None:
        h.start(200, {"Content-Length": str(len(body)), "Content-Type": "application/json"})
        for i in range(len(body)):
            if head or h.hub.stopped.wait(every_seconds):
                return
            h.wfile.write(body[i:i + 1])
            h.wfile.flush()
    return send


def drip_headers(every_seconds: float) -> Behaviour:
    """The status line and headers one byte at a time, never finished."""
    def send(h: _Handler, head: bool) -> None:
        line = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: " + b"a" * 100_000
        for i in range(len(line)):
            if h.hub.stopped.wait(every_seconds):
                return
            h.wfile.write(line[i:i + 1])
            h.wfile.flush()
    return send


def _stream(h: _Handler, pieces: Iterator[bytes], headers: dict[str, str], status: int = 200,
            chunked: bool = False) -> None:
    h.start(status, {**headers, **({"Transfer-Encoding": "chunked"} if chunked else {})})
    for piece in pieces:
        if h.hub.stopped.is_set() or not piece:
            break
        h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
    if chunked:
        h.wfile.write(b"0\r\n\r\n")
    h.close_connection = True


def endless_chunked(prefix: bytes = b'{"pad": "') -> Behaviour:
    """A chunked answer that never ends (64 kB of 'a' per chunk, forever)."""
    def send(h: _Handler, head: bool) -> None:
        _stream(h, _forever(prefix), {"Content-Type": "application/json"}, chunked=True)
    return send


def _forever(prefix: bytes) -> Iterator[bytes]:
    yield prefix
    chunk = b"a" * _CHUNK
    while True:
        yield chunk


def sized(total_bytes: int, prefix: bytes = b'{"pad": "', status: int = 200) -> Behaviour:
    """A Content-Length of `total_bytes` (500 MB, 3 GB...), the body generated as it is sent."""
    def send(h: _Handler, head: bool) -> None:
        if head:
            return h.start(status, {"Content-Length": str(total_bytes)})
        _stream(h, _sized(prefix, total_bytes), {"Content-Length": str(total_bytes)}, status=status)
    return send


def _sized(prefix: bytes, total_bytes: int) -> Iterator[bytes]:
    yield prefix[:total_bytes]
    left = total_bytes - len(prefix)
    zeros = bytes(_CHUNK)
    while left > 0:
        yield zeros[:left]
        left -= _CHUNK


def ignores_range(prefix: bytes, total_bytes: int) -> Behaviour:
    """Whatever Range is asked, the whole file from byte 0 (a valid header, then `total_bytes` of weights)."""
    return sized(total_bytes, prefix)


def gzip_bomb(decompressed_bytes: int, prefix: bytes = b"", status: int = 200) -> Behaviour:
    """Content-Encoding: gzip of `prefix` and zeros, `decompressed_bytes` in all (~1000:1), compressed
    as it is sent."""
    def send(h: _Handler, head: bool) -> None:
        _stream(h, _gzip_zeros(prefix, decompressed_bytes), {"Content-Encoding": "gzip",
                                                             "Content-Type": "application/json"},
                status=status, chunked=True)
    return send


def _gzip_zeros(prefix: bytes, total_bytes: int) -> Iterator[bytes]:
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    yield z.compress(prefix)
    zeros = bytes(1 << 20)
    left = total_bytes - len(prefix)
    while left > 0:
        out = z.compress(zeros[:left])
        left -= len(zeros)
        if out:
            yield out
    yield z.flush()


def encoded(body: bytes, encoding: str) -> Behaviour:
    """`body` under a Content-Encoding header the client did not ask for (br, zstd, 'gzip, gzip')."""
    def send(h: _Handler, head: bool) -> None:
        h.start(200, {"Content-Length": str(len(body)), "Content-Encoding": encoding})
        if not head:
            h.wfile.write(body)
    return send


def redirect_loop() -> Behaviour:
    def send(h: _Handler, head: bool) -> None:
        h.start(302, {"Location": h.path, "Content-Length": "0"})
    return send


def slow(body: bytes, delay_seconds: float) -> Behaviour:
    """A correct answer after `delay_seconds` of silence."""
    def send(h: _Handler, head: bool) -> None:
        if h.hub.stopped.wait(delay_seconds):
            return
        h.answer(200, body, {"Accept-Ranges": "bytes"}, head)
    return send


def slow_ranges(data: bytes, delay_seconds: float) -> Behaviour:
    """A safetensors file served honestly (Range included), each answer after `delay_seconds`."""
    def send(h: _Handler, head: bool) -> None:
        if h.hub.stopped.wait(delay_seconds):
            return
        h.serve_file(data, {}, head)
    return send


def nested(depth: int) -> bytes:
    return b'{"a": ' + b"[" * depth + b"]" * depth + b"}"


# -- the server ----------------------------------------------------------------------------------


class FakeHub:
    """Repositories in memory, and a log of every request: (method, path, Range header)."""

    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.endpoint = ""

    def add(self, repo_id: str, files: dict, *, gated: bool = False, lists_files: bool = True,
            info: bytes | Behaviour | None = None) -> str:
        """`files` maps names onto bytes or behaviours; `info` replaces the model info answer."""
        sha = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = {"files": files, "gated": gated, "sha": sha, "revisions": {"main", "v1", sha},
                               "lists_files": lists_files, "info": info}
        return sha

    def requests(self) -> list[tuple[str, str, str | None]]:
        with self.lock:
            return list(self.log)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub; every answer has a Content-Length
    hub: FakeHub

    def log_message(self, *args):  # quiet
        pass

    def do_HEAD(self):
        self._handle(head=True)

    def do_GET(self):
        self._handle(head=False)

    def start(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()

    def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None, head: bool = False):
        self.start(status, {**(headers or {}), "Content-Length": str(len(body))})
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool):
        self.answer(status, json.dumps({"error": message}).encode(),
                    {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)

    def _handle(self, head: bool):
        self.hub = self.server.hub  # type: ignore[attr-defined]
        hub = self.hub
        path = urllib.parse.urlsplit(self.path).path
        with hub.lock:
            hub.log.append((self.command, urllib.parse.unquote(path), self.headers.get("Range")))
        try:
            self._route(hub, path, head)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: what a hostile answer wants
            self.close_connection = True

    def _route(self, hub: FakeHub, path: str, head: bool):
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            repo, revision = hub.repos.get(m.group(1)), urllib.parse.unquote(m.group(2) or "main")
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found", head)
            if revision not in repo["revisions"]:
                return self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, head)
            if callable(repo["info"]):
                return repo["info"](self, head)
            if repo["info"] is not None:
                return self.answer(200, repo["info"], {"Content-Type": "application/json"}, head)
            doc = {"id": m.group(1), "sha": repo["sha"], "private": False,
                   "gated": "manual" if repo["gated"] else False, "downloads": 0, "likes": 0, "tags": [],
                   "lastModified": "2024-07-18T00:00:00.000Z"}
            if repo["lists_files"]:
                doc["siblings"] = [{"rfilename": f} for f in repo["files"]]
            return self.answer(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)
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
            if callable(data):
                return data(self, head)
            return self.serve_file(data, {"X-Repo-Commit": repo["sha"]}, head)
        return self.answer(404, b"not found", {}, head)

    def serve_file(self, data: bytes, headers: dict[str, str], head: bool) -> None:
        """A file as the Hub serves it: whole, or the asked byte range (206, 416 past the end)."""
        headers = {**headers, "ETag": f'"{hashlib.sha1(data).hexdigest()}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if rng is None:
            return self.answer(200, data, headers, head)
        start = int(rng.group(1))
        end = min(int(rng.group(2)) if rng.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data):
            return self.answer(416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return self.answer(206, data[start:end + 1], headers, head)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that hung up mid-answer: expected here
        pass


@contextlib.contextmanager
def serve() -> Iterator[FakeHub]:
    """A FakeHub listening on 127.0.0.1 (its `endpoint`) until the block ends."""
    fake = FakeHub()
    server = _QuietServer(("127.0.0.1", 0), _Handler)
    server.hub = fake  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        fake.stopped.set()
        server.shutdown()
        server.server_close()


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
