"""JSON request bodies parsed without silent changes: what orjson would alter is refused.

orjson keeps the last of repeated keys and turns integers beyond 64 bits into rounded
floats, so ``{"n": 18446744073709551616}`` would be stored as ``1.8446744073709552e+19``
while the library refuses such integers. :func:`loads` parses with orjson, and only when
a cheap scan of the bytes (outside strings) shows a long digit run or more keys than the
parsed objects hold does it parse again with the standard library to name the place.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from ..errors import StrictJsonError

__all__ = ["loads"]

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# 2**63 has 19 digits: any integer the library cannot store has at least as many.
_LONG_DIGITS = re.compile(rb"\d{19,}")
_INT_LOW, _INT_HIGH = -(2**63), 2**64  # what canonical.check_json_value accepts


def loads(data: bytes) -> Any:
    """The JSON value of ``data``. Raises orjson.JSONDecodeError for invalid JSON and
    StrictJsonError naming the field (``events[0].payload.n``) for a repeated key or an
    integer outside -2**63..2**64-1."""
    value = orjson.loads(data)
    if not isinstance(value, dict | list):
        _check_scalar(value, data)
        return value
    bare = _STRING.sub(b'""', data)
    if _LONG_DIGITS.search(bare) is None and bare.count(b":") == _count_keys(value):
        return value
    _find_fault(_stdlib_loads(data, object_pairs_hook=_Pairs.of))
    return value  # a long digit run in a fraction or exponent: nothing altered


def _check_scalar(value: Any, data: bytes) -> None:
    if isinstance(value, float) and _LONG_DIGITS.search(data) is not None:
        _find_fault(_stdlib_loads(data))


def _stdlib_loads(data: bytes, **options: Any) -> Any:
    try:
        return json.loads(data, **options)
    except RecursionError:
        raise StrictJsonError(
            "the body nests too deeply to check its keys and integers; flatten it"
        ) from None


def _count_keys(value: dict[str, Any] | list[Any]) -> int:
    count = 0
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            count += len(item)
            todo.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            todo.extend(v for v in item if isinstance(v, dict | list))
    return count


class _Pairs(dict[str, Any]):
    """An object parsed by the standard library, remembering its first repeated key."""

    repeated: str | None = None

    @classmethod
    def of(cls, pairs: list[tuple[str, Any]]) -> _Pairs:
        made = cls(pairs)
        if len(made) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    made.repeated = key
                    break
                seen.add(key)
        return made


def _find_fault(value: Any) -> None:
    # Iterative, depth first in document order: nesting as deep as orjson allows (1024)
    # would overflow Python's recursion limit.
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, _Pairs) and item.repeated is not None:
            raise StrictJsonError(
                f"{_name(path, item.repeated)}: the key {item.repeated!r} is given more "
                "than once in one object; send it once"
            )
        if isinstance(item, dict):
            todo.extend((_name(path, key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            todo.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
        elif type(item) is int and not _INT_LOW <= item < _INT_HIGH:
            raise StrictJsonError(
                f"{path or 'the body'}: the integer {item} does not fit in 64 bits "
                f"({_INT_LOW} to {_INT_HIGH - 1}); send it as a string"
            )


def _name(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
