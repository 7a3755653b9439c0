"""Assembling a body's message array from what is new: the serialized messages an earlier
body begins with are copied from it, so a request extending the one rendered before costs
its new messages plus a copy of bytes, not a walk of its whole history.

A transport renders each message on its own into JSON units (one or more array elements,
``encode``), in the order of ``pairing.order_tool_results``: every result directly after
its call. A *closed* prefix of the messages (every call in it answered in it) is ordered
the same way inside any longer request, so its units are a prefix of the longer request's
units, written one after another. :func:`assemble` is given the array of an earlier body
(``previous``, a `wire.WrittenArray`: the caller keeps it, nothing is kept here), takes the
longest closed prefix the two requests share, copies its units from that body in one
piece, and orders and encodes only what follows; pairing is checked for the new messages
against the calls of the prefix. Whatever it cannot do that way (broken pairing, a value
orjson refuses) it leaves to the transport's plain path, which raises the one error for it:
:class:`Unassembled`.

Pure: equal messages give equal bytes, with any ``previous`` or none.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate

import orjson

from ..wire import JsonArray, NeutralMessage, WrittenArray

__all__ = ["Encode", "Unassembled", "assemble"]

Encode = Callable[[NeutralMessage], tuple[bytes, ...]]
"""A transport's units of one message: compact JSON array elements, in wire order."""


class Unassembled(Exception):
    """The messages need the transport's plain path (which raises the error they make)."""


@dataclass(frozen=True, slots=True)
class _Kept:
    """What an assembled array keeps to assemble a later one from its written bytes."""

    messages: tuple[NeutralMessage, ...]
    first: int
    """Where the first unit starts in the written array (after ``[`` and the lead units)."""
    ends: tuple[int, ...]
    """``ends[i]``: the bytes of the first ``i`` units, separators left out (``ends[0] == 0``)."""
    closed: tuple[int, ...]
    """Lengths of the closed prefixes of ``messages``, ascending (0 first)."""
    closed_units: tuple[int, ...]
    """How many units each closed prefix has."""
    call_at: dict[str, int]
    """Index of the message making each call, in message order (read only)."""


def assemble(
    messages: tuple[NeutralMessage, ...],
    encode: Encode,
    lead: tuple[bytes, ...] = (),
    previous: WrittenArray | None = None,
) -> JsonArray:
    """The JSON array of ``lead`` (units before the messages) and the units of ``messages``
    in wire order, to embed in a body as it is (or to measure); it keeps what a later
    request needs to be assembled from it once it is written. ``previous``: an array this
    function assembled for an earlier body of the same transport, as written there.

    Raises Unassembled when pairing is broken or a unit does not encode; the transport then
    renders plainly and raises its error there.
    """
    base = previous.kept if previous is not None else None
    start = 0
    closed: tuple[int, ...] = (0,)
    closed_units: tuple[int, ...] = (0,)
    ends: tuple[int, ...] = (0,)
    call_at: dict[str, int] = {}
    shared: tuple[orjson.Fragment, ...] = ()
    if previous is not None and isinstance(base, _Kept):
        at = bisect_right(base.closed, _common_prefix(messages, base.messages)) - 1
        start, count = base.closed[at], base.closed_units[at]
        closed, closed_units = base.closed[: at + 1], base.closed_units[: at + 1]
        ends = base.ends[: count + 1]
        if count:
            # The shared units, with the commas between them, as one piece of the array.
            begin = previous.at + base.first
            shared = (orjson.Fragment(previous.body[begin : begin + ends[-1] + count - 1]),)
        # Calls are kept in message order: when the last is before start, all of them are
        # (copied in C, not walked: a request extending the previous one costs its new
        # messages, not the calls of the whole history).
        call_at = base.call_at.copy()
        while call_at and next(reversed(call_at.values())) >= start:
            call_at.popitem()  # the last made: only the calls after start are walked
    added, more_closed, more_units = _order(messages, start, call_at, encode, len(ends) - 1)
    ends += tuple(accumulate(map(len, added), initial=ends[-1]))[1:]
    written = sum(map(len, lead))
    kept = _Kept(
        messages,
        1 + written + len(lead),
        ends,
        closed + more_closed,
        closed_units + more_units,
        call_at,
    )
    elements = (*map(orjson.Fragment, lead), *shared, *map(orjson.Fragment, added))
    size = 2 + written + ends[-1] + max(len(lead) + len(ends) - 2, 0)  # [ , ]
    return JsonArray(elements, size, kept)


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
