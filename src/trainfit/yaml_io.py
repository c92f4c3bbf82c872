"""Fast YAML loading, in one place.

`load_yaml(text)` parses like `yaml.safe_load` with libyaml's C loader when PyYAML was built with
it (about 8x faster on the shipped catalogs), else with the pure-Python SafeLoader; both give the
same data. Errors are `yaml.YAMLError` either way (also reachable as `yaml_io.YAMLError`, which
imports PyYAML only when it is looked up, e.g. by an `except` clause that an error reached).

`load_yaml_cached(text, name)` also keeps the parsed data, in `marshal` form, in the user's cache
directory (the "yaml" folder of trainfit.user_cache: ~/.cache/trainfit/yaml by default), keyed by the sha256
of the text: a later process reads it back without importing PyYAML or parsing. Any problem with
the cache (unwritable directory, a truncated or foreign file) means parsing the text as if there
were no cache. It is meant for the catalogs shipped in trainfit/data, parsed by every command.
"""

from __future__ import annotations

import datetime as _dt
import marshal
import os
import sys
from typing import Any

CACHE_FORMAT = 1  # bump when the cached layout changes; old files are then ignored and replaced
_TAG_DATE = "\0date"  # dates are stored as (tag, isoformat) tuples; data holding other tuples is not cached
_TAG_DATETIME = "\0datetime"
_PLAIN = (str, int, float, bool, type(None))


def __getattr__(name: str) -> Any:  # PEP 562: `yaml_io.YAMLError` without importing yaml up front
    if name == "YAMLError":
        import yaml

        return yaml.YAMLError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def safe_loader() -> type:
    """libyaml's CSafeLoader when available, else the pure-Python SafeLoader."""
    import yaml

    return getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


def load_yaml(text: str, *, loader: type | None = None, unique_keys: bool = False) -> Any:
    """Parse one YAML document like `yaml.safe_load(text)`; `loader` forces a loader (tests).
    With `unique_keys`, a key given twice in one mapping is a YAMLError naming the key and both
    lines, where PyYAML keeps the last value silently (a second `schedule:` block would drop the
    first's settings). Keys brought in by a merge (`<<: *base`) may still be overridden."""
    import yaml

    chosen = loader or safe_loader()
    if unique_keys:
        chosen = _unique_keys_loader(chosen)
    return yaml.load(text, Loader=chosen)  # noqa: S506 - a safe loader


_UNIQUE_LOADERS: dict[type, type] = {}


def _unique_keys_loader(base: type) -> type:
    """`base` with a mapping constructor that refuses a key given twice."""
    if base not in _UNIQUE_LOADERS:
        import yaml

        class UniqueKeyLoader(base):  # type: ignore[misc, valid-type]
            def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
                if isinstance(node, yaml.MappingNode):
                    _refuse_duplicate_keys(self, node)
                return super().construct_mapping(node, deep=deep)

        _UNIQUE_LOADERS[base] = UniqueKeyLoader
    return _UNIQUE_LOADERS[base]


def _refuse_duplicate_keys(loader: Any, node: Any) -> None:
    import yaml

    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node, deep=False)
        line = key_node.start_mark.line + 1
        try:
            if key not in first_line:
                first_line[key] = line
                continue
        except TypeError:  # an unhashable key: the constructor reports it
            continue
        shown = str(key) if len(str(key)) <= 40 else str(key)[:37] + "..."
        raise yaml.constructor.ConstructorError(
            None, None, f"key '{shown}' is given twice (lines {first_line[key]} and {line}); keep one",
            key_node.start_mark)


def cache_dir() -> str:
    """Where parsed YAML is kept (created on first write): the "yaml" folder of trainfit's cache."""
    from trainfit.user_cache import user_cache_dir

    return str(user_cache_dir("yaml"))


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cache_path(text: str, name: str) -> str:
    """The cache file of this text under this name."""
    return _path(_digest(text), name)


def _path(digest: str, name: str) -> str:
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"  # marshal's format follows the interpreter
    return os.path.join(cache_dir(), f"{_stem(name)}.{digest}.v{CACHE_FORMAT}.{py}.marshal")


def load_yaml_cached(text: str, name: str) -> Any:
    """`load_yaml(text)`, read from / written to the cache when possible. `name` labels the file."""
    digest = _digest(text)
    path = _path(digest, name)
    try:
        with open(path, "rb") as fh:
            fmt, key, tagged, data = marshal.loads(fh.read())
        if fmt == CACHE_FORMAT and key == digest:
            return _decode(data) if tagged else data
    except (OSError, EOFError, ValueError, TypeError):
        pass  # no cache yet, or a file we cannot use: parse
    data = load_yaml(text)
    _write(path, digest, data)
    return data


def _stem(name: str) -> str:
    base = os.path.basename(name)
    base = base.rsplit(".", 1)[0] if base.endswith((".yaml", ".yml")) else base
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in base) or "yaml"


def _write(path: str, digest: str, data: Any) -> None:
    """Best effort: write atomically, drop older files of the same name; never raise."""
    if _plain(data):
        payload = (CACHE_FORMAT, digest, False, data)
    else:
        encoded = _encode(data)
        if encoded is _UNSUPPORTED:
            return  # binary, sets, ordered maps: not cached, always parsed
        payload = (CACHE_FORMAT, digest, True, encoded)
    folder, file = os.path.split(path)
    tmp = f"{path}.{os.getpid()}-{id(payload)}.tmp"  # unique per process and thread
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(marshal.dumps(payload))
        os.replace(tmp, path)
    except (OSError, ValueError):
        _remove(tmp)
        return
    stem = file.split(".", 1)[0] + "."
    try:
        others = [f for f in os.listdir(folder) if f.startswith(stem) and f.endswith(".marshal") and f != file]
    except OSError:
        others = []
    for other in others:  # the same file's older texts (another trainfit version, an edited catalog)
        _remove(os.path.join(folder, other))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _plain(value: Any) -> bool:
    """True when value holds only dicts, lists, str, int, float, bool and None."""
    if isinstance(value, dict):
        return all(isinstance(k, _PLAIN) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN)


_UNSUPPORTED = object()


def _encode(value: Any) -> Any:
    """Dates and datetimes as tagged tuples; _UNSUPPORTED when another non-plain type is inside."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            ek, ev = _encode(k), _encode(v)
            if ek is _UNSUPPORTED or ev is _UNSUPPORTED:
                return _UNSUPPORTED
            out[ek] = ev
        return out
    if isinstance(value, list):
        items = [_encode(v) for v in value]
        return _UNSUPPORTED if any(e is _UNSUPPORTED for e in items) else items
    if isinstance(value, _dt.datetime):
        return (_TAG_DATETIME, value.isoformat())
    if isinstance(value, _dt.date):
        return (_TAG_DATE, value.isoformat())
    return value if isinstance(value, _PLAIN) else _UNSUPPORTED


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return {_decode(k): _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, tuple):
        tag, text = value
        if tag == _TAG_DATETIME:
            return _dt.datetime.fromisoformat(text)
        if tag == _TAG_DATE:
            return _dt.date.fromisoformat(text)
        raise ValueError(f"unknown tag {tag!r}")
    return value
