"""Folding an append into cached states where global positions have gaps (PostgreSQL:
appends to other streams draw global positions in between): a batch the store says follows
a state's head continues it, one it says follows another event does not. And a caller that
knows the stream's head (a lease holder's own last append) has a state at it returned
without asking the store."""

from __future__ import annotations

from typing import Any

import contextfold as cf
from contextfold.store.memory import MemoryStore
from contextfold.testing import RecordingStore


class Said(cf.Event, type="known-heads/said"):
    text: str


SAID: cf.Fold[tuple[str, ...]] = cf.Fold("known_heads_said", state=tuple[str, ...], initial=tuple)
SAID.on(Said)(lambda state, ev: (*state, f"{ev.payload.text}@{ev.position}"))


async def _gapped(store: RecordingStore) -> tuple[cf.Journal, tuple[Any, ...]]:
    """A journal whose state of ``s`` is cached at its first event, and a batch appended
    after a gap (another stream's append in between) that the journal could not fold in."""
    journal = cf.Journal(store)
    await journal.append("s", Said(text="a"))
    assert await journal.fold(SAID, "s") == ("a@1",)
    await journal.append("other", Said(text="x"))
    await journal.append("s", [Said(text="b"), Said(text="c")])
    events = (await store.inner.read("default", "s", after=None, types=None, limit=None)).events
    return journal, events


async def test_a_batch_the_store_says_follows_the_head_continues_the_state() -> None:
    store = RecordingStore(MemoryStore())
    journal, events = await _gapped(store)
    batch = events[1:]
    journal.folds.appended("default", "s", batch, previous=events[0].cursor)
    store.clear()
    assert await journal.fold(SAID, "s") == ("a@1", "b@2", "c@3")
    assert store.methods == ("head",)  # the head only: the state is current
    store.clear()
    state, _ = await journal.folds.read_with_cursor(
        SAID, "default", "s", known_head=batch[-1].cursor
    )
    assert state == ("a@1", "b@2", "c@3") and not store.calls


async def test_a_batch_the_store_says_follows_another_event_leaves_the_state_to_the_read() -> None:
    store = RecordingStore(MemoryStore())
    journal, events = await _gapped(store)
    # As after a delete and a new history as long: the event before the batch is another.
    journal.folds.appended("default", "s", events[1:], previous=str(int(events[0].cursor) + 1))
    store.clear()
    assert await journal.fold(SAID, "s") == ("a@1", "b@2", "c@3")
    assert store.events_read("s") == 2  # caught up by reading them


async def test_a_known_head_is_taken_as_it_is_and_another_one_reads() -> None:
    store = RecordingStore(MemoryStore())
    journal = cf.Journal(store)
    await journal.append("s", Said(text="a"))
    assert await journal.fold(SAID, "s") == ("a@1",)
    await journal.append("s", Said(text="b"))  # folded in: the state is at its head
    head = await journal.head("s")
    await cf.Journal(store.inner).append("s", Said(text="c"))  # another process's
    store.clear()
    state, _ = await journal.folds.read_with_cursor(SAID, "default", "s", known_head=head)
    assert state == ("a@1", "b@2") and not store.calls  # taken as the caller knows it
    newer = await journal.head("s")
    store.clear()
    state, _ = await journal.folds.read_with_cursor(SAID, "default", "s", known_head=newer)
    assert state == ("a@1", "b@2", "c@3") and list(store.methods) == ["read"]


async def test_a_known_head_at_a_read_states_last_event_needs_no_read() -> None:
    store = RecordingStore(MemoryStore())
    journal = cf.Journal(store)
    await cf.Journal(store.inner).append("s", [Said(text="a"), Said(text="b")])
    assert await journal.fold(SAID, "s") == ("a@1", "b@2")  # read, not folded in
    head = await journal.head("s")
    store.clear()
    state, _ = await journal.folds.read_with_cursor(SAID, "default", "s", known_head=head)
    assert state == ("a@1", "b@2") and not store.calls
    await cf.Journal(store.inner).append("s", Said(text="c"))
    newer = await journal.head("s")
    store.clear()
    state, _ = await journal.folds.read_with_cursor(SAID, "default", "s", known_head=newer)
    assert state == ("a@1", "b@2", "c@3") and list(store.methods) == ["read"]


async def test_a_known_version_at_a_states_last_event_needs_no_read() -> None:
    store = RecordingStore(MemoryStore())
    journal = cf.Journal(store)
    await cf.Journal(store.inner).append("s", [Said(text="a"), Said(text="b")])
    assert await journal.fold(SAID, "s") == ("a@1", "b@2")
    store.clear()
    state, _ = await journal.folds.read_with_cursor(SAID, "default", "s", known_version=2)
    assert state == ("a@1", "b@2") and not store.calls
    await cf.Journal(store.inner).append("s", Said(text="c"))
    state, _ = await journal.folds.read_with_cursor(SAID, "default", "s", known_version=3)
    assert state == ("a@1", "b@2", "c@3") and list(store.methods) == ["read"]


async def test_a_known_head_decides_over_a_known_version_after_a_recreate() -> None:
    """A stream deleted and made again by another writer reaches the cached state's version
    with other events: the head it is known at (global positions are never reused) says so."""
    store = RecordingStore(MemoryStore())
    journal = cf.Journal(store)
    await cf.Journal(store.inner).append("s", Said(text="old"))
    assert await journal.fold(SAID, "s") == ("old@1",)
    other = cf.Journal(store.inner)
    await other.delete_stream("s")
    remade = await other.append("s", Said(text="new"))
    state, _ = await journal.folds.read_with_cursor(
        SAID, "default", "s", known_version=1, known_head=remade.cursor
    )
    assert state == ("new@1",)
