"""Framework call streams for tests: a short tool-using session recorded the way each of
the four frameworks' integrations records it (the framework's own message JSON beside
the neutral readable form), through the call engine and recorder, with no framework
installed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import contextfold as cf
from contextfold.context.call_records import CallRecorder, Message
from contextfold.context.calls import CallTool, Readable
from contextfold.integrations._call_engine import CallEngine

FRAMEWORKS = ("langchain", "pydantic-ai", "adk", "openai-agents")
MODEL = "gpt-4.1"
SUMMARY = "The user asked about the weather in Paris: 18C and sunny."


def _langchain(r: Readable) -> Any:
    kind = {"system": "system", "developer": "system", "user": "human", "assistant": "ai"}
    if r.role == "tool":
        return {"type": "tool", "content": r.text, "tool_call_id": r.tool_call_id, "name": r.name}
    calls = [{"id": c.id, "name": c.name, "args": c.arguments} for c in r.tool_calls]
    return {"type": kind[r.role], "content": r.text, "tool_calls": calls}


def _pydantic_ai(r: Readable) -> Any:
    if r.role == "assistant":
        parts: list[dict[str, Any]] = [{"part_kind": "text", "content": r.text}] if r.text else []
        for c in r.tool_calls:
            call = {"part_kind": "tool-call", "tool_name": c.name, "args": c.arguments}
            parts.append({**call, "tool_call_id": c.id})
        return {"kind": "response", "parts": parts, "model_name": MODEL}
    part = {"system": "system-prompt", "developer": "system-prompt", "user": "user-prompt"}
    if r.role == "tool":
        tool = {"part_kind": "tool-return", "tool_name": r.name, "content": r.text}
        return {"kind": "request", "parts": [{**tool, "tool_call_id": r.tool_call_id}]}
    return {"kind": "request", "parts": [{"part_kind": part[r.role], "content": r.text}]}


def _adk(r: Readable) -> Any:
    if r.role == "tool":
        answer = {"id": r.tool_call_id, "name": r.name, "response": {"result": r.text}}
        return {"role": "user", "parts": [{"function_response": answer}]}
    parts: list[dict[str, Any]] = [{"text": r.text}] if r.text else []
    parts += [
        {"function_call": {"id": c.id, "name": c.name, "args": c.arguments}} for c in r.tool_calls
    ]
    return {"role": "model" if r.role == "assistant" else "user", "parts": parts}


def _openai_agents(r: Readable) -> Any:
    if r.role == "tool":
        return {"type": "function_call_output", "call_id": r.tool_call_id, "output": r.text}
    if r.role == "assistant" and r.tool_calls:
        (call,) = r.tool_calls
        return {
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
        }
    if r.role == "assistant":
        return {"role": "assistant", "content": [{"type": "output_text", "text": r.text}]}
    return {"role": r.role, "content": r.text}


_SHAPES = {
    "langchain": _langchain,
    "pydantic-ai": _pydantic_ai,
    "adk": _adk,
    "openai-agents": _openai_agents,
}


def message(framework: str, readable: Readable) -> Message:
    """``readable`` as ``framework`` holds it."""
    return Message(_SHAPES[framework](readable), readable)


def user(text: str) -> Readable:
    return Readable(role="user", text=text, actor="user")


def calls(call_id: str, name: str, arguments: str) -> Readable:
    call = CallTool(id=call_id, name=name, arguments=arguments)
    return Readable(role="assistant", tool_calls=(call,))


def result(call_id: str, name: str, text: str) -> Readable:
    return Readable(role="tool", text=text, tool_call_id=call_id, name=name)


def answer(text: str) -> Readable:
    return Readable(role="assistant", text=text)


@dataclass
class Session:
    """What :func:`record_session` recorded: the position of each request, answer and
    compaction."""

    requests: list[int] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    compactions: list[int] = field(default_factory=list)


SCRIPT: tuple[tuple[Readable, ...], ...] = (
    # each step: what the history gains before the model is called, then its answer
    (Readable(role="system", text="Be brief."), user("What is the weather in Paris?")),
    (calls("c1", "get_weather", '{"city": "Paris"}'),),
    (result("c1", "get_weather", "18C, sunny"),),
    (answer("It is 18C and sunny in Paris."),),
    (user("And in Rome?"),),
    (calls("c2", "get_weather", '{"city": "Rome"}'),),
    (result("c2", "get_weather", "22C, clear"),),
    (answer("22C and clear in Rome."),),
)
"""Two turns of four model calls in all: a question, a tool call and its result, an
answer; then again."""

USAGES = (
    cf.Usage(input_tokens=100, output_tokens=10),
    cf.Usage(input_tokens=150, output_tokens=20, cached_input_tokens=90),
    cf.Usage(input_tokens=200, output_tokens=10, cached_input_tokens=140),
    cf.Usage(input_tokens=250, output_tokens=15, cached_input_tokens=190),
)
"""The usage each of the four answers reports."""


async def _summarize(prompt: str) -> tuple[str, cf.Usage | None]:
    return SUMMARY, cf.Usage(input_tokens=len(prompt) // 4, output_tokens=12)


async def record_session(
    journal: cf.Journal, stream: str, framework: str, *, compact_at: float | None = None
) -> Session:
    """:data:`SCRIPT` recorded on ``stream`` as ``framework``: each request through the
    engine (``compact_at``: compact the history past that many tokens), each answer with
    its usage."""
    recorder = CallRecorder(journal, stream, framework)
    engine = CallEngine(
        recorder,
        count=lambda m: float(len(m.readable.text) + 10 * len(m.readable.tool_calls) + 4),
        summary_message=lambda text: message(framework, user(f"Summary: {text}")),
        compact_at=compact_at,
        keep_tokens=20.0,
        summarize=_summarize if compact_at is not None else None,
    )
    session = Session()
    history: list[Message] = []
    options = {"tools": [{"name": "get_weather", "parameters": {"city": "string"}}]}
    steps = iter(SCRIPT)
    for step in steps:
        history += [message(framework, r) for r in step]
        before = await recorder.compaction()
        prepared = await engine.prepare(history)
        done = await recorder.compaction()
        if done is not None and done != before:
            session.compactions.append(done.position)
        position = await engine.record(prepared, model=MODEL, options=options)
        assert position is not None
        session.requests.append(position)
        (reply,) = next(steps)
        usage = USAGES[len(session.answers)]
        said = message(framework, reply)
        finish = "tool_calls" if reply.tool_calls else "stop"
        session.answers.append(
            await recorder.answer(position, said, model=MODEL, usage=usage, finish_reason=finish)
        )
        history.append(said)
    return session
