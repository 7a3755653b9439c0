"""Recording a framework's model calls on a stream, reading them back, and verifying them.

:class:`CallRecorder` is what an integration appends through (see :mod:`.calls` for the
records): each request in one append with the messages the stream has not recorded yet,
each answer and each compaction likewise. :func:`read_calls` reads a stream's records
back; :func:`verify_calls` recomputes every digest and every contextfold view; and
:func:`call_body` is a request rebuilt from the journal: the canonical JSON of the
framework's request object, whose SHA-256 the request recorded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..canonical import canonical_json, sha256_hex
from ..errors import InvalidInputError
from ..events import Envelope, Event
from ..folds.fold import Fold
from ..journal import Journal
from ..wire import Usage
from .calls import (
    CallAnswered,
    CallCompacted,
    CallMessage,
    CallRequested,
    CallView,
    Readable,
    message_digest,
    request_digest,
    split_pairs,
    view_start,
)

__all__ = [
    "CallProblem",
    "CallRecorder",
    "Calls",
    "Compaction",
    "Message",
    "call_body",
    "digest_of",
    "read_calls",
    "verify_calls",
]

CALL_TYPES: tuple[type[Event], ...] = (CallMessage, CallRequested, CallAnswered, CallCompacted)


class Message(NamedTuple):
    """A message as an integration hands it over: the framework's JSON and its readable
    form (and its digest, when the integration made it already)."""

    json: Any
    readable: Readable
    sha256: str | None = None
    """:func:`~.calls.message_digest` of ``json`` (None: computed when needed)."""


def digest_of(message: Message) -> str:
    """The message's digest: the one it carries, else :func:`~.calls.message_digest` of its
    JSON."""
    return message.sha256 if message.sha256 is not None else message_digest(message.json)


class Compaction(NamedTuple):
    """The newest compaction of a stream: where it is, its summary and what it replaced."""

    position: int
    summary: str
    summarized: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Known:
    """The digests recorded on a stream: a frozenset, and the newest few in a tuple merged
    into it every ``_RECENT``. Each request asks for its whole history, and a persistent
    set answers in Python, a frozenset in C; a frozenset copied per message would make a
    long stream's fold quadratic, copied every ``_RECENT`` it costs little."""

    settled: frozenset[str]
    recent: tuple[str, ...]

    def __contains__(self, digest: object) -> bool:
        return digest in self.settled or digest in self.recent

    def add(self, digest: str) -> _Known:
        if len(self.recent) < _RECENT:
            return _Known(self.settled, (*self.recent, digest))
        return _Known(self.settled.union(self.recent, (digest,)), ())


_RECENT = 64


class _History(NamedTuple):
    """The whole history of the newest request with a view: what the next one extends."""

    position: int
    digests: tuple[str, ...]
    tokens: tuple[float, ...]


class _Recorded(NamedTuple):
    known: _Known
    compaction: Compaction | None
    history: _History | None = None


_RECORDED: Fold[_Recorded] = Fold(
    "contextfold_calls_recorded", initial=lambda: _Recorded(_Known(frozenset(), ()), None)
)


@_RECORDED.on(CallMessage)
def _message(state: _Recorded, env: Envelope[CallMessage]) -> _Recorded:
    return state._replace(known=state.known.add(env.payload.sha256))


@_RECORDED.on(CallRequested)
def _requested(state: _Recorded, env: Envelope[CallRequested]) -> _Recorded:
    view = env.payload.view
    if view is None:
        return state
    if view.extends is None:
        return state._replace(history=_History(env.position, view.history, view.tokens))
    last = state.history
    if last is None or last.position != view.extends:
        return state._replace(history=None)  # another writer's request came between
    whole = _History(env.position, last.digests + view.history, last.tokens + view.tokens)
    return state._replace(history=whole)


@_RECORDED.on(CallCompacted)
def _compacted(state: _Recorded, env: Envelope[CallCompacted]) -> _Recorded:
    done = Compaction(env.position, env.payload.summary, env.payload.summarized)
    return state._replace(compaction=done)


class CallRecorder:
    """Appends one framework's calls to ``stream`` of an async journal (see the module).

    Every method appends once; messages already on the stream are named, not stored again,
    so the record grows with the conversation, not with its square."""

    def __init__(self, journal: Journal, stream: str, framework: str) -> None:
        self.journal = journal
        self.stream = stream
        self.framework = framework

    async def compaction(self) -> Compaction | None:
        """The newest compaction recorded on the stream, if any."""
        return (await self.journal.fold(_RECORDED, self.stream)).compaction

    async def _fresh(
        self, messages: Sequence[Message], recorded: _Recorded | None = None
    ) -> tuple[list[str], list[Event]]:
        if recorded is None:
            recorded = await self.journal.fold(_RECORDED, self.stream)
        known = recorded.known
        digests: list[str] = []
        events: list[Event] = []
        added: set[str] = set()
        for message in messages:
            digest = digest_of(message)
            digests.append(digest)
            if digest not in added and digest not in known:
                added.add(digest)
                events.append(
                    CallMessage(
                        sha256=digest,
                        framework=self.framework,
                        message=message.json,
                        readable=message.readable,
                    )
                )
        return digests, events

    async def request(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        options: dict[str, Any],
        view: CallView | None = None,
        history: Sequence[Message] = (),
    ) -> int:
        """Records a request (``history``: the framework's whole history when ``view``
        chose ``messages`` from it); returns its position.

        Stored compactly: a view continuing the stream's previous request's history names
        only the messages added since, and messages that are the ones the view chooses
        are not listed again (:func:`read_calls` restores both)."""
        recorded = await self.journal.fold(_RECORDED, self.stream)
        _, events = await self._fresh([*history, *messages], recorded)
        digests = tuple(digest_of(m) for m in messages)
        listed = digests
        if view is not None and len(history) == len(view.history):
            roles = [m.readable.role for m in history]
            if digests == tuple(_chosen(view, view.history, roles)):
                listed = ()
            view = _extending(view, recorded.history)
        sent = CallRequested(
            framework=self.framework,
            model=model,
            messages=listed,
            options=options,
            sha256=request_digest(self.framework, model, [m.json for m in messages], options),
            view=view,
        )
        done = await self.journal.append(self.stream, [*events, sent])
        return done.last_position

    async def answer(
        self,
        request: int,
        message: Message,
        *,
        model: str | None = None,
        usage: Usage | None = None,
        finish_reason: str | None = None,
    ) -> int:
        """Records the answer to the request at position ``request``."""
        (digest,), events = await self._fresh([message])
        answered = CallAnswered(
            framework=self.framework,
            request=request,
            message=digest,
            model=model,
            usage=usage,
            finish_reason=finish_reason,
        )
        done = await self.journal.append(self.stream, [*events, answered])
        return done.last_position

    async def compacted(
        self,
        summary: str,
        summarized: Sequence[Message],
        *,
        model: str | None = None,
        usage: Usage | None = None,
    ) -> Compaction:
        """Records a summary replacing ``summarized`` (the oldest messages of the history,
        from its first)."""
        digests, events = await self._fresh(summarized)
        done = CallCompacted(
            framework=self.framework,
            summary=summary,
            summarized=tuple(digests),
            model=model,
            usage=usage,
        )
        appended = await self.journal.append(self.stream, [*events, done])
        return Compaction(appended.last_position, summary, tuple(digests))


def _chosen(view: CallView, history: Sequence[str], roles: Sequence[str]) -> list[str]:
    """The digests a view sends out of its whole ``history``: the system messages before
    its start, its summary, then the history from its start."""
    pinned = [d for d, role in zip(history[: view.start], roles, strict=False) if role == "system"]
    summary = [] if view.summary is None else [view.summary]
    return [*pinned, *summary, *history[view.start :]]


def _extending(view: CallView, last: _History | None) -> CallView:
    """``view`` as stored: naming only what it adds to ``last`` when it continues it."""
    if last is None or len(view.history) < len(last.digests):
        return view
    cut = len(last.digests)
    if view.history[:cut] != last.digests or view.tokens[:cut] != last.tokens:
        return view
    return view.model_copy(
        update={
            "history": view.history[cut:],
            "tokens": view.tokens[cut:],
            "extends": last.position,
        }
    )


@dataclass(slots=True)
class Calls:
    """A stream's call records, read back: each by position."""

    messages: dict[str, tuple[int, CallMessage]] = field(default_factory=dict)
    requests: dict[int, CallRequested] = field(default_factory=dict)
    answers: dict[int, CallAnswered] = field(default_factory=dict)
    compactions: dict[int, CallCompacted] = field(default_factory=dict)
    times: dict[int, str] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    """Requests whose stored form could not be made whole, and why."""

    def add(self, position: int, time: str, event: Event) -> None:
        """Takes one decoded record (others are ignored). A request is kept whole: its
        view's whole history, and the messages it sent listed."""
        self.times[position] = time
        if isinstance(event, CallMessage):
            self.messages.setdefault(event.sha256, (position, event))
        elif isinstance(event, CallRequested):
            self.requests[position] = self._whole(position, event)
        elif isinstance(event, CallAnswered):
            self.answers[position] = event
        elif isinstance(event, CallCompacted):
            self.compactions[position] = event

    def readable(self, digest: str) -> Readable | None:
        found = self.messages.get(digest)
        return None if found is None else found[1].readable

    def _whole(self, position: int, sent: CallRequested) -> CallRequested:
        view = sent.view
        if view is None:
            return sent
        if view.extends is not None:
            earlier = self.requests.get(view.extends)
            if earlier is None or earlier.view is None or view.extends >= position:
                self.unreadable[position] = (
                    f"its view continues the history of @{view.extends}, which holds no "
                    "recorded request with a view"
                )
                return sent
            view = view.model_copy(
                update={
                    "history": earlier.view.history + view.history,
                    "tokens": earlier.view.tokens + view.tokens,
                    "extends": None,
                }
            )
        if sent.messages:
            return sent.model_copy(update={"view": view})
        roles = [r.role if r is not None else "" for r in map(self.readable, view.history)]
        chosen = tuple(_chosen(view, view.history, roles))
        return sent.model_copy(update={"view": view, "messages": chosen})


async def read_calls(journal: Journal, stream: str) -> Calls:
    """Every call record of ``stream``, in one read."""
    calls = Calls()
    async for stored in journal.read_all(stream, types=list(CALL_TYPES)):
        calls.add(stored.position, stored.meta.time, stored.decode())
    return calls


def call_body(calls: Calls, position: int) -> bytes:
    """The request recorded at ``position`` rebuilt from the stream's records: the
    canonical JSON of its framework, model, messages and options. Raises
    InvalidInputError when there is no request there or a message it names is missing."""
    sent = calls.requests.get(position)
    if sent is None:
        raise InvalidInputError(f"position {position} holds no recorded framework request")
    missing = [d for d in sent.messages if d not in calls.messages]
    if missing:
        raise InvalidInputError(
            f"the request at position {position} names message {missing[0][:12]}…, which "
            "the stream does not hold"
        )
    body = {
        "framework": sent.framework,
        "model": sent.model,
        "messages": [calls.messages[d][1].message for d in sent.messages],
        "options": sent.options,
    }
    return canonical_json(body)


@dataclass(frozen=True, slots=True)
class CallProblem:
    """What does not add up at ``position``."""

    position: int
    problem: str


def _view_messages(calls: Calls, view: CallView) -> list[str] | str:
    """The digests the view its record names sends, recomputed; a problem's text when the
    record cannot be recomputed."""
    history = [calls.readable(d) for d in view.history]
    readable = [m for m in history if m is not None]
    if len(readable) != len(history) or len(view.tokens) != len(history):
        return "its view names history messages the stream does not hold"
    lowest = view.summarized
    if view.compaction is not None:
        done = calls.compactions.get(view.compaction)
        if done is None or view.history[:lowest] != done.summarized:
            return "its view names a compaction the stream does not hold for its history"
    summary = [] if view.summary is None else [view.summary]
    start = view_start(
        readable,
        view.tokens,
        budget=view.budget,
        keep=view.keep,
        lowest=lowest,
        base=view.base,
        starts=view.starts,
        anchor=view.anchor,
        trim_to=view.trim_to,
    )
    if start != view.start:
        return f"its view starts at history message {view.start}, the budget gives {start}"
    pinned = [d for d, m in zip(view.history[:start], readable, strict=False) if m.role == "system"]
    return [*pinned, *summary, *view.history[start:]]


def _request_problems(calls: Calls, position: int, sent: CallRequested) -> Iterator[str]:
    if position in calls.unreadable:
        yield calls.unreadable[position]
        return
    try:
        body = call_body(calls, position)
    except InvalidInputError as exc:
        yield str(exc)
        return
    if sha256_hex(body) != sent.sha256:
        yield "the request rebuilt from the journal does not have its recorded digest"
    if sent.view is None:
        return
    expected = _view_messages(calls, sent.view)
    if isinstance(expected, str):
        yield expected
    elif list(sent.messages) != expected:
        yield "its messages are not the ones its view chooses"
    readable = [r for r in (calls.readable(d) for d in sent.messages) if r is not None]
    split = split_pairs(readable)
    if split:
        yield f"it splits {split} tool call(s) from their result"


def verify_calls(calls: Calls) -> list[CallProblem]:
    """Every problem of a stream's call records: a message whose JSON lost its digest, a
    request that does not rebuild to its digest, whose messages are not its recorded
    view's, or that splits a tool call from its result; an answer to no request."""
    problems: list[CallProblem] = []
    for digest, (position, recorded) in calls.messages.items():
        if message_digest(recorded.message) != digest:
            problems.append(CallProblem(position, "the message's JSON does not have its digest"))
    for position, sent in calls.requests.items():
        problems += [CallProblem(position, p) for p in _request_problems(calls, position, sent)]
    for position, answered in calls.answers.items():
        if answered.request not in calls.requests:
            problems.append(CallProblem(position, "it answers no recorded request"))
    return sorted(problems, key=lambda p: p.position)
