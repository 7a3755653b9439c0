"""A pydantic-ai message history on a journal stream: :class:`JournalHistory`.

Each message is one ``pydantic-ai/message`` event holding the message exactly as pydantic-ai's
``ModelMessagesTypeAdapter`` dumps it (JSON mode), so a load validates the same JSON pydantic-ai
would have persisted itself: every part kind round-trips as pydantic-ai's own adapter returns
it. A fold over the stream keeps each message's JSON, size and pairing links; a warm load reads
only the events appended since, and a budgeted load decodes only the messages it returns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest
from pyrsistent import PMap, PVector, pmap, pvector

from ..canonical import canonical_json, sha256_hex
from ..errors import CorruptEventError, InvalidInputError, PayloadError
from ..events import Envelope, Event
from ..folds.fold import Fold
from ..journal import Journal, SyncJournal
from ..journal.encode import check_meta, check_stream
from ..store.base import AppendResult
from ..views.view import check_budget
from ._journal_bridge import JournalBridge
from ._pair_safe import link_of
from ._pydantic_ai_window import (
    HistoryView,
    checked_messages,
    choose_start,
    downgraded,
    shape_of_json,
)

__all__ = ["HISTORY_FOLD", "JournalHistory", "PydanticAiMessage"]


class PydanticAiMessage(Event, type="pydantic-ai/message", runtime_only=True):
    """One pydantic-ai message: ``ModelMessagesTypeAdapter.dump_python([m], mode="json")[0]``."""

    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Entry:
    position: int
    data: bytes
    """The message's JSON, compact, as stored."""
    tokens: int
    request: bool
    link: int
    """Index of the oldest message this one must be kept with (see ``_pydantic_ai_window``)."""
    untrusted: bool


@dataclass(frozen=True, slots=True)
class _History:
    entries: PVector[_Entry]
    calls: PMap[str, int]
    """Tool call id -> index of the latest response making it."""
    pinned: bytes | None
    """The first request holding only its trusted system prompt, when it has one."""
    pinned_tokens: int


def _tokens(data: bytes) -> int:
    return math.ceil(len(data) / 4)  # approx_message_tokens of the same JSON


HISTORY_FOLD: Fold[_History] = Fold(
    "pydantic_ai_history",
    initial=lambda: _History(pvector(), pmap(), None, 0),
)


@HISTORY_FOLD.on(PydanticAiMessage)
def _message(state: _History, env: Envelope[PydanticAiMessage]) -> _History:
    message = env.payload.message
    data = orjson.dumps(message)
    index = len(state.entries)
    try:
        shape = shape_of_json(message)
    except InvalidInputError:  # a malformed marking: never trusted; load names the position
        shape = None
    request = message.get("kind") == "request"
    link, calls = index, state.calls
    if shape is not None:
        link = link_of(index, shape.answers, calls)
        if shape.calls:
            calls = calls.update({call: index for call in shape.calls})
    pinned, pinned_tokens = state.pinned, state.pinned_tokens
    if index == 0 and shape is not None and shape.request and shape.system:
        system = [p for p in message["parts"] if _trusted_system(p)]
        pinned = orjson.dumps({**message, "parts": system})
        pinned_tokens = _tokens(pinned)
    untrusted = shape is None or shape.untrusted
    entry = _Entry(env.position, data, _tokens(data), request, link, untrusted)
    return _History(state.entries.append(entry), calls, pinned, pinned_tokens)


def _trusted_system(part: Any) -> bool:
    shape = shape_of_json({"kind": "request", "parts": [part]})
    return shape.system


def _decode(chunks: Sequence[bytes]) -> list[ModelMessage]:
    """Messages from their stored JSON, validated by pydantic-ai's own adapter."""
    return ModelMessagesTypeAdapter.validate_json(b"[" + b",".join(chunks) + b"]")


class JournalHistory:
    """A pydantic-ai conversation stored on one journal stream.

    ``await history.load()`` is the message history to pass as ``message_history``;
    ``await history.save(result)`` appends the run's ``new_messages()``. ``load_sync`` and
    ``save_sync`` are the same for sync code (with a :class:`~contextfold.SyncJournal`, or an
    async journal whose loop runs in another thread). Raises InvalidInputError for a bad
    journal or stream.
    """

    def __init__(self, journal: Journal | SyncJournal, stream: str) -> None:
        self._bridge = JournalBridge(journal, what="JournalHistory")
        self.journal = self._bridge.journal
        self.stream = check_stream(stream)

    def __repr__(self) -> str:
        return f"JournalHistory({self.journal.url!r}, {self.stream!r})"

    # -- reading ---------------------------------------------------------------------------

    async def load(self, budget: float | None = None) -> list[ModelMessage]:
        """The stored messages, oldest first, each equal to what pydantic-ai's own adapter
        returns for the JSON it dumped when saving.

        With ``budget``, the view :func:`budgeted` would hand the model, counted with the
        default counter: only the messages it keeps are decoded. Raises InvalidInputError
        for a bad budget, CorruptEventError naming the position of a stored message that no
        longer validates.
        """
        return list((await self.view(budget)).messages) if budget is not None else await self._all()

    async def view(self, budget: float | None = None) -> HistoryView:
        """Like :meth:`load` with a budget (``None``: no limit), with what trimming did."""
        limit = check_budget(math.inf if budget is None else budget)
        state: _History = await self.journal.fold(HISTORY_FOLD, self.stream)
        entries = state.entries
        start, tokens = choose_start(
            len(entries),
            request=lambda i: entries[i].request,
            link=lambda i: entries[i].link,
            tokens=lambda i: entries[i].tokens,
            budget=limit,
            pinned=state.pinned_tokens,
        )
        kept = [entries[i] for i in range(start, len(entries))]
        lead = [state.pinned] if state.pinned is not None and start > 0 else []
        decoded = self._validated(lead, kept)
        view: list[ModelMessage] = decoded[: len(lead)]
        changed = 0
        for entry, message in zip(kept, decoded[len(lead) :], strict=True):
            if entry.untrusted and isinstance(message, ModelRequest):
                try:
                    message, n = downgraded(message)
                except InvalidInputError as exc:
                    raise CorruptEventError(
                        f"stream {self.stream!r} position {entry.position}: {exc}",
                        stream=self.stream,
                        position=entry.position,
                    ) from exc
                changed += n
            view.append(message)
        return HistoryView(tuple(view), tokens, limit, start, changed)

    async def _all(self) -> list[ModelMessage]:
        state: _History = await self.journal.fold(HISTORY_FOLD, self.stream)
        return self._validated([], list(state.entries))

    def _validated(self, lead: list[bytes], entries: list[_Entry]) -> list[ModelMessage]:
        try:
            return _decode([*lead, *(entry.data for entry in entries)])
        except ValidationError as exc:
            index = exc.errors()[0]["loc"][0]
            at = index - len(lead) if isinstance(index, int) else 0
            position = entries[at].position if 0 <= at < len(entries) else entries[0].position
            raise CorruptEventError(
                f"stream {self.stream!r} position {position}: the stored pydantic-ai message "
                f"does not validate with the installed pydantic-ai: {exc.errors()[0]['msg']}",
                stream=self.stream,
                position=position,
            ) from exc

    # -- writing ---------------------------------------------------------------------------

    async def save(self, result: Any) -> AppendResult | None:
        """Append ``result.new_messages()`` (a run result, or a list of messages) in one
        atomic append; None when there is nothing to save.

        The idempotency key is the SHA-256 of the messages' JSON, so saving the same run
        again writes nothing. Raises InvalidInputError (PayloadError) naming the message at
        fault; nothing is written then.
        """
        messages = _new_messages(result)
        if not messages:
            return None
        dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
        for index, message in enumerate(dumped):
            shape_of_json(message, where=f"messages[{index}]")  # refuse bad markings now
        events = [PydanticAiMessage(message=message) for message in dumped]
        key = "pydantic-ai/messages:" + sha256_hex(canonical_json(dumped))
        runs = {message.run_id for message in messages}
        run_id = runs.pop() if len(runs) == 1 else None
        try:
            check_meta("run_id", run_id)
        except InvalidInputError:
            run_id = None  # one the journal cannot store with each event: saved without it
        try:
            return await self.journal.append(
                self.stream, events, idempotency_key=key, run_id=run_id
            )
        except PayloadError as exc:
            saving = f"saving {len(messages)} messages to {self.stream!r}"
            raise PayloadError(f"{saving}: {exc}") from exc

    # -- sync ------------------------------------------------------------------------------

    def load_sync(self, budget: float | None = None) -> list[ModelMessage]:
        """:meth:`load` for sync code."""
        return self._bridge.run(functools.partial(self.load, budget))

    def save_sync(self, result: Any) -> AppendResult | None:
        """:meth:`save` for sync code."""
        return self._bridge.run(functools.partial(self.save, result))


def _new_messages(result: Any) -> list[ModelMessage]:
    new = getattr(result, "new_messages", None)
    messages = new() if callable(new) else result
    takes = "save() takes a run result (with new_messages()) or a list of pydantic-ai messages"
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInputError(f"{takes}, got {type(result).__name__}")
    return checked_messages(messages, takes=takes, what="save(): ")
