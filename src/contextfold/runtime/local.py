"""The local deterministic model: an offline coding assistant for the demo and for tests.

It reads the neutral request like a model would read the rendered one: the newest user
question, the tool results since, and the instruction of a compaction request. Given the
same request it always answers the same, and it reports usage as request bytes / 4.
"""

from __future__ import annotations

import hashlib
import html
import json
import re

from ..context.compaction import COMPACTION_INSTRUCTION
from ..context.request import TAIL_PREFIX, parse_item_header
from ..wire import ModelOutput, NeutralMessage, NeutralRequest, ToolCall
from .clients import FunctionModel

__all__ = ["LocalModel"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_STOP = {
    "what",
    "which",
    "where",
    "does",
    "from",
    "with",
    "that",
    "this",
    "file",
    "files",
    "please",
    "about",
    "there",
    "show",
    "explain",
    "find",
    "tell",
    "have",
    "defined",
    "computed",
    "happens",
    "work",
    "works",
    "used",
    "when",
    "their",
    "your",
}


def _body(message: NeutralMessage) -> str:
    """An item's content without its one-line header."""
    first, _, rest = message.content.partition("\n")
    return rest if parse_item_header(first) is not None else message.content


_SUMMARY_START = "Summary of the conversation so far"
_TURN_START = "<buzz-turn>"
_EVENT_CONTENT = re.compile(r"^<event [^\n]*>\nContent: (.*?)\n</event>$", re.M | re.S)
_ASKED = "- The user asked: "


def _asked(message: NeutralMessage) -> list[str]:
    """What a user message asked: its text, or the questions a summary records."""
    body = _body(message).strip()
    if body.startswith(_TURN_START):  # a turn envelope: what its events say
        return [html.unescape(text) for text in _EVENT_CONTENT.findall(body)]
    if not body.startswith(_SUMMARY_START):
        return [body] if body else []
    asked: list[str] = []
    for line in body.splitlines():
        if line.startswith(_ASKED):
            try:
                value = json.loads(line[len(_ASKED) :])
            except ValueError:
                continue
            if isinstance(value, str):
                asked.append(value)
    return asked


def _summary(request: NeutralRequest) -> str:
    users = [
        m for m in request.messages if m.role == "user" and not m.content.startswith(TAIL_PREFIX)
    ]
    asked = [question for m in users for question in _asked(m)]
    tools = sum(1 for m in request.messages if m.role == "tool")
    lines = [f"{_SUMMARY_START} ({tools} tool results)."]
    lines += [f"{_ASKED}{json.dumps(q[:160])}" for q in asked][-6:]
    return "\n".join(lines)


def _question(message: NeutralMessage) -> str | None:
    """The question a user message asks: its text, or for a compaction summary (which may
    have replaced the question in progress) the newest question it records."""
    if message.role != "user":
        return None
    questions = [q.strip() for q in _asked(message) if q.strip().endswith("?")]
    return questions[-1] if questions else None


def _request_id(request: NeutralRequest) -> str:
    """A call id unique to the request's content: a count of messages would repeat after
    a compaction shrinks the request, and a repeated call id is not executable."""
    digest = hashlib.sha256("\x00".join(m.content for m in request.messages).encode())
    return digest.hexdigest()[:16]


def _decide(request: NeutralRequest) -> ModelOutput:
    messages = [
        m for m in request.messages if not (m.role == "user" and m.content.startswith(TAIL_PREFIX))
    ]
    if messages and messages[-1].content == COMPACTION_INSTRUCTION:
        return ModelOutput(text=_summary(request))
    question_at = max((i for i, m in enumerate(messages) if _question(m) is not None), default=-1)
    if question_at < 0:
        return ModelOutput(text="I am ready. Ask me about the workspace.")
    question = _question(messages[question_at]) or ""
    since = messages[question_at + 1 :]
    results = [m for m in since if m.role == "tool"]
    tool_names = {t.name for t in request.tools}
    step = len(results)
    if step == 0 and "search_files" in tool_names:
        words = [w.lower() for w in _WORD.findall(question) if w.lower() not in _STOP]
        query = words[0] if words else question.split()[-1].strip("?")
        return ModelOutput(
            text=f"Let me search the workspace for {query!r}.",
            tool_calls=(
                ToolCall(
                    id=f"call_{_request_id(request)}_search",
                    name="search_files",
                    arguments=json.dumps({"query": query}),
                ),
            ),
        )
    if step == 1 and "read_file" in tool_names:
        found = re.findall(r"^([\w./-]+\.\w+):\d+:", _body(results[0]), flags=re.M)
        if found:
            return ModelOutput(
                text=f"Reading {found[0]}.",
                tool_calls=(
                    ToolCall(
                        id=f"call_{_request_id(request)}_read",
                        name="read_file",
                        arguments=json.dumps({"path": found[0]}),
                    ),
                ),
            )
    status = [
        _body(m).strip()
        for m in messages
        if m.role == "user"
        and parse_item_header(m.content.partition("\n")[0]) is not None
        and 'key="ci/status"' in m.content.partition("\n")[0]
    ]
    evidence = _body(results[-1]).strip().splitlines() if results else []
    answer = [f"Answer to {json.dumps(question)}:"]
    answer += [f"  {line}" for line in evidence[:6]] or [
        "  I found nothing relevant in the workspace."
    ]
    if status:
        answer.append(f"(Latest CI status I was told: {status[-1]})")
    return ModelOutput(text="\n".join(answer))


class LocalModel(FunctionModel):
    """A deterministic, offline model. ``transport`` decides the wire body it is sent."""

    def __init__(
        self,
        *,
        model: str = "contextfold-local",
        transport: str = "openai-chat",
        stream_chunk: int = 24,
    ) -> None:
        super().__init__(_decide, model=model, transport=transport, stream_chunk=stream_chunk)  # type: ignore[arg-type]
