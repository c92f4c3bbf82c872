"""Dataclass <-> JSON-compatible dict, driven by type hints, so results round-trip exactly.

Handles nested dataclasses, list/tuple/dict, Optional/unions with None, Enum and Literal.
Unknown keys in input are an error (a typo in a saved profile must not pass silently).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, TypeVar

from trainfit.errors import short_repr

T = TypeVar("T")


def to_jsonable(obj: Any) -> Any:
    """Turn dataclasses, enums, tuples and dicts into plain JSON-compatible values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


class SerdeError(ValueError):
    """Input data does not match the dataclass schema; the message names the key path."""


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_jsonable(cls: type[T], data: Any, path: str = "") -> T:
    """Build `cls` from data produced by to_jsonable (or hand-written JSON/YAML)."""
    return _convert(cls, data, path or cls.__name__)


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except SerdeError as exc:
                errors.append(str(exc))
        raise SerdeError(errors[0] if errors else f"{path}: unexpected null")
    if origin is typing.Literal:
        if value not in args:
            raise SerdeError(f"{path}: {short_repr(value)} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SerdeError(f"{path}: expected an object, got {type(value).__name__}")
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = set(value) - names
        if unknown:
            raise SerdeError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            if f.name in value:
                kwargs[f.name] = _convert(hints[f.name], value[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SerdeError(f"{path}: missing key '{f.name}'")
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            valid = ", ".join(repr(m.value) for m in tp)
            raise SerdeError(f"{path}: {short_repr(value)} is not one of {valid}") from None
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise SerdeError(f"{path}: expected a list, got {type(value).__name__}")
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise SerdeError(f"{path}: expected an object, got {type(value).__name__}")
        val_tp = args[1] if len(args) == 2 else Any
        return {k: _convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SerdeError(f"{path}: expected a number, got {short_repr(value)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SerdeError(f"{path}: expected an integer, got {short_repr(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise SerdeError(f"{path}: expected true/false, got {short_repr(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise SerdeError(f"{path}: expected a string, got {short_repr(value)}")
        return value
    return value
