"""Verification streams: RequestVerifier yields each drift as its record is read, in one
pass holding two requests, with counts in O(1); it finds what per-request rebuilds find,
under changing headers too, and builds each item once however many requests see it."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.context import (
    Actor,
    AgentContext,
    ContextAdded,
    LlmRequestRequested,
    RequestHeader,
    build_request,
    rebuild,
    summary_item,
)
from contextfold.context.rebuild import (
    RequestDrift,
    RequestRecorded,
    RequestVerifier,
    rebuild_manifest,
    rebuild_request,
    verify_requests,
)
from contextfold.errors import RebuildError
from contextfold.events import Event, StoredEvent
from contextfold.wire import render_request
from tests.context.helpers import count_item_builds

STREAM = "agent"
HEADER = RequestHeader(transport="openai-chat", model="gpt-4o", max_tokens=512)
# Headers that each render the same items differently (or on another transport): a request
# built from the previous one's messages would show it.
HEADERS = (
    HEADER,
    HEADER.model_copy(update={"content_limit": 4}),
    HEADER.model_copy(update={"developer_role": False}),
    HEADER.model_copy(update={"system_prompt": "Be brief."}),
    HEADER.model_copy(update={"transport": "anthropic"}),
)
WRONG = "0" * 64


def _record(offset: int, sha256: str) -> RequestRecorded:
    return RequestRecorded(request_offset=offset, transport="openai-chat", sha256=sha256, size=1)


async def _request(
    journal: cf.Journal, *, recorded: bool = True, header: RequestHeader = HEADER
) -> int:
    """A user item, then a request and (unless not) its record, as the runtime sends it."""
    await journal.append(
        STREAM, ContextAdded(role="user", content="a question", actor=Actor(type="user"))
    )
    offset = (await journal.append(STREAM, LlmRequestRequested(header=header))).first_position
    if recorded:
        state = await journal.fold(AgentContext, STREAM)
        body = render_request(build_request(state, through=offset), header.transport)
        await journal.append(STREAM, _record(offset, body.sha256))
    return offset


async def _session(journal: cf.Journal, requests: int, *, compact_every: int = 0) -> list[int]:
    await journal.append(STREAM, ContextAdded(role="system", key="agent/system-prompt"))
    offsets = []
    for turn in range(requests):
        offsets.append(await _request(journal))
        if compact_every and turn % compact_every == compact_every - 1:
            await journal.append(STREAM, summary_item(f"summary {turn}", cutoff=offsets[-1]))
    return offsets


async def _streamed(journal: Any) -> tuple[list[RequestDrift], cf.VerifySummary]:
    verifier = RequestVerifier(journal, STREAM)
    drifts = [drift async for drift in verifier]
    return drifts, verifier.summary


async def _expected(journal: cf.Journal) -> tuple[list[RequestDrift], int, int]:
    """What rebuilding each recorded request on its own gives: the drifts by offset (each
    distinct record once, first where it is recorded), the distinct offsets, the records."""
    recorded: dict[int, dict[tuple[str, str | None], int]] = {}
    records = 0
    async for stored in journal.read_all(STREAM, types=[RequestRecorded]):
        record = stored.decode(RequestRecorded)
        assert isinstance(record, RequestRecorded)
        records += 1
        manifest = record.manifest.hash if record.manifest else None
        seen = recorded.setdefault(record.request_offset, {})
        seen.setdefault((record.sha256, manifest), stored.position)
    drifts = []
    for offset in sorted(recorded):
        try:
            rebuilt: str | None = (await rebuild_request(journal, STREAM, offset)).sha256
            error = None
        except RebuildError as exc:
            rebuilt, error = None, str(exc)
        rebuilt_manifest = await rebuild_manifest(journal, STREAM, offset)
        hashed = rebuilt_manifest.hash if rebuilt_manifest is not None else None
        for (sha256, recorded_manifest), position in recorded[offset].items():
            if sha256 != rebuilt or recorded_manifest != hashed:
                drifts.append(RequestDrift(offset, sha256, rebuilt, error, position))
    return drifts, len(recorded), records


def _plain(drifts: Sequence[RequestDrift]) -> list[tuple[int, str, str | None, str | None]]:
    return [(d.request_offset, d.recorded, d.rebuilt, d.error) for d in drifts]


def _by_offset(drifts: Sequence[RequestDrift]) -> list[RequestDrift]:
    return sorted(drifts, key=lambda d: (d.request_offset, d.recorded_at or 0))


class _Watching:
    """A reader passing events through that remembers the last position it handed out, and
    calls ``each()`` as it hands out an event."""

    def __init__(self, journal: cf.Journal, each: Any = None) -> None:
        self.journal = journal
        self.position = 0
        self.each = each

    async def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]:
        async for event in self.journal.read_all(
            stream, after=after, types=types, page_size=page_size
        ):
            self.position = event.position
            if self.each is not None:
                self.each()
            yield event


# -- the same drifts as rebuilding each request ------------------------------------------


async def test_the_verifier_finds_the_hand_written_drifts_with_their_counts() -> None:
    async with cf.open_journal("memory://") as journal:
        offsets = await _session(journal, 6, compact_every=3)
        user_item = offsets[2] - 1  # the user item of the third request: no request
        for offset in (offsets[4], user_item, 10_000, offsets[0], offsets[4]):
            await journal.append(STREAM, _record(offset, WRONG))
        drifts, summary = await _streamed(journal)
        expected, requests, records = await _expected(journal)
        assert _by_offset(drifts) == expected
        assert list(await verify_requests(journal, STREAM)) == expected
        assert [d.request_offset for d in expected] == [
            offsets[0],
            user_item,
            offsets[4],
            10_000,
        ]
        assert (summary.requests, summary.records, summary.drifts) == (8, 11, 4)
        assert requests == 8 and records == 11
        assert summary.first_drift == drifts[0]
        sizes = [len((await rebuild_request(journal, STREAM, n)).body) for n in offsets]
        assert summary.largest == max(sizes)


# Steps of a session: a recorded request, one with another header, an unrecorded one, a
# compaction through the latest request, or a record appended now naming an earlier request,
# a position that is no request or one past the end, with its right hash or a wrong one.
steps = st.lists(
    st.one_of(
        st.just(("request",)),
        st.tuples(st.just("header"), st.sampled_from(HEADERS)),
        st.just(("unrecorded",)),
        st.just(("compact",)),
        st.tuples(
            st.just("record"),
            st.sampled_from(["request", "latest", "item", "future"]),
            st.integers(min_value=0, max_value=50),
            st.booleans(),
        ),
    ),
    min_size=1,
    max_size=14,
)


async def _play(journal: cf.Journal, plan: list[tuple[Any, ...]]) -> None:
    await journal.append(STREAM, ContextAdded(role="system", key="agent/system-prompt"))
    requests: list[int] = []
    for step in plan:
        if step[0] in ("request", "unrecorded"):
            requests.append(await _request(journal, recorded=step[0] == "request"))
        elif step[0] == "header":
            requests.append(await _request(journal, header=step[1]))
        elif step[0] == "compact":
            if requests:
                await journal.append(STREAM, summary_item("summary", cutoff=requests[-1]))
        else:
            _, target, pick, right = step
            version = await journal.version(STREAM)
            if target in ("request", "latest") and requests:
                offset = requests[-1] if target == "latest" else requests[pick % len(requests)]
            elif target == "future":
                offset = version + 1 + pick % 3
            else:
                offset = 1 + pick % version
            sha256 = WRONG
            if right and offset in requests:
                sha256 = (await rebuild_request(journal, STREAM, offset)).sha256
            await journal.append(STREAM, _record(offset, sha256))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_streamed_drifts_are_those_of_rebuilding_each_request(plan: list[tuple[Any, ...]]) -> None:
    async def main() -> None:
        async with cf.open_journal("memory://") as journal:
            await _play(journal, plan)
            drifts, summary = await _streamed(journal)
            expected, requests, records = await _expected(journal)
            assert _plain(_by_offset(drifts)) == _plain(expected)
            assert _plain(await verify_requests(journal, STREAM)) == _plain(expected)
            assert (summary.requests, summary.records, summary.drifts) == (
                requests,
                records,
                len(expected),
            )
            assert summary.first_drift == (drifts[0] if drifts else None)
            recorded_at = {
                (stored.position, stored.payload["request_offset"], stored.payload["sha256"])
                async for stored in journal.read_all(STREAM, types=[RequestRecorded])
            }
            for drift in drifts:  # each names a record of its request, with its hash
                assert (drift.recorded_at, drift.request_offset, drift.recorded) in recorded_at

    asyncio.run(main())


# -- one pass, as it goes -----------------------------------------------------------------


async def test_a_drift_is_yielded_with_its_position_before_the_stream_is_read() -> None:
    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, ContextAdded(role="system", key="agent/system-prompt"))
        first = await _request(journal)
        tampered = await _request(journal, recorded=False)
        await journal.append(STREAM, _record(tampered, WRONG))
        for _ in range(30):
            await _request(journal)
        version = await journal.version(STREAM)
        watching = _Watching(journal)
        verifier = RequestVerifier(watching, STREAM)
        drift = await anext(verifier)
        assert drift.request_offset == tampered and drift.recorded == WRONG
        assert drift.recorded_at == tampered + 1 and drift.error is None
        assert drift.rebuilt == (await rebuild_request(journal, STREAM, tampered)).sha256
        assert watching.position == tampered + 1 < version  # the rest is not read yet
        assert verifier.summary.requests == 2 and verifier.summary.first_drift == drift
        assert first < tampered
        assert [d async for d in verifier] == []
        assert verifier.summary.requests == 32 and verifier.summary.drifts == 1
        assert watching.position == version


async def test_a_verifier_closed_early_closes_its_read() -> None:
    async with cf.open_journal("memory://") as journal:
        offsets = await _session(journal, 3)
        await journal.append(STREAM, _record(offsets[0], WRONG))
        verifier = RequestVerifier(journal, STREAM)
        await verifier.aclose()
        with pytest.raises(StopAsyncIteration):
            await anext(verifier)


async def test_the_record_and_check_of_a_checked_request_are_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However many requests, the verifier holds the records and the check (the rebuilt
    hash) of the latest one only: each is dropped once the next request is read (verify
    kept every record)."""
    alive: dict[str, list[weakref.ref[Any]]] = {"_Record": [], "_Check": []}

    def tracked(name: str) -> type:
        base: Any = getattr(rebuild, name)

        class Tracked(base):  # type: ignore[misc]  # no slots: it takes weak references
            def __init__(self, *fields: Any) -> None:
                super().__init__(*fields)
                alive[name].append(weakref.ref(self))

        return Tracked

    for name in alive:
        monkeypatch.setattr(rebuild, name, tracked(name))
    held: dict[str, list[int]] = {name: [] for name in alive}

    def count() -> None:  # neither holds a cycle: a dropped one is gone at once
        for name, refs in alive.items():
            held[name].append(sum(ref() is not None for ref in refs))

    async with cf.open_journal("memory://") as journal:
        offsets = await _session(journal, 60, compact_every=7)
        await journal.append(STREAM, _record(offsets[-1], WRONG))  # a retry's record
        drifts, summary = await _streamed(_Watching(journal, count))
    assert len(alive["_Record"]) == 61 and len(alive["_Check"]) == 60
    assert summary.requests == 60 and [d.request_offset for d in drifts] == [offsets[-1]]
    assert max(held["_Record"]) <= 2 and max(held["_Check"]) <= 1, held


@pytest.mark.parametrize("late", [False, True])
async def test_each_item_is_built_once_however_many_requests_see_it(
    monkeypatch: pytest.MonkeyPatch, late: bool
) -> None:
    """A request is rebuilt from the one checked before it: the verification builds each
    history item once (a fresh build per request built 465 for 30 requests). Records that
    come after the stream (written by hand) are checked after the pass: the pass builds the
    latest request, the second pass the 29 before it, one item each."""
    async with cf.open_journal("memory://") as journal:
        offsets = await _session(journal, 30) if not late else []
        if late:
            await journal.append(STREAM, ContextAdded(role="system", key="agent/system-prompt"))
            offsets = [await _request(journal, recorded=False) for _ in range(30)]
            for offset in offsets:
                sha256 = (await rebuild_request(journal, STREAM, offset)).sha256
                await journal.append(STREAM, _record(offset, sha256))
        built = count_item_builds(monkeypatch)
        drifts, summary = await _streamed(journal)
    assert drifts == [] and summary.requests == 30
    assert len(built) == (30 + 29 if late else 30)
