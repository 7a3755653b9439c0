"""PostgreSQL appends with an expected version (one statement, one round trip): they land
only at that version, refuse anything else writing nothing (no stream row either), and
agree with the in-memory store on every sequence."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextfold.errors import WrongExpectedVersionError
from contextfold.events import Event
from contextfold.journal import Journal, open_journal


class Note(Event, type="test.expected/note"):
    n: int = 0


async def test_a_missing_stream_takes_only_expected_zero(pg_dsn: str) -> None:
    async with open_journal(pg_dsn) as journal:
        with pytest.raises(WrongExpectedVersionError) as caught:
            await journal.append("s", Note(), expected_version=3)
        assert (caught.value.expected, caught.value.actual) == (3, 0)
        assert await journal.list_streams() == ()  # no stream row left behind
        done = await journal.append("s", [Note(n=1), Note(n=2)], expected_version=0)
        assert (done.first_position, done.last_position) == (1, 2)
        with pytest.raises(WrongExpectedVersionError) as again:
            await journal.append("s", Note(n=3), expected_version=0)
        assert again.value.actual == 2
        assert [e.position for e in (await journal.read("s")).events] == [1, 2]
        assert (await journal.append("s", Note(n=3), expected_version=2)).version == 3


async def test_concurrent_appends_at_one_version_have_one_winner(pg_dsn: str) -> None:
    async with open_journal(pg_dsn) as first, open_journal(pg_dsn) as second:
        await first.append("s", Note())
        writers = enumerate([first, second] * 4)
        results = await asyncio.gather(
            *(j.append("s", Note(n=k), expected_version=1) for k, j in writers),
            return_exceptions=True,
        )
        refused = [r for r in results if isinstance(r, Exception)]
        assert len(refused) == len(results) - 1
        assert all(isinstance(r, WrongExpectedVersionError) for r in refused)
        assert await first.version("s") == 2


STEPS = st.lists(
    st.tuples(st.sampled_from([None, -1, 0, 1]), st.integers(1, 3)), min_size=1, max_size=12
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_outcomes_match_the_memory_store(pg_dsn: str, steps: list[tuple[int | None, int]]) -> None:
    """Appends expecting the version, one off or none: PostgreSQL says what memory says."""

    async def outcomes(journal: Journal, stream: str) -> list[object]:
        seen: list[object] = []
        for offset, size in steps:
            version = await journal.version(stream)
            expected = None if offset is None else max(version + offset, 0)
            try:
                done = await journal.append(
                    stream, [Note(n=k) for k in range(size)], expected_version=expected
                )
                seen.append(("ok", done.first_position, done.last_position))
            except WrongExpectedVersionError as exc:
                seen.append(("refused", exc.expected, exc.actual))
        seen.append(("version", await journal.version(stream)))
        return seen

    async def run() -> None:
        stream = f"s-{abs(hash(tuple(steps)))}"
        async with open_journal(pg_dsn) as pg, open_journal("memory://") as memory:
            assert await outcomes(pg, stream) == await outcomes(memory, stream)

    asyncio.run(run())
