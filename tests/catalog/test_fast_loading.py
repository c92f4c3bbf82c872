"""Catalog loading is fast and gives the same data every way: libyaml's C loader and the
pure-Python loader parse the shipped catalogs identically, and the parsed-data cache
(trainfit.yaml_io) returns exactly what parsing returns, follows edits of the text, and never
turns a cache problem into an error."""

from __future__ import annotations

import datetime as dt
import os
from importlib import resources

import pytest
import yaml

from trainfit import yaml_io
from trainfit.core.cloud import catalog as cloud_catalog
from trainfit.core.machines import gpu_catalog
from trainfit.core.models import catalog as model_catalog

SHIPPED = ("models.yaml", "gpus.yaml", "cloud.yaml")
HAS_LIBYAML = getattr(yaml, "CSafeLoader", None) is not None


def _text(name: str) -> str:
    return resources.files("trainfit").joinpath("data", name).read_text(encoding="utf-8")


def _differences(a, b, where="") -> list[str]:
    """Where two values differ, by value or by type, all the way down (1 == 1.0 == True under ==)."""
    if type(a) is not type(b):
        return [f"{where}: {type(a).__name__} != {type(b).__name__}"]
    if isinstance(a, dict):
        if list(a) != list(b):
            return [f"{where}: keys or their order differ"]
        return [d for key in a for d in _differences(a[key], b[key], f"{where}.{key}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{where}: lengths differ"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _clear_catalog_caches() -> None:
    model_catalog.all_models.cache_clear()
    model_catalog._index.cache_clear()
    gpu_catalog.catalog.cache_clear()
    gpu_catalog._by_normalised_name.cache_clear()
    cloud_catalog._shipped.cache_clear()


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """A private XDG cache dir, and the catalogs' in-process caches emptied around the test."""
    monkeypatch.delenv("TRAINFIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _clear_catalog_caches()
    yield tmp_path / "xdg" / "trainfit" / "yaml"
    _clear_catalog_caches()


# ----------------------------------------------------------------------------- C vs Python loader
def test_the_fast_loader_is_used_when_libyaml_is_there():
    assert yaml_io.safe_loader() is (yaml.CSafeLoader if HAS_LIBYAML else yaml.SafeLoader)


@pytest.mark.skipif(not HAS_LIBYAML, reason="PyYAML built without libyaml")
@pytest.mark.parametrize("name", SHIPPED)
def test_c_and_python_loaders_give_identical_data(name):
    text = _text(name)
    fast = yaml_io.load_yaml(text, loader=yaml.CSafeLoader)
    slow = yaml_io.load_yaml(text, loader=yaml.SafeLoader)
    assert _differences(fast, slow, name) == []
    assert _differences(fast, yaml.safe_load(text), name) == []


@pytest.mark.skipif(not HAS_LIBYAML, reason="PyYAML built without libyaml")
def test_catalog_objects_are_identical_with_either_loader(cache_home, monkeypatch):
    fast = (model_catalog.all_models(), gpu_catalog.catalog(), cloud_catalog.load_cloud_catalog())
    _clear_catalog_caches()
    monkeypatch.setattr(yaml_io, "safe_loader", lambda: yaml.SafeLoader)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home.parent.parent / "other"))  # parse again, no cache
    slow = (model_catalog.all_models(), gpu_catalog.catalog(), cloud_catalog.load_cloud_catalog())
    assert fast == slow


def test_yaml_errors_are_still_yaml_errors():
    with pytest.raises(yaml.YAMLError):
        yaml_io.load_yaml("a: [1, 2")
    assert yaml_io.YAMLError is yaml.YAMLError
    with pytest.raises(gpu_catalog.CatalogError, match="not valid YAML"):
        gpu_catalog.parse_catalog("gpus: [", "x.yaml")


# ----------------------------------------------------------------------------- the parsed-data cache
@pytest.mark.parametrize("name", SHIPPED)
def test_cached_data_is_identical_to_parsed_data(cache_home, monkeypatch, name):
    text = _text(name)
    first = yaml_io.load_yaml_cached(text, name)
    assert os.path.isfile(yaml_io.cache_path(text, name))

    def no_parsing(*a, **k):
        raise AssertionError("parsed although the cache holds this text")

    monkeypatch.setattr(yaml_io, "load_yaml", no_parsing)
    second = yaml_io.load_yaml_cached(text, name)
    assert _differences(second, first, name) == []
    assert _differences(second, yaml.safe_load(text), name) == []


def test_shipped_catalogs_are_the_same_from_the_cache(cache_home):
    cold = (model_catalog.all_models(), gpu_catalog.catalog(), cloud_catalog.load_cloud_catalog())
    assert sorted(p.split(".")[0] for p in os.listdir(cache_home)) == ["cloud", "gpus", "models"]
    _clear_catalog_caches()
    warm = (model_catalog.all_models(), gpu_catalog.catalog(), cloud_catalog.load_cloud_catalog())
    assert warm == cold


def test_an_edited_text_is_parsed_again_and_replaces_the_old_entry(cache_home):
    old = "a: 1\nb: [x, y]\n"
    new = "a: 2\nb: [x, y]\n"
    assert yaml_io.load_yaml_cached(old, "thing.yaml") == {"a": 1, "b": ["x", "y"]}
    assert yaml_io.load_yaml_cached(new, "thing.yaml") == {"a": 2, "b": ["x", "y"]}
    assert os.listdir(cache_home) == [os.path.basename(yaml_io.cache_path(new, "thing.yaml"))]
    assert yaml_io.load_yaml_cached(old, "thing.yaml") == {"a": 1, "b": ["x", "y"]}


def test_dates_keep_their_types(cache_home):
    text = "as_of: 2025-01-31\nat: 2025-01-31T10:20:30+02:00\nnaive: 2025-01-31 10:20:30\nlist: [2024-02-29]\n"
    first = yaml_io.load_yaml_cached(text, "dates.yaml")
    again = yaml_io.load_yaml_cached(text, "dates.yaml")
    assert _differences(again, first) == []
    assert type(again["as_of"]) is dt.date and type(again["at"]) is dt.datetime
    assert again["at"].utcoffset() == dt.timedelta(hours=2)


@pytest.mark.parametrize("text", ["b: !!binary aGVsbG8=\n", "s: !!set {a, b}\n", "o: !!omap [{a: 1}, {b: 2}]\n"])
def test_types_the_cache_does_not_store_are_parsed_every_time(cache_home, text):
    assert yaml_io.load_yaml_cached(text, "odd.yaml") == yaml.safe_load(text)
    assert not cache_home.exists() or not os.listdir(cache_home)
    assert yaml_io.load_yaml_cached(text, "odd.yaml") == yaml.safe_load(text)


@pytest.mark.parametrize("junk", [b"", b"\x00garbage", b"not marshal at all"])
def test_a_broken_cache_file_is_ignored_and_rewritten(cache_home, junk):
    text = "k: v\n"
    path = yaml_io.cache_path(text, "k.yaml")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as fh:
        fh.write(junk)
    assert yaml_io.load_yaml_cached(text, "k.yaml") == {"k": "v"}
    assert yaml_io.load_yaml_cached(text, "k.yaml") == {"k": "v"}
    with open(path, "rb") as fh:
        assert fh.read() != junk


def test_a_cache_file_for_other_text_is_not_trusted(cache_home):
    a, b = "k: a\n", "k: b\n"
    yaml_io.load_yaml_cached(a, "k.yaml")
    os.replace(yaml_io.cache_path(a, "k.yaml"), yaml_io.cache_path(b, "k.yaml"))  # a file under the wrong key
    assert yaml_io.load_yaml_cached(b, "k.yaml") == {"k": "b"}


def test_an_unwritable_cache_dir_means_parsing(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert yaml_io.load_yaml_cached("k: v\n", "k.yaml") == {"k": "v"}
    assert yaml_io.load_yaml_cached("k: v\n", "k.yaml") == {"k": "v"}


def test_cache_dir_follows_xdg_and_ignores_a_relative_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINFIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert yaml_io.cache_dir() == os.path.join(str(tmp_path), "trainfit", "yaml")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert yaml_io.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "trainfit", "yaml")
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path / "own"))
    assert yaml_io.cache_dir() == os.path.join(str(tmp_path), "own", "yaml")
