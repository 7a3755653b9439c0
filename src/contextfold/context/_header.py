"""Item headers: the one metadata line that starts each rendered item (see
``context.request``), written by :func:`item_header` and read back by
:func:`parse_item_header`, which takes only what is written here."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .attachments import file_references
from .state import ContextItem

__all__ = ["ItemHeader", "item_header", "parse_item_header"]

# Characters str.splitlines breaks on that JSON string encoding leaves as they are.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
_OFFSET = re.compile(r"@([1-9][0-9]*)")
_TOKEN = re.compile(r"[a-z][a-z0-9_.-]*")
_FIELD = re.compile(r" ([a-z_]+)=")
_STRING_FIELDS = ("key", "actor_id", "tool_call")
_LIST_FIELDS = ("refs", "files")
_ORDER = ("key", "updates", "actor", "actor_id", "tool_call", "refs", "files")
_DECODER = json.JSONDecoder()
# json.dumps with an option builds an encoder per call; for a str this one's encode is the
# same C escape json.dumps(value, ensure_ascii=False) ends in.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _quote(value: str) -> str:
    return _ENCODER.encode(value).translate(_LINE_BREAKS)


def _quote_list(values: tuple[str, ...]) -> str:
    return "[" + ",".join(_quote(value) for value in values) + "]"


@dataclass(frozen=True, slots=True)
class ItemHeader:
    """The metadata of one rendered item, as written in (or parsed from) its header line."""

    offset: int
    key: str | None = None
    updates: int | None = None
    actor: str | None = None
    actor_id: str | None = None
    tool_call: str | None = None
    refs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    @classmethod
    def of(cls, item: ContextItem) -> ItemHeader:
        return cls(
            offset=item.offset,
            key=item.key,
            updates=item.updates,
            actor=item.actor.type if item.actor is not None else None,
            actor_id=item.actor.id if item.actor is not None else None,
            tool_call=item.tool_call_id,
            refs=tuple(ref.render() for ref in item.refs),
            files=file_references(item.files),
        )

    def render(self) -> str:
        """The one header line (no line break inside; only present fields)."""
        return _header_line(
            self.offset,
            self.key,
            self.updates,
            self.actor,
            self.actor_id,
            self.tool_call,
            self.refs,
            self.files,
        )


def _header_line(
    offset: int,
    key: str | None,
    updates: int | None,
    actor: str | None,
    actor_id: str | None,
    tool_call: str | None,
    refs: tuple[str, ...],
    files: tuple[str, ...],
) -> str:
    parts = [f"@{offset}"]
    if key is not None:
        parts.append(f"key={_quote(key)}")
    if updates is not None:
        parts.append(f"updates=@{updates}")
    if actor is not None:
        parts.append(f"actor={actor}")
    if actor_id is not None:
        parts.append(f"actor_id={_quote(actor_id)}")
    if tool_call is not None:
        parts.append(f"tool_call={_quote(tool_call)}")
    if refs:
        parts.append(f"refs={_quote_list(refs)}")
    if files:
        parts.append(f"files={_quote_list(files)}")
    return " ".join(parts)


def item_header(item: ContextItem) -> str:
    """The header line of ``item``, e.g. ``@81 key="github/review-task" updates=@17``."""
    # ItemHeader.of(item).render() without building the ItemHeader (once per new item).
    actor = item.actor
    return _header_line(
        item.offset,
        item.key,
        item.updates,
        actor.type if actor is not None else None,
        actor.id if actor is not None else None,
        item.tool_call_id,
        tuple(ref.render() for ref in item.refs) if item.refs else (),
        file_references(item.files) if item.files else (),
    )


def parse_item_header(text: str) -> ItemHeader | None:
    """The header on the first line of ``text``, or None when it has none.

    Strict: the fields must appear in render order, each at most once, and the whole
    line must be consumed.
    """
    line = text.split("\n", 1)[0]
    match = _OFFSET.match(line)
    if match is None:
        return None
    values: dict[str, Any] = {}
    at = match.end()
    order = iter(_ORDER)
    while at < len(line):
        field = _FIELD.match(line, at)
        if field is None or field.group(1) not in order:  # consumes the order: no repeats
            return None
        name, at = field.group(1), field.end()
        try:
            if name == "updates":
                number = _OFFSET.match(line, at)
                if number is None:
                    return None
                values[name], at = int(number.group(1)), number.end()
            elif name == "actor":
                token = _TOKEN.match(line, at)
                if token is None:
                    return None
                values[name], at = token.group(0), token.end()
            else:
                value, at = _DECODER.raw_decode(line, at)
                if name in _STRING_FIELDS and not isinstance(value, str):
                    return None
                if name in _LIST_FIELDS:
                    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                        return None
                    value = tuple(value)
                values[name] = value
        except ValueError:
            return None
    header = ItemHeader(offset=int(match.group(1)), **values)
    # Exactly what this module renders: anything else is not a header.
    return header if header.render() == line else None
