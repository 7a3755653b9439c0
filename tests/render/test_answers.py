"""Provider answers read by each provider module: text, tool calls and usage, whole and streamed.

The payloads in ``payloads/`` are shaped like recorded provider answers and are checked
against the official SDKs' own types before they are read, as the clients get them. Usage
has one meaning for every provider (see ``contextfold.wire``): the whole prompt as input,
cache reads and writes as its parts, every generated token as output, reasoning its part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anthropic.types import Message, MessageDeltaUsage, RawMessageStreamEvent
from anthropic.types import Usage as AnthropicUsage
from hypothesis import given
from hypothesis import strategies as st
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent, ResponseUsage
from pydantic import TypeAdapter

from contextfold.render import anthropic, openai_chat, openai_responses
from contextfold.wire import ModelOutput, ToolCall, Usage

PAYLOADS = Path(__file__).parent / "payloads"


def payload(name: str) -> Any:
    return json.loads((PAYLOADS / f"{name}.json").read_text(encoding="utf-8"))


def events(name: str, sdk_type: Any) -> list[Any]:
    """The stream's events as the SDK types them (``[DONE]`` and pings are the SDK's own)."""
    adapter = TypeAdapter(sdk_type)
    return [
        adapter.validate_python(event["data"])
        for event in payload(name)
        if isinstance(event["data"], dict) and event["event"] != "ping"
    ]


def read(reader: Any, stream: list[Any]) -> tuple[list[tuple[str, str]], ModelOutput | None]:
    deltas = [delta for event in stream for delta in reader.feed(event)]
    return deltas, reader.result()


# -- OpenAI Chat Completions ------------------------------------------------------------------


def test_openai_chat_answer() -> None:
    raw = payload("openai-chat")
    output = openai_chat.parse_response(ChatCompletion.model_validate(raw))
    usage = raw["usage"]
    assert output.usage == Usage(
        input_tokens=usage["prompt_tokens"],  # already the whole prompt, cached part included
        output_tokens=usage["completion_tokens"],  # reasoning included
        cached_input_tokens=usage["prompt_tokens_details"]["cached_tokens"],
        cache_write_tokens=None,  # not reported in this answer
        reasoning_tokens=usage["completion_tokens_details"]["reasoning_tokens"],
    )
    assert output.usage.uncached_input_tokens == 2310 - 2048
    (call,) = raw["choices"][0]["message"]["tool_calls"]
    assert output.tool_calls == (
        ToolCall(id=call["id"], name="read_file", arguments=call["function"]["arguments"]),
    )
    assert (output.text, output.finish_reason) == ("", "tool_calls")


def test_openai_chat_stream() -> None:
    raw = payload("openai-chat-stream")
    deltas, output = read(
        openai_chat.StreamReader(), events("openai-chat-stream", ChatCompletionChunk)
    )
    usage = raw[-2]["data"]["usage"]  # the last chunk before [DONE], asked for by include_usage
    assert deltas == [("text", "The tests "), ("text", "pass.")]
    assert output == ModelOutput(
        text="The tests pass.",
        finish_reason="stop",
        usage=Usage(
            input_tokens=usage["prompt_tokens"],
            output_tokens=usage["completion_tokens"],
            cached_input_tokens=usage["prompt_tokens_details"]["cached_tokens"],
            cache_write_tokens=usage["prompt_tokens_details"]["cache_write_tokens"],
            reasoning_tokens=0,
        ),
    )


# -- OpenAI Responses -------------------------------------------------------------------------


def test_openai_responses_answer() -> None:
    raw = payload("openai-responses")
    output = openai_responses.parse_response(Response.model_validate(raw))
    usage = raw["usage"]
    assert output.usage == Usage(
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cached_input_tokens=usage["input_tokens_details"]["cached_tokens"],
        cache_write_tokens=usage["input_tokens_details"]["cache_write_tokens"],
        reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"],
    )
    assert output.text == "Found it: the fold caches its cursor."
    assert output.tool_calls == (
        ToolCall(id="call_Xr2b7P", name="search", arguments='{"query":"cursor"}'),
    )
    assert output.finish_reason == "completed"


def test_openai_responses_stream() -> None:
    raw = payload("openai-responses-stream")
    reader = openai_responses.StreamReader()
    deltas, output = read(reader, events("openai-responses-stream", ResponseStreamEvent))
    usage = raw[-1]["data"]["response"]["usage"]
    assert reader.done and deltas == [("text", "Do"), ("text", "ne.")]
    assert output is not None and output.text == "Done."
    assert output.usage == Usage(
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cached_input_tokens=0,
        cache_write_tokens=usage["input_tokens_details"]["cache_write_tokens"],
        reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"],
    )


def test_an_openai_responses_stream_without_its_completed_event_has_no_answer() -> None:
    stream = events("openai-responses-stream", ResponseStreamEvent)[:-1]
    reader = openai_responses.StreamReader()
    deltas, output = read(reader, stream)
    assert deltas and output is None and not reader.done


# -- Anthropic Messages -----------------------------------------------------------------------


def test_anthropic_answer() -> None:
    raw = payload("anthropic")
    output = anthropic.parse_response(Message.model_validate(raw))
    usage = raw["usage"]
    read_, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    assert output.usage == Usage(
        # Anthropic's input_tokens is only the uncached part: the prompt is the three summed.
        input_tokens=usage["input_tokens"] + read_ + written,
        output_tokens=usage["output_tokens"],
        cached_input_tokens=read_,
        cache_write_tokens=written,
        reasoning_tokens=None,
    )
    assert output.usage.uncached_input_tokens == usage["input_tokens"]
    tool_use = raw["content"][1]
    assert output.tool_calls == (
        ToolCall(
            id=tool_use["id"],
            name="read_file",
            arguments=json.dumps(tool_use["input"], sort_keys=True),
        ),
    )
    assert (output.text, output.finish_reason) == ("Let me look at the failing test.", "tool_use")


def test_anthropic_stream() -> None:
    raw = payload("anthropic-stream")
    reader = anthropic.StreamReader()
    deltas, output = read(reader, events("anthropic-stream", RawMessageStreamEvent))
    start = raw[0]["data"]["message"]["usage"]
    delta = raw[-2]["data"]["usage"]
    assert reader.done and deltas == [("text", "Running "), ("text", "them.")]
    assert output == ModelOutput(
        text="Running them.",
        tool_calls=(
            ToolCall(id="toolu_01T1x1fJ", name="run_tests", arguments='{"path": "tests/"}'),
        ),
        finish_reason="tool_use",
        usage=Usage(
            input_tokens=start["input_tokens"] + start["cache_read_input_tokens"],
            output_tokens=delta["output_tokens"],  # message_delta's count is the final one
            cached_input_tokens=start["cache_read_input_tokens"],
            cache_write_tokens=0,
        ),
    )


def test_anthropic_later_usage_reports_override_field_by_field() -> None:
    start = AnthropicUsage(
        input_tokens=5, cache_read_input_tokens=100, cache_creation_input_tokens=20, output_tokens=1
    )
    # A message_delta that repeats only the output count keeps the prompt of message_start.
    late = {"output_tokens": 40, "output_tokens_details": {"thinking_tokens": 25}}
    usage = anthropic.parse_usage([start, MessageDeltaUsage.model_validate(late)])
    assert usage == Usage(
        input_tokens=125,
        output_tokens=40,
        cached_input_tokens=100,
        cache_write_tokens=20,
        reasoning_tokens=25,
    )


# -- one meaning for every provider -----------------------------------------------------------

_counts = st.integers(min_value=0, max_value=2_000_000)


@given(uncached=_counts, read_=_counts, written=_counts, visible=_counts, thinking=_counts)
def test_every_provider_maps_usage_to_the_same_meaning(
    uncached: int, read_: int, written: int, visible: int, thinking: int
) -> None:
    """The same call, reported the way each provider reports it, maps to the same Usage."""
    prompt, output = uncached + read_ + written, visible + thinking
    chat = CompletionUsage.model_validate(
        {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": read_, "cache_write_tokens": written},
            "completion_tokens_details": {"reasoning_tokens": thinking},
        }
    )
    responses = ResponseUsage.model_validate(
        {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": read_, "cache_write_tokens": written},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": thinking},
            "total_tokens": prompt + output,
        }
    )
    messages = AnthropicUsage.model_validate(
        {
            "input_tokens": uncached,
            "cache_read_input_tokens": read_,
            "cache_creation_input_tokens": written,
            "output_tokens": output,
            "output_tokens_details": {"thinking_tokens": thinking},
        }
    )
    expected = Usage(
        input_tokens=prompt,
        output_tokens=output,
        cached_input_tokens=read_,
        cache_write_tokens=written,
        reasoning_tokens=thinking,
    )
    assert openai_chat.parse_usage(chat) == expected
    assert openai_responses.parse_usage(responses) == expected
    assert anthropic.parse_usage([messages]) == expected
    assert expected.uncached_input_tokens == uncached


def test_unreported_usage_is_recorded_as_unreported_not_as_zero() -> None:
    assert openai_chat.parse_usage(None) is None
    assert openai_responses.parse_usage(None) is None
    assert anthropic.parse_usage([]) is None
    assert anthropic.parse_usage([None]) is None
