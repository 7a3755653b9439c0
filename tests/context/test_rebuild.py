"""Rebuilding and verifying recorded requests from a journal: same bytes in any process,
whatever is registered or appended later, at a cost that grows with the history only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import contextfold as cf
from contextfold.context import (
    Actor,
    AgentContext,
    ContextAdded,
    LlmRequestRequested,
    RequestHeader,
    build_request,
    register_actor_type,
    summary_item,
)
from contextfold.context.rebuild import (
    RequestRecorded,
    rebuild_request,
    rebuild_state,
    verify_requests,
)
from contextfold.context.trust import trusted_extensions
from contextfold.testing import RecordingStore
from contextfold.wire import render_request
from tests.context.helpers import HEADER

STREAM = "agent"


async def _request(journal: cf.Journal, header: RequestHeader | None = HEADER) -> int:
    """Append a request and its record (the hash of what the fold renders, as sent)."""
    offset = (await journal.append(STREAM, LlmRequestRequested(header=header))).first_position
    state = await journal.fold(AgentContext, STREAM)
    assert state.header is not None
    rendered = render_request(build_request(state, through=offset), state.header.transport)
    record = RequestRecorded(
        request_offset=offset,
        transport=rendered.transport,
        sha256=rendered.sha256,
        size=len(rendered.body),
    )
    await journal.append(STREAM, record)
    return offset


async def _session(journal: cf.Journal, requests: int) -> list[int]:
    """A session whose requests each see a different projection (updates, compaction)."""
    await journal.append(STREAM, ContextAdded(role="system", key="agent/system-prompt"))
    offsets = []
    for turn in range(requests):
        await journal.append(
            STREAM,
            [
                ContextAdded(role="user", content=f"question {turn}", actor=Actor(type="user")),
                ContextAdded(role="developer", key="status", content=f"status {turn}"),
            ],
        )
        offsets.append(await _request(journal))
        if turn == requests // 2:
            await journal.append(STREAM, summary_item(f"summary of {turn}", cutoff=offsets[-1]))
    return offsets


def _wire_roles(body: bytes) -> dict[str, str]:
    """Content -> wire role of an openai-chat body."""
    return {m["content"]: m["role"] for m in json.loads(body)["messages"]}


# -- trust is read from the journal ---------------------------------------------------


async def test_registering_a_type_later_does_not_change_a_sent_request() -> None:
    async with cf.open_journal("memory://") as journal:
        await journal.append(
            STREAM, ContextAdded(role="developer", content="from crm", actor=Actor(type="late-crm"))
        )
        header = HEADER.model_copy(update={"trusted_actor_types": trusted_extensions()})
        first = await _request(journal, header)
        before = await rebuild_request(journal, STREAM, first)
        assert _wire_roles(before.body)["@1 actor=late-crm\nfrom crm"] == "user"

        register_actor_type("late-crm", trusted=True)
        assert (await rebuild_request(journal, STREAM, first)).body == before.body
        # A request made after the registration records it and trusts the type.
        header = HEADER.model_copy(update={"trusted_actor_types": trusted_extensions()})
        second = await _request(journal, header)
        after = await rebuild_request(journal, STREAM, second)
        assert _wire_roles(after.body)["@1 actor=late-crm\nfrom crm"] == "developer"
        assert await verify_requests(journal, STREAM) == ()


_REBUILD = """
import asyncio, sys
import contextfold as cf

async def main() -> None:
    async with cf.open_journal(sys.argv[1]) as journal:
        rendered = await cf.rebuild_request(journal, "agent", int(sys.argv[2]))
        sys.stdout.write(rendered.body.hex())

asyncio.run(main())
"""


async def test_a_rebuild_in_another_process_gives_the_same_bytes(tmp_path: Path) -> None:
    """The child process never registers the trusted type: the header carries the trust."""
    register_actor_type("crm-sync", trusted=True)
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    async with cf.open_journal(url) as journal:
        await journal.append(
            STREAM, ContextAdded(role="developer", content="deal won", actor=Actor(type="crm-sync"))
        )
        header = HEADER.model_copy(update={"trusted_actor_types": trusted_extensions()})
        offset = await _request(journal, header)
        here = await rebuild_request(journal, STREAM, offset)
    assert _wire_roles(here.body)["@1 actor=crm-sync\ndeal won"] == "developer"
    child = subprocess.run(
        [sys.executable, "-c", _REBUILD, url, str(offset)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert bytes.fromhex(child.stdout) == here.body


# -- cost -------------------------------------------------------------------------------


async def test_rebuild_state_reads_only_the_context_fold_events() -> None:
    store = RecordingStore()
    journal = cf.Journal(store)
    offsets = await _session(journal, 3)
    store.clear()
    state = await rebuild_state(journal, STREAM, offsets[1])
    assert state.request_offset == offsets[1]
    assert store.reads and {r.types for r in store.reads} == {tuple(AgentContext.event_types)}


async def test_verify_reads_the_stream_once_whatever_the_number_of_requests() -> None:
    store = RecordingStore()
    journal = cf.Journal(store)
    offsets = await _session(journal, 40)
    store.clear()
    assert await verify_requests(journal, STREAM) == ()
    assert len(store.reads) <= 2  # the records, then the context events: not one per request
    # The same answers as rebuilding each request on its own.
    recorded = {}
    async for stored in journal.read_all(STREAM, types=[RequestRecorded]):
        record = stored.decode(RequestRecorded)
        assert isinstance(record, RequestRecorded)
        recorded[record.request_offset] = record.sha256
    assert sorted(recorded) == offsets
    for offset in offsets:
        assert (await rebuild_request(journal, STREAM, offset)).sha256 == recorded[offset]


async def test_verify_reports_drift_at_the_right_offsets_in_one_pass() -> None:
    async with cf.open_journal("memory://") as journal:
        offsets = await _session(journal, 6)
        wrong = "0" * 64
        user_item = offsets[2] - 2  # the user item before the third request
        for offset in (offsets[4], user_item, 10_000, offsets[0]):
            await journal.append(
                STREAM,
                RequestRecorded(
                    request_offset=offset, transport="openai-chat", sha256=wrong, size=1
                ),
            )
        drifts = await verify_requests(journal, STREAM)
        assert [d.request_offset for d in drifts] == sorted(
            [offsets[0], user_item, offsets[4], 10_000]
        )
        by_offset = {d.request_offset: d for d in drifts}
        for offset in (offsets[0], offsets[4]):
            rebuilt = (await rebuild_request(journal, STREAM, offset)).sha256
            assert by_offset[offset].rebuilt == rebuilt and by_offset[offset].error is None
        for offset in (user_item, 10_000):
            assert by_offset[offset].rebuilt is None
            assert "not a model request" in (by_offset[offset].error or "")
