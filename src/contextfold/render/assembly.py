"""Assembling a body's message array from what is new: the serialized messages of a recent
request that this one begins with are reused, so a request costs its new messages plus a
copy of bytes, not a walk of its whole history.

A transport renders each message on its own into JSON units (one or more array elements,
``encode``), in the order of ``pairing.order_tool_results``: every result directly after
its call. A *closed* prefix of the messages (every call in it answered in it) is ordered
the same way inside any longer request, so its units are a prefix of the longer request's
units. :func:`assemble` finds the newest request assembled from the same first messages,
takes the longest closed prefix the two share, and orders and encodes only what follows;
pairing is checked for the new messages against the calls of the prefix. Whatever it
cannot do that way (broken pairing, a value orjson refuses) it leaves to the transport's
plain path, which raises the one error for it: :class:`Unassembled`.

Pure: equal messages give equal bytes, whatever was assembled before.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate

import orjson

from ..wire import JsonArray, NeutralMessage

__all__ = ["Encode", "Unassembled", "assemble"]

Encode = Callable[[NeutralMessage], tuple[bytes, ...]]
"""A transport's units of one message: compact JSON array elements, in wire order."""


class Unassembled(Exception):
    """The messages need the transport's plain path (which raises the error they make)."""


@dataclass(frozen=True, slots=True)
class _Assembled:
    messages: tuple[NeutralMessage, ...]
    units: tuple[orjson.Fragment, ...]
    """Every unit of ``messages``, in wire order."""
    ends: tuple[int, ...]
    """``ends[i]``: the bytes of ``units[:i]`` (from ``ends[0] == 0``)."""
    closed: tuple[int, ...]
    """Lengths of the closed prefixes of ``messages``, ascending (0 first)."""
    closed_units: tuple[int, ...]
    """How many units each closed prefix has."""
    call_at: dict[str, int]
    """Index of the message making each call, in message order (read only)."""

    @property
    def size(self) -> int:
        return self.ends[-1]


# The newest assembly by (transport, first two messages); bounded in entries and bytes (the
# units hold their bytes and no more, see ``assemble``).
_RECENT: OrderedDict[tuple[str, NeutralMessage, NeutralMessage], _Assembled] = OrderedDict()
_RECENT_MAX = 64
_RECENT_BYTES = 32 * 1024 * 1024
_LOCK = threading.Lock()
_held = 0


def assemble(
    transport: str,
    messages: tuple[NeutralMessage, ...],
    encode: Encode,
    lead: tuple[bytes, ...] = (),
) -> JsonArray:
    """The JSON array of ``lead`` (units before the messages) and the units of ``messages``
    in wire order, to embed in a body as it is (or to measure).

    Raises Unassembled when pairing is broken or a unit does not encode; the transport then
    renders plainly and raises its error there.
    """
    key = (transport, messages[0], messages[1]) if len(messages) >= 2 else None
    base = _RECENT.get(key) if key is not None else None
    start = 0
    closed: tuple[int, ...] = (0,)
    closed_units: tuple[int, ...] = (0,)
    units: tuple[orjson.Fragment, ...] = ()
    ends: tuple[int, ...] = (0,)
    call_at: dict[str, int] = {}
    if base is not None:
        at = bisect_right(base.closed, _common_prefix(messages, base.messages)) - 1
        start = base.closed[at]
        closed, closed_units = base.closed[: at + 1], base.closed_units[: at + 1]
        units, ends = base.units[: closed_units[-1]], base.ends[: closed_units[-1] + 1]
        # Calls are kept in message order: when the last is before start, all of them are
        # (copied in C, not walked: a request extending the previous one costs its new
        # messages, not the calls of the whole history).
        call_at = base.call_at.copy()
        while call_at and next(reversed(call_at.values())) >= start:
            call_at.popitem()  # the last made: only the calls after start are walked
    added, more_closed, more_units = _order(messages, start, call_at, encode, len(units))
    # Copied to their size: orjson's output keeps the buffer it reserved, at least 4 KiB
    # and about 16 bytes per character of a long string, which a kept unit would hold.
    units += tuple(orjson.Fragment(bytes(memoryview(unit))) for unit in added)
    ends += tuple(accumulate(map(len, added), initial=ends[-1]))[1:]
    if key is not None:
        closed, closed_units = closed + more_closed, closed_units + more_units
        _keep(key, _Assembled(messages, units, ends, closed, closed_units, call_at))
    heads = tuple(map(orjson.Fragment, lead))
    elements = heads + units
    size = 2 + sum(map(len, lead)) + ends[-1] + max(len(elements) - 1, 0)  # [ , ]
    return JsonArray(elements, size)


def _order(
    messages: tuple[NeutralMessage, ...],
    start: int,
    call_at: dict[str, int],
    encode: Encode,
    units_before: int,
) -> tuple[tuple[bytes, ...], tuple[int, ...], tuple[int, ...]]:
    """Units of ``messages[start:]`` in wire order, given that ``messages[:start]`` is closed
    with the calls ``call_at`` (extended in place), and the closed prefixes after ``start``
    with their unit counts. Raises Unassembled on any pairing fault."""
    for index in range(start, len(messages)):
        for call in messages[index].tool_calls:
            if call.id in call_at:
                raise Unassembled
            call_at[call.id] = index
    results: dict[int, list[int]] = {}
    answered: set[str] = set()
    encoded: list[tuple[bytes, ...]] = []
    closed: list[int] = []
    closed_units: list[int] = []
    open_calls = 0
    count = units_before
    for index in range(start, len(messages)):
        message = messages[index]
        try:
            own = _encoded(message, encode)
        except (TypeError, ValueError) as exc:  # orjson refuses it: named by the plain path
            raise Unassembled from exc
        encoded.append(own)
        count += len(own)
        open_calls += len(message.tool_calls)
        if message.role == "tool":
            call_id = message.tool_call_id
            made = call_at.get(call_id) if call_id is not None else None
            if made is None or made < start or made > index or call_id in answered:
                raise Unassembled  # answers nothing earlier, or a call answered already
            assert call_id is not None
            answered.add(call_id)
            results.setdefault(made, []).append(index)
            open_calls -= 1
        if open_calls == 0:
            closed.append(index + 1)
            closed_units.append(count)
    if open_calls:
        raise Unassembled  # a call without its result
    ordered: list[bytes] = []
    for index in range(start, len(messages)):
        if messages[index].role == "tool":
            continue
        ordered.extend(encoded[index - start])
        for result in results.get(index, ()):
            ordered.extend(encoded[result - start])
    return tuple(ordered), tuple(closed), tuple(closed_units)


# orjson reserves about 16 bytes per character of a string while writing it, so a long
# content is written in pieces of this many characters (JSON escapes each character on its
# own: the pieces' escapes joined are the whole one's) and put where a mark was written.
_PIECE = 64 * 1024
_MARK = "\x00contextfold content\x00"
_MARKED = orjson.dumps(_MARK)[1:-1]


def _encoded(message: NeutralMessage, encode: Encode) -> tuple[bytes, ...]:
    """``encode(message)``, with a long content written in pieces. Raises as ``encode``."""
    content = message.content
    if len(content) <= _PIECE:
        return encode(message)
    marked = encode(replace(message, content=_MARK))
    if sum(unit.count(_MARKED) for unit in marked) != 1 or any(
        _MARKED in unit for unit in encode(replace(message, content=""))
    ):
        return encode(message)  # the content is not written once as it is: no shortcut
    pieces = (
        orjson.dumps(content[at : at + _PIECE])[1:-1] for at in range(0, len(content), _PIECE)
    )
    written = b"".join(pieces)
    return tuple(unit.replace(_MARKED, written, 1) for unit in marked)


def _common_prefix(a: tuple[NeutralMessage, ...], b: tuple[NeutralMessage, ...]) -> int:
    """The length of the longest common prefix (slices compare in C, identical messages by
    identity), found by halving."""
    n = min(len(a), len(b))
    low, high = 0, n  # a[:low] == b[:low]; they differ before high (or are equal: checked)
    # A request usually repeats all of the previous one but its last two messages (the
    # history's breakpoint and the tail): probed first, so only those two are halved.
    probe = n - 2
    if probe > 0:
        if a[:probe] == b[:probe]:
            low = probe
        else:
            high = probe
    if high == n and a[low:n] == b[low:n]:
        return n
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


def _keep(key: tuple[str, NeutralMessage, NeutralMessage], assembled: _Assembled) -> None:
    global _held
    with _LOCK:
        replaced = _RECENT.pop(key, None)
        _held += assembled.size - (replaced.size if replaced is not None else 0)
        _RECENT[key] = assembled
        while _RECENT and (len(_RECENT) > _RECENT_MAX or _held > _RECENT_BYTES):
            _held -= _RECENT.popitem(last=False)[1].size
