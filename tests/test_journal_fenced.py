"""A fenced journal (``Journal.fenced``): one stream's appends go through its fence, and its
folds of that stream take where the fence knows the stream is, without asking the store;
everything else is the journal's own. How a lease holder fences its agent's appends."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

import contextfold as cf
from contextfold.events import NewEvent
from contextfold.journal import Journal, SyncJournal
from contextfold.store.base import AppendResult
from contextfold.store.memory import MemoryStore


class Said(cf.Event, type="test-journal-fenced/said"):
    text: str


SAID: cf.Fold[tuple[str, ...]] = cf.Fold("fenced_said", state=tuple[str, ...], initial=tuple)
SAID.on(Said)(lambda state, ev: (*state, ev.payload.text))


class Refused(Exception):
    pass


class Fence:
    """A fence that notes each batch it lets through (to the journal it was given), and
    refuses every append once closed."""

    def __init__(self, journal: Journal, stream: str) -> None:
        self.stream = stream
        self.journal = journal
        self.known: tuple[int, str | None] | None = None
        self.batches: list[dict[str, Any]] = []
        self.closed = False

    async def append(
        self,
        events: cf.Event | cf.RawEvent | NewEvent | Iterable[cf.Event | cf.RawEvent | NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
        run_id: str | None,
        actor: str | None,
        channels: Sequence[str],
    ) -> AppendResult:
        if self.closed:
            raise Refused(self.stream)
        self.batches.append(
            {
                "expected_version": expected_version,
                "idempotency_key": idempotency_key,
                "run_id": run_id,
                "actor": actor,
            }
        )
        return await self.journal.append(
            self.stream,
            events,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
            run_id=run_id,
            actor=actor,
            channels=channels,
        )


def _count_looks(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The streams of every head check and read of ``store`` from now on."""
    looks: list[str] = []
    for name in ("head", "read"):
        original = getattr(store, name)

        async def counting(
            namespace: str, stream: str, *args: Any, _o: Any = original, **kw: Any
        ) -> Any:
            looks.append(stream)
            return await _o(namespace, stream, *args, **kw)

        monkeypatch.setattr(store, name, counting)
    return looks


async def test_appends_to_the_fenced_stream_go_through_the_fence_and_only_those() -> None:
    journal = Journal(MemoryStore())
    fence = Fence(journal, "s")
    fenced = journal.fenced(fence)
    assert (fenced.fence, journal.fence) == (fence, None)
    await fenced.append("s", Said(text="a"), actor="agent", run_id="r")
    await fenced.append("t", Said(text="b"))  # another stream: the journal's own append
    assert fence.batches == [
        {"expected_version": None, "idempotency_key": None, "run_id": "r", "actor": "agent"}
    ]
    assert [await journal.fold(SAID, s) for s in ("s", "t")] == [("a",), ("b",)]
    fence.closed = True
    with pytest.raises(Refused):
        await fenced.append("s", Said(text="refused"))
    await fenced.append("t", Said(text="c"))
    assert await journal.fold(SAID, "s") == ("a",)
    # A checkpoint (and a compaction) appends through the fenced journal's append too.
    with pytest.raises(Refused):
        await fenced.checkpoint(SAID, "s", lambda state: state)


async def test_a_namespace_view_of_a_fenced_journal_is_not_fenced() -> None:
    journal = Journal(MemoryStore())
    fenced = journal.fenced(Fence(journal, "s"))
    other = fenced.with_namespace("other")
    assert other.fence is None
    await other.append("s", Said(text="a"))
    assert await journal.with_namespace("other").fold(SAID, "s") == ("a",)


async def test_folds_take_where_the_fence_knows_the_stream_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    journal = Journal(store)
    done = await journal.append("s", Said(text="a"))
    assert await journal.fold(SAID, "s") == ("a",)
    fence = Fence(journal, "s")
    fenced = journal.fenced(fence)
    looks = _count_looks(store, monkeypatch)
    fence.known = (done.version, done.cursor)
    assert await fenced.fold(SAID, "s") == ("a",)
    assert await fenced.fold_pair(SAID, SAID, "s") == (("a",), ("a",))
    assert looks == []  # the fence said where the stream is: nothing asked the store
    fence.known = None
    assert await fenced.fold(SAID, "s") == ("a",)
    assert await fenced.fold_pair(SAID, SAID, "s") == (("a",), ("a",))
    await fenced.fold(SAID, "t")
    assert looks == ["s", "s", "t"]


class CountingFence(Fence):
    """A fence that counts the looks at what it knows: a notification arriving between two
    looks moves a lease holder's."""

    def __init__(self, journal: Journal, stream: str, known: tuple[int, str | None]) -> None:
        super().__init__(journal, stream)
        self.looks = 0
        self._known = known

    @property
    def known(self) -> tuple[int, str | None] | None:
        self.looks += 1
        return self._known

    @known.setter
    def known(self, value: tuple[int, str | None] | None) -> None:
        self._known = value  # type: ignore[assignment]


async def test_a_fold_pair_folds_both_through_one_look_at_the_fence() -> None:
    journal = Journal(MemoryStore())
    done = await journal.append("s", Said(text="a"))
    fence = CountingFence(journal, "s", (done.version, done.cursor))
    fenced = journal.fenced(fence)
    assert await fenced.fold_pair(SAID, SAID, "s") == (("a",), ("a",))
    assert fence.looks == 1  # both folds through where the fence stood at that one look


def test_the_sync_journal_fences_on_its_loop() -> None:
    with cf.open_journal_sync("memory://") as journal:
        assert isinstance(journal, SyncJournal) and journal.fence is None
        fence = Fence(journal.journal, "s")
        fenced = journal.fenced(fence)
        assert fenced.fence is fence
        fenced.append("s", Said(text="a"))
        assert len(fence.batches) == 1
        assert journal.fold(SAID, "s") == ("a",)
