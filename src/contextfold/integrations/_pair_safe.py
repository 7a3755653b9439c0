"""Pair-safe windows: the newest whole units of a history that fit a token budget.

A unit is what must reach the model together or not at all: a tool call with its results
(a provider refuses either alone). Each integration cuts its framework's messages into
units; this module, framework-neutral and pure, chooses how many of the newest to keep, as
contextfold's ``drop_oldest`` view does with segments: walking back from the newest unit,
the first ``keep`` are kept whatever they cost, and the first unit that does not fit ends
the window, so a window costs what it keeps (and one unit more).

Where units are not contiguous runs given up front, they follow from links: ``link(i)`` is
the index of the earliest item that item ``i`` must be sent with (:func:`link_of`), and a
window may start at ``i`` only when no item from ``i`` on links before ``i``
(:func:`pair_safe_starts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from ..errors import InvalidInputError

__all__ = ["checked_counter", "costed", "link_of", "newest_fitting", "pair_safe_starts"]

T = TypeVar("T")
U = TypeVar("U")


def newest_fitting(
    views: Iterable[tuple[U, float]], *, budget: float, keep: int = 1, empty: float = 0.0
) -> tuple[list[U], float]:
    """The newest units that fit ``budget``, newest first, and the tokens of their window.

    ``views`` yields, newest first, each unit with the tokens of the window that keeps it and
    every newer unit. The first ``keep`` units are kept whatever they cost; the first later
    unit whose window is over ``budget`` ends the walk (``views`` is read no further).
    ``empty`` is the tokens of a window keeping no unit.
    """
    kept: list[U] = []
    tokens = empty
    for rank, (unit, cost) in enumerate(views):
        if rank >= keep and cost > budget:
            break
        kept.append(unit)
        tokens = cost
    return kept, tokens


def costed(
    units: Iterable[U], *, cost: Callable[[U], float], base: float = 0.0
) -> Iterator[tuple[U, float]]:
    """``units`` (newest first) each with the tokens of the window from it on: ``base`` (what
    every window holds) plus the ``cost`` of it and every newer unit. Lazy: a unit is sized
    when it is reached."""
    total = base
    for unit in units:
        total += cost(unit)
        yield unit, total


def link_of(index: int, answers: Iterable[str], calls: Mapping[str, int]) -> int:
    """The link of the item at ``index`` answering the tool calls ``answers``: the index of
    the latest earlier item making one of them, the oldest such (``calls``: call id -> index
    of the latest item making it so far), else ``index`` itself."""
    link = index
    for answer in answers:
        made = calls.get(answer)
        if made is not None and made < link:
            link = made
    return link


def pair_safe_starts(
    count: int,
    *,
    link: Callable[[int], int],
    tokens: Callable[[int], float],
    may_start: Callable[[int], bool] | None = None,
    lowest: int = 0,
) -> Iterator[tuple[int, float]]:
    """Newest first, each index a window over ``count`` items may start at, with the tokens
    of the items from it on (summed newest first).

    A window may start at ``i`` when no item from ``i`` on links before ``i`` and, for
    ``i > 0``, ``may_start(i)``; index 0 always may. Items are read newest first, only as far
    as the caller takes, and never below ``lowest``.
    """
    walked = 0.0
    low = count
    for index in range(count - 1, max(lowest, 0) - 1, -1):
        walked += tokens(index)
        low = min(low, link(index))
        if low >= index and (index == 0 or may_start is None or may_start(index)):
            yield index, walked


def checked_counter(
    count_tokens: Callable[[T], object] | None,
    *,
    default: Callable[[T], float],
    what: Callable[[T], str],
) -> Callable[[T], float]:
    """``count_tokens`` (``default`` when None) as a counter whose every answer is checked.

    Raises InvalidInputError now when ``count_tokens`` is no function, and when it is used
    and answers anything but a finite number >= 0, naming the item (``what(item)``).
    """
    if count_tokens is None:
        return default
    if not callable(count_tokens):
        raise InvalidInputError(f"count_tokens must be a function, got {count_tokens!r}")
    given = count_tokens

    def count(item: T) -> float:
        tokens = given(item)
        if (
            isinstance(tokens, bool)
            or not isinstance(tokens, (int, float))
            or not math.isfinite(tokens)
            or tokens < 0
        ):
            raise InvalidInputError(
                f"count_tokens returned {tokens!r} for {what(item)}: it must return a finite "
                "number >= 0"
            )
        return float(tokens)

    return count
