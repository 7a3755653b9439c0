"""The conversion memo of ContextMiddleware (its oracle): over any sequence of histories, the
memo's conversions equal fresh ones, whatever was appended, replaced under the same id,
changed in place (attributes and nested values), marked untrusted, or evicted."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from contextfold.context.calls import message_digest
from contextfold.integrations._langchain_calls import Conversions, convert
from contextfold.integrations.langgraph import untrusted

_IDS = st.sampled_from(["a", "b", "c", "d", "e", None])
_TEXT = st.text(alphabet="xyz ", max_size=12)


@st.composite
def messages(draw: st.DrawFn) -> BaseMessage:
    kind = draw(st.sampled_from(["human", "ai", "tool", "system", "marked"]))
    text, id = draw(_TEXT), draw(_IDS)
    if kind == "human":
        return HumanMessage(text, id=id)
    if kind == "ai":
        calls = [{"name": "t", "args": {"p": draw(_TEXT)}, "id": draw(_TEXT)}]
        return AIMessage(text, id=id, tool_calls=calls if draw(st.booleans()) else [])
    if kind == "tool":
        return ToolMessage(text, id=id, tool_call_id=draw(_TEXT))
    message = SystemMessage(text, id=id)
    return untrusted(message, actor="webhook") if kind == "marked" else message


def _mutate(message: BaseMessage, how: int, text: str) -> None:
    """Change ``message`` in place, as code holding a reference to it may."""
    if how == 0:
        message.content = text
    elif how == 1:
        message.additional_kwargs["note"] = text
    elif how == 2 and isinstance(message, AIMessage) and message.tool_calls:
        message.tool_calls[0]["args"]["p"] = text
    elif how == 3:
        message.response_metadata["seen"] = [text]
    else:
        message.name = text


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), messages()),
        st.tuples(st.just("replace"), st.integers(0, 20), messages()),
        st.tuples(st.just("mutate"), st.integers(0, 20), st.integers(0, 4), _TEXT),
        st.tuples(st.just("drop"), st.integers(0, 20)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(_STEPS, st.booleans(), st.integers(1, 4))
def test_the_memo_equals_a_fresh_conversion(
    steps: list[tuple[Any, ...]], counted: bool, size: int
) -> None:
    def count(message: BaseMessage) -> float:
        return float(len(str(message.content)) + 1)

    counter = count if counted else None
    memo = Conversions(counter, size=size)
    history: list[BaseMessage] = []
    for step in steps:
        if step[0] == "append":
            history.append(step[1])
        elif history and step[0] == "replace":
            at = step[1] % len(history)
            replacement = step[2].model_copy(update={"id": history[at].id})
            history[at] = replacement
        elif history and step[0] == "mutate":
            _mutate(history[step[1] % len(history)], step[2], step[3])
        elif history and step[0] == "drop":
            del history[step[1] % len(history)]
        converted = memo(history)
        assert converted == [convert(m, counter) for m in history]
        for done in converted:  # the digest it carries is the digest of its JSON
            assert done.sha256 == done.message.sha256 == message_digest(done.message.json)
