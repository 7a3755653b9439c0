"""Framework ids become stream name parts one way for every integration: reversibly
escaped, never holding a separator or whitespace."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.errors import InvalidStreamNameError
from contextfold.integrations import adk, openai_agents
from contextfold.integrations._stream_names import stream_part
from contextfold.journal.encode import MAX_NAME_LENGTH

_ids = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=24)


@given(part=_ids)
def test_a_part_is_one_printable_segment_that_gives_the_id_back(part: str) -> None:
    escaped = stream_part(part)
    assert "/" not in escaped and escaped.isprintable()
    assert not any(ch.isspace() for ch in escaped)
    assert unquote(escaped, errors="strict") == part  # distinct ids, distinct parts


@given(app=_ids, user=_ids, session=_ids)
def test_both_integrations_name_their_streams_with_it(app: str, user: str, session: str) -> None:
    parts = "/".join(stream_part(p) for p in (app, user, session))
    expected = f"adk/session/{parts}"
    if len(expected) <= MAX_NAME_LENGTH:
        assert adk.session_stream(app, user, session) == expected
    else:
        with pytest.raises(InvalidStreamNameError, match="no usable stream name"):
            adk.session_stream(app, user, session)
    named = f"openai-agents/session/{stream_part(session)}"
    if len(named) <= MAX_NAME_LENGTH:
        assert openai_agents.session_stream(session) == named
    else:
        with pytest.raises(InvalidStreamNameError, match="makes no stream"):
            openai_agents.session_stream(session)
