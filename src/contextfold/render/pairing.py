"""Tool pairing, checked the same way for every transport.

Each tool call must be answered by exactly one later ``tool`` message and every result
must answer an earlier call; results are moved up to directly follow their call (messages
that arrived in between keep their order after the results), which is what every
provider requires.
"""

from __future__ import annotations

from ..errors import RenderError
from ..wire import NeutralMessage

__all__ = ["order_tool_results"]


def order_tool_results(messages: tuple[NeutralMessage, ...]) -> tuple[NeutralMessage, ...]:
    """Messages with each call's result moved to directly follow its assistant message.

    Results keep their relative order; messages between a call and its result keep
    their order after the results. Raises RenderError naming the tool_call_id when a
    call is unanswered, a result answers no earlier call, or an id is used twice.
    """
    call_at: dict[str, int] = {}
    for index, message in enumerate(messages):
        for call in message.tool_calls:
            if call.id in call_at:
                raise RenderError(
                    f"tool_call_id {call.id!r} is used by two calls "
                    f"(messages {call_at[call.id]} and {index}); call ids must be unique"
                )
            call_at[call.id] = index
    results: dict[int, list[int]] = {}
    answered: dict[str, int] = {}
    for index, message in enumerate(messages):
        if message.role != "tool":
            continue
        call_id = message.tool_call_id
        assert call_id is not None  # NeutralMessage guarantees it for role tool
        if call_id not in call_at or call_at[call_id] > index:
            raise RenderError(
                f"message {index}: tool result for tool_call_id {call_id!r} answers no "
                "earlier tool call; append the assistant call before its result"
            )
        if call_id in answered:
            raise RenderError(
                f"tool_call_id {call_id!r} is answered twice (messages "
                f"{answered[call_id]} and {index}); keep exactly one result per call"
            )
        answered[call_id] = index
        results.setdefault(call_at[call_id], []).append(index)
    unanswered = [call_id for call_id in call_at if call_id not in answered]
    if unanswered:
        raise RenderError(
            f"tool_call_id {unanswered[0]!r} (message {call_at[unanswered[0]]}) has no tool "
            "result; answer every tool call before requesting the model"
        )
    ordered: list[NeutralMessage] = []
    for index, message in enumerate(messages):
        if message.role == "tool":
            continue
        ordered.append(message)
        ordered.extend(messages[i] for i in results.get(index, ()))
    return tuple(ordered)
