"""What the surfaces share about a journal: an unknown stream's message names the closest
stream names among all of them, however many pages the listing takes."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold.errors import UnknownStreamError
from contextfold.inspection import require_stream
from contextfold.journal import Journal
from contextfold.store.memory import MemoryStore


async def test_an_unknown_stream_is_matched_against_streams_past_the_first_page() -> None:
    journal = Journal(MemoryStore())
    for name in [*(f"a/{n}" for n in range(5)), "zeta/chat"]:
        await journal.append(name, cf.RawEvent("note", {}))
    assert await require_stream(journal, "zeta/chat", page_size=2) == 1
    with pytest.raises(UnknownStreamError, match="did you mean 'zeta/chat'") as caught:
        await require_stream(journal, "zeta/chta", where="here", page_size=2)
    assert caught.value.suggestions == ("zeta/chat",)
    assert str(caught.value).startswith("no stream 'zeta/chta' in here:")
