"""Canonical JSON and hashing: the one place bytes for storage and hashing are made.

Canonical JSON is orjson with sorted keys and no whitespace. It rejects what JSON
cannot carry faithfully (NaN, infinity, non-string keys, unknown objects) instead of
turning it into something else, because stored events must read back as written.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson

from .errors import PayloadError

__all__ = [
    "canonical_json",
    "check_json_value",
    "dumps",
    "encode_checked",
    "is_plain_json",
    "loads",
    "sha256_hex",
]

_CANONICAL = orjson.OPT_SORT_KEYS
_MAX_DEPTH = 250  # orjson's own nesting limit is 255; fail with our message first


def check_json_value(value: Any, *, where: str = "payload") -> None:
    """Raise PayloadError naming the path when ``value`` is not plain, finite JSON."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise PayloadError(f"{path}: nested deeper than {_MAX_DEPTH} levels")
        if item is None or isinstance(item, (bool, str)):
            continue
        if isinstance(item, int):
            if not -(2**63) <= item < 2**64:
                raise PayloadError(f"{path}: integer {item} does not fit in 64 bits")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise PayloadError(
                    f"{path}: {item!r} is not valid JSON (NaN and infinity are refused)"
                )
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise PayloadError(f"{path}: key {key!r} is not a string")
                stack.append((child, f"{path}.{key}", depth + 1))
            continue
        if isinstance(item, (list, tuple)):
            for index, child in enumerate(item):
                stack.append((child, f"{path}[{index}]", depth + 1))
            continue
        raise PayloadError(f"{path}: {type(item).__name__} is not JSON-serializable")


_INT_LOW, _INT_HIGH = -(2**63), 2**64
_SCALARS = (str, bool, type(None))


def is_plain_json(value: Any) -> bool:
    """Whether :func:`check_json_value` passes ``value``, in one pass without building the
    paths it names: False also for some values it passes (subclasses of str, int, dict, …;
    nesting close to its depth limit), so False means "ask it", never "refused"."""
    stack: list[tuple[Any, int]] = []
    item, depth = value, 0
    while True:
        kind = type(item)
        if kind is dict:
            if depth >= _MAX_DEPTH:
                return False
            for key, child in item.items():
                if type(key) is not str:
                    return False
                child_kind = type(child)
                if child_kind in _SCALARS:
                    continue
                if child_kind is int:
                    if not _INT_LOW <= child < _INT_HIGH:
                        return False
                elif child_kind is float:
                    if not math.isfinite(child):
                        return False
                else:
                    stack.append((child, depth + 1))
        elif kind is list or kind is tuple:
            if depth >= _MAX_DEPTH:
                return False
            for child in item:
                child_kind = type(child)
                if child_kind in _SCALARS:
                    continue
                if child_kind is int:
                    if not _INT_LOW <= child < _INT_HIGH:
                        return False
                elif child_kind is float:
                    if not math.isfinite(child):
                        return False
                else:
                    stack.append((child, depth + 1))
        elif kind in _SCALARS:
            pass
        elif kind is int:
            if not _INT_LOW <= item < _INT_HIGH:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        else:
            return False
        if not stack:
            return True
        item, depth = stack.pop()


def dumps(value: Any) -> bytes:
    """Compact JSON bytes (keys in insertion order). Raises PayloadError for non-JSON."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:  # orjson.JSONEncodeError subclasses TypeError
        raise PayloadError(str(exc)) from exc


def encode_checked(value: Any, *, where: str = "payload") -> bytes:
    """Compact JSON of ``value``, refusing what JSON cannot carry faithfully.

    orjson already refuses non-string keys, integers over 64 bits and unknown types, but
    writes NaN and infinity as ``null``: only output holding a ``null`` is walked for them
    (once, without paths, unless the walk finds something), so the common case costs one
    encode. Raises PayloadError naming the path at fault.
    """
    try:
        data = orjson.dumps(value)
    except TypeError:
        check_json_value(value, where=where)  # names the field at fault
        raise PayloadError(f"{where}: not JSON-serializable") from None
    if b"null" in data and not is_plain_json(value):
        check_json_value(value, where=where)
    return data


def canonical_json(value: Any) -> bytes:
    """Sorted-key compact JSON bytes: equal values give equal bytes."""
    try:
        return orjson.dumps(value, option=_CANONICAL)
    except TypeError as exc:
        raise PayloadError(str(exc)) from exc


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ValueError (orjson.JSONDecodeError) on malformed input."""
    return orjson.loads(data)


def sha256_hex(data: bytes | str) -> str:
    """Hex SHA-256 of bytes (text is UTF-8 encoded)."""
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()
