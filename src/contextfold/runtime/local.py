"""The local deterministic model: an offline coding assistant for the demo and for tests.

It reads the neutral request like a model would read the rendered one: the newest user
question, the tool results since, and the instruction of a compaction request, whose
summary quotes each message as its actor's (read from the item header), so a webhook's or
a chat's words are never recorded as the user's. Given the same request it always
answers the same, and it reports usage as request bytes / 4.
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
_SAID = re.compile(r'^- (?P<who>[a-z][a-z0-9_.-]*(?: "(?:[^"\\]|\\.)*")?) said: (?P<text>".*")$')
_USER = "user"


def _speaker(message: NeutralMessage) -> str | None:
    """Who supplied a user-role message: ``user`` for a human (no actor, or a user actor),
    the actor (type and quoted id) for anyone else, None for request-only text (no item
    header: the session prefix)."""
    header = parse_item_header(message.content.partition("\n")[0])
    if header is None:
        return None
    if header.actor is None or header.actor == _USER:
        return _USER
    return header.actor + (f" {json.dumps(header.actor_id)}" if header.actor_id else "")


def _entries(message: NeutralMessage) -> list[tuple[str | None, str]]:
    """What a user-role message says, with who said it: its text, or the entries a
    summary records (each with the speaker it names)."""
    body = _body(message).strip()
    if body.startswith(_TURN_START):  # a turn envelope: what its events say
        return [(_speaker(message), html.unescape(t)) for t in _EVENT_CONTENT.findall(body)]
    if not body.startswith(_SUMMARY_START):
        return [(_speaker(message), body)] if body else []
    entries: list[tuple[str | None, str]] = []
    for line in body.splitlines():
        said = _SAID.match(line)
        if line.startswith(_ASKED):
            who, quoted = _USER, line[len(_ASKED) :]
        elif said is not None:
            who, quoted = said.group("who"), said.group("text")
        else:
            continue
        try:
            value = json.loads(quoted)
        except ValueError:
            continue
        if isinstance(value, str):
            entries.append((who, value))
    return entries


def _asked(message: NeutralMessage) -> list[str]:
    """What a user-role message asked or said, whoever said it."""
    return [text for _, text in _entries(message)]


def _summary_line(who: str, text: str) -> str:
    quoted = json.dumps(text[:160])
    return f"{_ASKED}{quoted}" if who == _USER else f"- {who} said: {quoted}"


def _summary(request: NeutralRequest) -> str:
    """The summary: the newest things said, each attributed to whoever said it (a webhook
    or a chat message quoted as its actor's, never as the user's); request-only text (the
    session prefix) is left out."""
    users = [
        m for m in request.messages if m.role == "user" and not m.content.startswith(TAIL_PREFIX)
    ]
    said = [(who, text) for m in users for who, text in _entries(m) if who is not None]
    tools = sum(1 for m in request.messages if m.role == "tool")
    lines = [f"{_SUMMARY_START} ({tools} tool results)."]
    lines += [_summary_line(who, text) for who, text in said][-6:]
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
