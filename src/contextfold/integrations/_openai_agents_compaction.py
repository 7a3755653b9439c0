"""contextfold's counterpart of the SDK's ``OpenAIResponsesCompactionSession``:
:class:`JournalCompactionSession`, a session whose compaction is a journal event.

The SDK's compaction session asks OpenAI's ``responses.compact`` for a shorter history
and rewrites its session with it: what the summary replaced is gone. This one wraps a
:class:`~contextfold.integrations.openai_agents.JournalSession`: when the session's items
are over ``compact_at`` tokens, the oldest of them are summarized by any contextfold model
client, and one append records it::

    openai-agents/session-compacted    every live item gives way to the items that follow
    openai-agents/session-summarized   which items the summary replaced, by position
    openai-agents/item-added           the summary, a user message
    openai-agents/item-added ...       the newest items, kept verbatim (copied)

The replaced items stay in the journal where they were added; :meth:`history` reads every
item the session was ever given, in order, without the copies compactions made. The cut
keeps the newest whole units within ``keep_tokens`` (a tool call travels with its output)
and never drops the newest answer; the summary goes out as a user message (a faithful
summary may quote untrusted text). A compaction that can only summarize the previous
summary is not made.

It speaks the SDK's compaction protocol (``run_compaction``, which the Runner calls after
a turn whose model gave a response id; ``force`` compacts under the threshold too), and
also checks after every ``add_items``, so it compacts under any model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

from agents.items import TResponseInputItem
from agents.memory import OpenAIResponsesCompactionArgs, SessionSettings
from pydantic import Field

from ..canonical import canonical_json
from ..context.calls import CallTool, Readable, summary_prompt, summary_text
from ..errors import InvalidInputError, WrongExpectedVersionError
from ..events import Envelope, Event
from ..folds.fold import Fold
from ..journal import Journal
from ..runtime.clients import ModelClient
from ..views.view import check_budget
from ..wire import NeutralMessage, NeutralRequest, Usage, render_request
from ._openai_agents_session import (
    SESSION_FOLD,
    ItemAdded,
    SessionCompacted,
    SessionState,
    StoredItem,
)
from ._pair_safe import pair_safe_starts

__all__ = ["SUMMARIES", "JournalCompactionSession", "SessionSummarized", "session_history"]

_QUOTED = 2_000  # characters of an item outside the wire model the summarizer sees


class SessionSummarized(Event, type="openai-agents/session-summarized", runtime_only=True):
    """contextfold's compaction of a session: the items stored at ``replaced`` gave way to a
    summary (the next event of the same append) and ``kept`` items copied after it."""

    replaced: tuple[int, ...]
    """Stream positions of the live items the summary replaced, oldest first: each stays
    where it was added."""
    kept: int = Field(ge=0)
    model: str | None = None
    """The summarizer's model."""
    usage: Usage | None = None
    """The summarizer call's usage, when the provider reported it."""


SUMMARIES: Fold[int] = Fold("openai_agents_session_summaries", initial=lambda: 0, checkpoints=False)
"""The stream position of a session's newest summary item (0: none)."""


@SUMMARIES.on(SessionSummarized)
def _summarized(newest: int, ev: Envelope[SessionSummarized]) -> int:
    return ev.position + 1  # the summary is added right after the record


class _Journaled(Protocol):
    """What this needs of the JournalSession it wraps."""

    session_id: str
    stream: str
    session_settings: SessionSettings | None

    @property
    def journal(self) -> Journal: ...

    def _run(self, work: Callable[[], Awaitable[Any]]) -> Awaitable[Any]: ...

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]: ...

    async def add_items(self, items: list[TResponseInputItem]) -> None: ...

    async def pop_item(self) -> TResponseInputItem | None: ...

    async def clear_session(self) -> None: ...


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                parts.append(f"[{kind}]")
        return "".join(parts)
    return "" if content is None else str(content)


def readable(stored: StoredItem) -> Readable:
    """An item as the summarizer reads it (see ``context.calls``)."""
    item = stored.decode()
    actor = stored.actor.type if stored.actor is not None else None
    role = item.get("role")
    if stored.kind == "message" and role in ("user", "system", "developer", "assistant"):
        return Readable(role=role, text=_text(item.get("content")), actor=actor)
    if stored.kind == "function_call":
        call = CallTool(
            id=str(item.get("call_id", "")),
            name=str(item.get("name", "")),
            arguments=str(item.get("arguments", "")),
        )
        return Readable(role="assistant", tool_calls=(call,))
    if stored.kind == "function_call_output":
        return Readable(
            role="tool", text=_text(item.get("output")), tool_call_id=str(item.get("call_id"))
        )
    quoted = canonical_json(item).decode()[:_QUOTED]
    return Readable(role="user", text=f"[{stored.kind or 'item'}] {quoted}", actor=actor)


def _cut(state: SessionState, keep_tokens: float) -> int:
    """The index of the first item kept: the oldest pair-safe start whose items fit
    ``keep_tokens``, but none after the newest answer (an assistant message)."""
    length = state.length
    answer = next(
        (
            i
            for i in range(length - 1, -1, -1)
            if state.items[i].kind == "message"
            and state.items[i].decode().get("role") == "assistant"
        ),
        length,
    )
    fits: int | None = None
    at_answer: int | None = None
    starts = pair_safe_starts(
        length,
        link=lambda index: state.items[index].link,
        tokens=lambda index: state.items[index].tokens,
    )
    for start, total in starts:  # newest first
        if total <= keep_tokens:
            fits = start
        if start <= answer and at_answer is None:
            at_answer = start
        if total > keep_tokens and at_answer is not None:
            break
    if fits is not None and fits <= answer:
        return fits
    return at_answer if at_answer is not None else 0


class JournalCompactionSession:
    """An SDK session (give it to ``Runner.run(..., session=...)``) that compacts the
    :class:`~contextfold.integrations.openai_agents.JournalSession` it wraps by summary,
    as a journal event (see the module).

    ``summarizer``: a contextfold model client (``cf.OpenAIResponsesModel``,
    ``cf.AnthropicModel``, ``cf.FunctionModel``…) given a transcript of the oldest items;
    ``compact_at``: the session's tokens (⌈item JSON / 4⌉ each) over which it compacts;
    ``keep_tokens``: the newest items kept verbatim (default half of ``compact_at``);
    ``max_tokens``: of the summary. Raises InvalidInputError for a bad argument.
    """

    def __init__(
        self,
        session: _Journaled,
        *,
        summarizer: ModelClient,
        compact_at: float,
        keep_tokens: float | None = None,
        max_tokens: int = 1_024,
    ) -> None:
        if not callable(getattr(session, "_run", None)) or not hasattr(session, "stream"):
            raise InvalidInputError(
                f"JournalCompactionSession wraps a JournalSession, got {type(session).__name__}"
            )
        if not callable(getattr(summarizer, "complete", None)):
            raise InvalidInputError(
                "summarizer must be a contextfold model client (cf.OpenAIResponsesModel, "
                f"cf.FunctionModel, …), got {type(summarizer).__name__}"
            )
        self.underlying_session = session
        self.session_id = session.session_id
        self.summarizer = summarizer
        self.compact_at = check_budget(compact_at, name="compact_at")
        self.keep_tokens = (
            self.compact_at / 2
            if keep_tokens is None
            else check_budget(keep_tokens, name="keep_tokens", allow_zero=True)
        )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidInputError(f"max_tokens must be a positive int, got {max_tokens!r}")
        self.max_tokens = max_tokens

    def __repr__(self) -> str:
        return f"<JournalCompactionSession {self.session_id!r} on {self.stream!r}>"

    @property
    def stream(self) -> str:
        return self.underlying_session.stream

    @property
    def session_settings(self) -> SessionSettings | None:
        return self.underlying_session.session_settings

    @session_settings.setter
    def session_settings(self, value: SessionSettings | None) -> None:
        self.underlying_session.session_settings = value

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        return await self.underlying_session.get_items(limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Add ``items`` (one append), then compact when the session is over ``compact_at``."""
        await self.underlying_session.add_items(items)
        await self._compact(force=False)

    async def pop_item(self) -> TResponseInputItem | None:
        return await self.underlying_session.pop_item()

    async def clear_session(self) -> None:
        await self.underlying_session.clear_session()

    async def run_compaction(self, args: OpenAIResponsesCompactionArgs | None = None) -> None:
        """The SDK's compaction hook: compact when over ``compact_at``, or with
        ``force`` whenever there is something older than what a compaction keeps."""
        await self._compact(force=bool(args and args.get("force")))

    async def history(self) -> list[TResponseInputItem]:
        """Every item the session was given, in order, compacted ones included (read
        from the journal); the copies compactions made are left out."""
        session = self.underlying_session
        found: list[TResponseInputItem] = await session._run(
            lambda: session_history(session.journal, self.stream)
        )
        return found

    # -- compaction -----------------------------------------------------------------------

    async def _read(self) -> tuple[SessionState, int]:
        journal = self.underlying_session.journal
        state = await journal.fold(SESSION_FOLD, self.stream)
        return state, await journal.fold(SUMMARIES, self.stream)

    async def _compact(self, *, force: bool) -> bool:
        """Summarize the oldest items when due; whether it did."""
        session = self.underlying_session
        state, summary_at = await session._run(self._read)
        tokens = sum(stored.tokens for stored in state)
        if not state.length or (not force and tokens <= self.compact_at):
            return False
        cut = _cut(state, self.keep_tokens)
        older = [state.items[index] for index in range(cut)]
        previous: str | None = None
        if older and older[0].position == summary_at:
            previous = _text(older[0].decode().get("content")).removeprefix(summary_text(""))
            older = older[1:]
        if not older:
            return False  # only the summary is older than what is kept: nothing to gain
        prompt = summary_prompt([readable(stored) for stored in older], previous)
        summary, usage = await self._summarize(prompt)
        kept = [state.items[index] for index in range(cut, state.length)]
        replaced = tuple(state.items[index].position for index in range(cut))
        events: list[Event] = [
            SessionCompacted(replaces_from=None, replaced=state.length, items=1 + len(kept)),
            SessionSummarized(
                replaced=replaced, kept=len(kept), model=self.summarizer.model, usage=usage
            ),
            ItemAdded(item={"role": "user", "content": summary_text(summary)}),
            *(ItemAdded(item=stored.decode(), actor=stored.actor) for stored in kept),
        ]

        async def append() -> bool:
            try:
                await session.journal.append(
                    self.stream, events, expected_version=state.last_position
                )
            except WrongExpectedVersionError:
                return False  # the session changed while the summary was written: next time
            return True

        done: bool = await session._run(append)
        return done

    async def _summarize(self, prompt: str) -> tuple[str, Usage | None]:
        client = self.summarizer
        request = NeutralRequest(
            model=client.model,
            system="",
            messages=(NeutralMessage(role="user", content=prompt),),
            max_tokens=self.max_tokens,
        )
        output = await client.complete(request, render_request(request, client.transport))
        return output.text, output.usage


async def session_history(journal: Journal, stream: str) -> list[TResponseInputItem]:
    """Every item added to a session's stream, in order, without the items a compaction
    (the SDK's or contextfold's) added in place of others."""
    items: list[TResponseInputItem] = []
    rewritten = 0
    async for stored in journal.read_all(stream, types=[ItemAdded, SessionCompacted]):
        event = stored.decode()
        if isinstance(event, SessionCompacted):
            rewritten = event.items
        elif rewritten:
            rewritten -= 1
        elif isinstance(event, ItemAdded):
            items.append(cast(TResponseInputItem, dict(event.item)))
    return items
