"""Journals written by an earlier release still fold and rebuild byte for byte.

The files in ``legacy/`` were written by the demo session (one per transport) before the
wire model, the provider modules and the trust rules were reworked; they are never
regenerated. Each recorded request must rebuild to the exact hash recorded when it was sent.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import contextfold as cf

LEGACY = Path(__file__).parent / "legacy"
STREAM = "demo/coding-session"


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses", "anthropic"])
async def test_a_legacy_journal_rebuilds_every_recorded_request(
    transport: str, tmp_path: Path
) -> None:
    db = tmp_path / "journal.sqlite3"
    shutil.copyfile(LEGACY / f"journal-{transport}.sqlite3", db)  # never write the fixture
    async with cf.open_journal(f"sqlite:///{db}") as journal:
        records: list[cf.RequestRecorded] = []
        async for event in journal.read_all(STREAM, types=[cf.RequestRecorded]):
            record = event.decode(cf.RequestRecorded)
            assert isinstance(record, cf.RequestRecorded)
            records.append(record)
        assert len(records) >= 5
        assert {record.transport for record in records} == {transport}
        assert await cf.verify_requests(journal, STREAM) == ()
        for record in records:
            rebuilt = await cf.rebuild_request(journal, STREAM, record.request_offset)
            assert rebuilt.sha256 == record.sha256
            assert len(rebuilt.body) == record.size
        state = await journal.fold(cf.AgentContext, STREAM)
        assert state.compacted_through > 0  # the demo compacts: the summary path is covered
