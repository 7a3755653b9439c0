"""A pending (lazy) claim against a holder that is alive after all: until the claim lands,
the lease it judged lapsed is still the stream's newest, so that holder (paused past its
expiry and woken, or on a host whose clock is behind) may still append. A pending claim
that finds a record of an agent or of its tools after its version loses, nothing written
(what it decided from before that record may be done already: a tool call run); a user's
message it catches up on, as any holder does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from contextfold.context.state import AGENT_WRITER, TOOL_WRITER
from contextfold.errors import LeaseLostError
from contextfold.journal import Journal, open_journal
from contextfold.runtime.lease import claim_lease, read_lease
from tests.runtime.helpers import STREAM, user


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def journal() -> AsyncIterator[Journal]:
    async with open_journal("memory://") as opened:
        yield opened


@pytest.mark.parametrize("writer", [AGENT_WRITER, TOOL_WRITER])
async def test_a_pending_claim_loses_to_a_record_of_the_holder_it_judged_lapsed(
    journal: Journal, writer: str
) -> None:
    await journal.append(STREAM, user("hi"))
    behind, ahead = Clock(), Clock()
    ahead.now += timedelta(seconds=11)  # a host whose clock reads the lease as lapsed
    old = await claim_lease(journal, STREAM, holder="w1", ttl=10, clock=behind)
    new = await claim_lease(journal, STREAM, holder="w2", ttl=10, clock=ahead, lazy=True)
    await old.journal.append(STREAM, user("a tool call started"), actor=writer)  # still held
    version = await journal.version(STREAM)
    with pytest.raises(LeaseLostError, match=f"lease holder's {writer} at @{version}"):
        await new.journal.append(STREAM, user("the same tool call started again"))
    assert new.lost and await journal.version(STREAM) == version  # nothing written
    record = await read_lease(journal, STREAM)
    assert record is not None and record.holder == "w1"
    await old.journal.append(STREAM, user("the live holder goes on"), actor=writer)


async def test_a_pending_claim_catches_up_on_a_users_message(journal: Journal) -> None:
    await journal.append(STREAM, user("hi"))
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    await journal.append(STREAM, user("and another thing"))
    done = await lease.journal.append(STREAM, user("answered"), actor=AGENT_WRITER)
    assert done.first_position == 3 and not lease.pending
    record = await read_lease(journal, STREAM)
    assert record is not None and record.token == lease.token
