"""LangGraph checkpoint records shown readable, without LangGraph.

The LangGraph saver (``contextfold.langgraph/`` records) stores each value as LangGraph's
serializer wrote it: a type tag and base64 bytes, msgpack for almost everything, whose
extension types wrap a ``(module, class, arguments)`` tuple. :func:`shown_payload` gives
a record's payload with those values decoded: a LangChain message as
``{type, content, tool_calls, ...}`` (the fields it sets), any other wrapped object as
``{"__type__": "module.Class", ...}`` with its arguments, bytes as text when they are
UTF-8. Nothing is imported by name nor constructed, and the stored record is never
changed: this is display only.

Decoding msgpack needs ``ormsgpack`` (a LangGraph dependency). Without it, or for a
value stored in a form it cannot read (pickle, encrypted, a part of a value split over
records), the value stays as stored and the reason is given.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["LANGGRAPH_TYPES", "shown_payload"]

LANGGRAPH_TYPES = "contextfold.langgraph/"
"""The type prefix of the records whose payload :func:`shown_payload` decodes."""

# LangGraph's msgpack extension codes (langgraph.checkpoint.serde.jsonplus).
_SINGLE_ARG, _POS_ARGS, _KW_ARGS, _METHOD_ARG, _PYDANTIC_V1, _PYDANTIC_V2 = range(6)
_NUMPY_ARRAY, _DELTA_SNAPSHOT = 6, 7
_MESSAGES = ("langchain_core.messages", "langchain.schema.messages")
_FIRST = ("type", "content", "tool_calls", "tool_call_id", "name", "id")
_KINDS = {
    "HumanMessage": "human",
    "AIMessage": "ai",
    "SystemMessage": "system",
    "ToolMessage": "tool",
    "FunctionMessage": "function",
    "ChatMessage": "chat",
    "RemoveMessage": "remove",
}
"""The type tag of each LangChain message class (a chunk's tag is its class name)."""


class _Raw(Exception):
    """A value left as stored, and why."""


def _message(fields: dict[str, Any]) -> dict[str, Any]:
    """A LangChain message's fields: type and content first, then those set."""
    shown = {"type": fields.get("type"), "content": fields.get("content", "")}
    for key in (*_FIRST, *sorted(fields)):
        value = fields.get(key)
        if key not in shown and value not in (None, "", [], {}, ()):
            shown[key] = value
    return shown


def _bytes(data: bytes) -> Any:
    try:
        return {"__type__": "bytes", "text": data.decode()}
    except UnicodeDecodeError:  # binary: its bytes are the only faithful form
        return {"__type__": "bytes", "base64": base64.b64encode(data).decode("ascii")}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return _bytes(bytes(value))
    return value


def _wrapped(code: int, inner: Any) -> Any:
    """What an extension type holds, shown (see the module docstring)."""
    if code == _DELTA_SNAPSHOT:
        return {"__type__": "langgraph.checkpoint.serde.types._DeltaSnapshot", "value": inner}
    if code == _NUMPY_ARRAY and isinstance(inner, list | tuple) and len(inner) == 4:
        dtype, shape, _order, buffer = inner
        size = len(buffer) if isinstance(buffer, bytes | bytearray | memoryview) else None
        return {"__type__": "numpy.ndarray", "dtype": dtype, "shape": shape, "bytes": size}
    if not isinstance(inner, list | tuple) or len(inner) < 3:
        return {"__type__": f"msgpack extension {code}", "value": inner}
    module, name, arguments = inner[0], inner[1], inner[2]
    kind = f"{module}.{name}"
    if code in (_PYDANTIC_V1, _PYDANTIC_V2, _KW_ARGS) and isinstance(arguments, dict):
        if str(module).startswith(_MESSAGES):
            return _message(arguments)
        return {"__type__": kind, **{str(k): v for k, v in arguments.items()}}
    if code == _POS_ARGS:
        return {"__type__": kind, "args": arguments}
    return {"__type__": kind, "value": arguments}


# Bytes after the first byte of a msgpack header (0xc4 to 0xdf): (size field, fixed length).
_HEADS = {
    **{0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0)},  # bin
    **{0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)},  # ext (then the ext type byte)
    **{0xCA: (0, 4), 0xCB: (0, 8), 0xCC: (0, 1), 0xCD: (0, 2), 0xCE: (0, 4), 0xCF: (0, 8)},
    **{0xD0: (0, 1), 0xD1: (0, 2), 0xD2: (0, 4), 0xD3: (0, 8)},
    **{0xD4: (0, 2), 0xD5: (0, 3), 0xD6: (0, 5), 0xD7: (0, 9), 0xD8: (0, 17)},  # fixext
    **{0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)},  # str
}
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # (size, per entry)


def _whole(data: bytes) -> bool:
    """Whether ``data`` is exactly one msgpack value (ormsgpack ignores what follows one,
    so a later part of a value split over records would decode as something else)."""
    at, pending = 0, 1
    while pending:
        if at >= len(data):
            return False
        head = data[at]
        pending -= 1
        at += 1
        if head <= 0x7F or head >= 0xE0 or head in (0xC0, 0xC2, 0xC3):
            continue
        if head <= 0x8F:
            pending += 2 * (head & 0x0F)
        elif head <= 0x9F:
            pending += head & 0x0F
        elif head <= 0xBF:
            at += head & 0x1F
        elif head in _CONTAINERS:
            size, per = _CONTAINERS[head]
            pending += per * int.from_bytes(data[at : at + size], "big")
            at += size
        elif head in _HEADS:
            size, fixed = _HEADS[head]
            at += size + fixed + int.from_bytes(data[at : at + size], "big")
        else:
            return False  # 0xc1: never used
    return at == len(data)


def _msgpack(data: bytes) -> Any:
    if not _whole(data):
        raise _Raw("not one whole msgpack value (a part of a value stored over records?)")
    try:
        import ormsgpack
    except ImportError:
        raise _Raw(
            "ormsgpack is not installed (pip install ormsgpack, or langgraph): LangGraph's "
            "msgpack values are shown as stored, base64"
        ) from None
    option = ormsgpack.OPT_NON_STR_KEYS

    def hook(code: int, inner: bytes) -> Any:
        return _wrapped(code, ormsgpack.unpackb(inner, ext_hook=hook, option=option))

    try:
        return ormsgpack.unpackb(data, ext_hook=hook, option=option)
    except ValueError as exc:  # ormsgpack's decode error, a failed hook's included
        raise _Raw(f"not msgpack LangGraph could read ({exc})") from None


def _revived(value: Any) -> Any:
    """A JSON value with LangChain's ``{"lc": 1, "type": "constructor", ...}`` objects shown
    as the msgpack ones are."""
    if isinstance(value, list):
        return [_revived(v) for v in value]
    if not isinstance(value, dict):
        return value
    found = {k: _revived(v) for k, v in value.items()}
    path, kwargs = found.get("id"), found.get("kwargs")
    if found.get("type") != "constructor" or not isinstance(path, list) or not path:
        return found
    arguments = kwargs if isinstance(kwargs, dict) else {}
    module = ".".join(map(str, path[:-1]))
    if module.startswith(_MESSAGES):
        return _message({"type": _KINDS.get(str(path[-1]), path[-1]), **arguments})
    return {"__type__": f"{module}.{path[-1]}", **arguments}


def _value(kind: str, data: str) -> Any:
    """One stored value (serde type tag and base64 bytes), decoded; raises _Raw."""
    if kind == "null":
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _Raw("not base64 as the saver writes it") from None
    if kind == "msgpack":
        return _jsonable(_msgpack(raw))
    if kind == "json":
        try:
            return _revived(orjson.loads(raw))
        except orjson.JSONDecodeError:
            raise _Raw("not the JSON its type tag says") from None
    if kind in ("bytes", "bytearray"):
        return _bytes(raw)
    raise _Raw(f"values serialized as {kind!r} are not decoded for display")


def _typed(typed: Any, notes: list[str]) -> Any:
    """A ``{type, data}`` value shown as ``{type, value}`` (or as stored, noted)."""
    if not isinstance(typed, dict) or not isinstance(typed.get("data"), str):
        return typed
    try:
        value = _value(str(typed.get("type")), typed["data"])
    except _Raw as why:
        notes.append(str(why))
        return typed
    return {"type": typed.get("type"), "value": value}


def _blob(payload: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    shown = dict(payload)
    if payload.get("kind") == "value" and isinstance(payload.get("data"), str):
        if payload.get("more"):
            notes.append("a part of a value stored over several records: shown as stored")
            return shown
        try:
            shown["value"] = _value(str(payload.get("serde_type")), payload["data"])
        except _Raw as why:
            notes.append(str(why))
            return shown
        del shown["data"]
    items = payload.get("items")
    if isinstance(items, list) and items:
        decoded = []
        for item in items:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], str)):
                return shown
            try:
                decoded.append(_value(str(item[0]), item[1]))
            except _Raw as why:
                notes.append(str(why))
                return shown
        shown["items"] = decoded
    return shown


def _checkpoint(payload: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    return {**payload, "checkpoint": _typed(payload.get("checkpoint"), notes)}


def _writes(payload: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    writes = payload.get("writes")
    if not isinstance(writes, list):
        return payload
    shown = [
        {**w, "value": _typed(w.get("value"), notes)} if isinstance(w, dict) else w for w in writes
    ]
    return {**payload, "writes": shown}


_SHOWN: dict[str, Callable[[dict[str, Any], list[str]], dict[str, Any]]] = {
    LANGGRAPH_TYPES + "channel-blob": _blob,
    LANGGRAPH_TYPES + "checkpoint-put": _checkpoint,
    LANGGRAPH_TYPES + "writes-put": _writes,
}


def shown_payload(event_type: str, payload: Any) -> tuple[Any, str | None]:
    """``payload`` of a record of ``event_type`` as shown: a LangGraph saver record's
    serialized values decoded (see the module docstring), any other payload as it is.
    The note says why a value stayed as stored (None: every value was decoded)."""
    shown = _SHOWN.get(event_type)
    if shown is None or not isinstance(payload, dict):
        return payload, None
    notes: list[str] = []
    decoded = shown(payload, notes)
    return decoded, "; ".join(dict.fromkeys(notes)) or None
