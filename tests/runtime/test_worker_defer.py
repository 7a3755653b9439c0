"""Streams stay with their worker: a stream another worker handed back is left to it for
``defer`` seconds once it has work again (it hears of the change too and has the stream's
folds in memory), so two workers do not race for every trigger; after that, any worker
claims it, so the streams of a worker that is gone move on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contextfold.errors import ConfigurationError
from contextfold.journal import Journal, open_journal
from contextfold.runtime.lease import StreamLeased
from contextfold.runtime.worker import Worker
from tests.runtime.helpers import answered, echo_app, eventually, new_agent_stream, running, user

FAST: dict[str, Any] = {"poll_interval": 0.02}
STREAMS = [f"chat/{n}" for n in range(4)]


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'w.db'}"
    async with open_journal(url) as opened:
        yield opened


async def _all_answered(journal: Journal) -> bool:
    return all([await answered(journal, s) for s in STREAMS])


async def _holders(journal: Journal) -> set[str]:
    return {
        StreamLeased.model_validate_json(stored.data).holder
        for stream in STREAMS
        async for stored in journal.read_all(stream, types=[StreamLeased])
    }


async def test_a_stream_handed_back_is_left_to_its_worker(journal: Journal) -> None:
    for stream in STREAMS:
        await new_agent_stream(journal, stream)
    first = Worker(journal, echo_app(), holder="first", defer=60, **FAST)
    second = Worker(journal, echo_app(), holder="second", defer=60, **FAST)
    async with running(first):
        await eventually(lambda: _all_answered(journal), what="first answers")
        async with running(second):
            for k in range(3):
                for stream in STREAMS:
                    await journal.append(stream, user(f"again {k}"))
                await eventually(lambda: _all_answered(journal), what=f"round {k} answered")
    assert await _holders(journal) == {"first"}
    assert second.stats.claims == 0 and second.stats.lost == 0
    assert first.stats.lost == 0


async def test_once_its_time_is_up_another_worker_claims_it(journal: Journal) -> None:
    for stream in STREAMS:
        await new_agent_stream(journal, stream)
    async with running(Worker(journal, echo_app(), holder="gone", **FAST)):
        await eventually(lambda: _all_answered(journal), what="answered before it went")
    for stream in STREAMS:
        await journal.append(stream, user("anyone?"))
    heir = Worker(journal, echo_app(), holder="heir", defer=0.2, **FAST)
    async with running(heir):
        await eventually(lambda: _all_answered(journal), what="taken over after the deferral")
    assert await _holders(journal) == {"gone", "heir"}
    assert heir.stats.claims == len(STREAMS)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "1"])
async def test_a_bad_deferral_is_refused(bad: object) -> None:
    async with open_journal("memory://") as journal:
        with pytest.raises(ConfigurationError, match="defer"):
            Worker(journal, echo_app(), defer=bad)  # type: ignore[arg-type]
