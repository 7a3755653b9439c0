"""What is derived from one context item, kept exactly as long as the item lives.

An item is immutable, so its rendered text and messages are computed once; the memo of an
item is found by its identity and dropped when the item is collected (a weak reference's
callback), so the memos hold what the live states hold and nothing of items no state has
any more. A memo may hold later items of a history beginning with its item (the histories
built from it): histories keep the relative order of their items, so no two memos hold
each other's items. A request header, immutable too, has a memo of the same kind for the
stable prefix built from it.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["ItemMemo", "memo_of"]


class ItemMemo(weakref.ref):  # type: ignore[type-arg]
    """The memo of one item (a weak reference to it). Its fields start empty (None); each
    user fills its own."""

    __slots__ = ("built", "key", "messages", "prefix", "span", "texts")

    key: int
    texts: dict[tuple[int | None, bool], str] | None
    """Rendered texts by (content limit, without header)."""
    messages: dict[tuple[str, int | None, bool], Any] | None
    """Item messages by (how it is sent, content limit, without header)."""
    built: dict[tuple[bool, tuple[str, ...], int | None, int], Any] | None
    """The newest history messages built from this item as the first one, by how they were
    built (developer role, trusted types, content limit, layout)."""
    span: Any
    """The newest history measured from this item as the first one, with its offsets."""
    prefix: Any
    """Of a request header: the lane messages last built from it (its stable prefix and the
    untrusted lane items), with the lane items they were built from."""

    def __new__(cls, item: object, key: int) -> ItemMemo:
        memo = super().__new__(cls, item, _drop)
        memo.key = key
        memo.texts = memo.messages = memo.built = memo.span = memo.prefix = None
        return memo

    def __init__(self, item: object, key: int) -> None:
        """Made whole by ``__new__`` (a reference's own initializer only takes its arguments)."""


_MEMOS: dict[int, ItemMemo] = {}


def memo_of(item: object) -> ItemMemo:
    """The memo of ``item``, made empty the first time (dict operations are atomic, so
    threads at worst make one twice and keep the later)."""
    key = id(item)
    found = _MEMOS.get(key)
    if found is not None and found() is item:
        return found
    memo = ItemMemo(item, key)
    _MEMOS[key] = memo
    return memo


def _drop(memo: ItemMemo, memos: dict[int, ItemMemo] = _MEMOS) -> None:
    # Called while the item is collected, before its id can be reused; a memo made later
    # for the same id (the same item, by a racing thread) is kept. The table is bound here:
    # items collected at interpreter exit outlive the module's globals.
    if memos.get(memo.key) is memo:
        memos.pop(memo.key, None)
