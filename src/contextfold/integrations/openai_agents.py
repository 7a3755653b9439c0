"""The OpenAI Agents SDK on the journal: :class:`JournalSession`, an SDK ``Session``;
:class:`JournalCompactionSession`, which compacts one by summary as a journal event (see
:mod:`._openai_agents_compaction`); and :class:`JournalModel`, an SDK ``Model`` through
which contextfold renders, records and sends each request, within its own budget (see
:mod:`._openai_agents_model`).

One stream per session, ``openai-agents/session/{session_id}`` (the id escaped: ``%``,
``/``, whitespace and unprintable characters as ``%XX``), holding::

    openai-agents/item-added          one per item, as the SDK gave it (add_items, one append)
    openai-agents/item-retracted      pop_item: the newest item leaves the session
    openai-agents/session-cleared     clear_session: every item before it leaves the session
    openai-agents/session-compacted   the SDK's compaction, then the compacted items
    openai-agents/session-summarized  contextfold's compaction (JournalCompactionSession)

Nothing is ever deleted unless asked (``hard_clear``): the journal keeps every item the
session had, and the SDK sees the effect. A fold over the stream keeps the live items
with the unit each belongs to, so a warm ``get_items`` costs what it returns and a
limited or budgeted read never splits a tool call from its output or a reasoning item
from the item it belongs to (see :mod:`._openai_agents_session`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

from ..canonical import check_json_value, sha256_hex
from ..context.request import ItemHeader
from ..errors import (
    InvalidInputError,
    InvalidStreamNameError,
    PayloadError,
    StoreError,
    WrongExpectedVersionError,
)
from ..events import Event
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream, check_text
from ..views.view import check_budget
from ._actors import untrusted_actor
from ._journal_bridge import JournalBridge
from ._openai_agents_session import (
    SESSION_FOLD,
    ItemAdded,
    ItemRetracted,
    SessionCleared,
    SessionCompacted,
    SessionState,
    StoredItem,
    item_sha256,
    newest_window,
)
from ._pair_safe import checked_counter
from ._stream_names import stream_part

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory import session as _sdk_session
    from agents.memory import session_settings as _sdk_settings

    from ._openai_agents_compaction import JournalCompactionSession, SessionSummarized
    from ._openai_agents_input import MODEL_RECORD, ModelInputRecorded, ModelRecord
    from ._openai_agents_model import JournalModel
except ImportError as exc:  # pragma: no cover - exercised in a child process by the tests
    raise ImportError(
        "contextfold.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'contextfold[openai-agents]'"
    ) from exc

__all__ = [
    "MODEL_RECORD",
    "SESSION_FOLD",
    "ItemAdded",
    "ItemRetracted",
    "JournalCompactionSession",
    "JournalModel",
    "JournalSession",
    "ModelInputRecorded",
    "ModelRecord",
    "SessionCleared",
    "SessionCompacted",
    "SessionState",
    "SessionSummarized",
    "SessionView",
    "session_stream",
]

_ATTEMPTS = 16  # appends retried while only other writers' events move the stream
# The SDK's atomic suffix replacement for its compaction (private there; absent in older
# versions, where the SDK replaces the whole history through _atomic_replace_items).
_Snapshot: Any = getattr(_sdk_session, "_CompactionSnapshot", None)

ItemCounter = Callable[[TResponseInputItem], float]


def session_stream(session_id: str) -> str:
    """The stream of a session. Raises InvalidInputError naming the session id at fault."""
    if not isinstance(session_id, str) or not session_id:
        raise InvalidInputError(f"session_id must be a non-empty str, got {session_id!r:.80}")
    try:
        return check_stream(
            "openai-agents/session/" + stream_part(check_text("session_id", session_id))
        )
    except InvalidStreamNameError as exc:
        raise InvalidStreamNameError(
            f"session_id {session_id!r:.80} makes no stream: {exc}"
        ) from exc


@dataclass(frozen=True, slots=True)
class SessionView:
    """What a read returns: the newest whole units that fit, oldest first."""

    items: tuple[TResponseInputItem, ...]
    tokens: float
    """Tokens of ``items`` by the session's counter (⌈JSON length / 4⌉ by default)."""
    dropped: int
    """Live items older than the view, left out."""


def _check_limit(limit: object) -> int | None:
    """The item limit: None (also for a negative limit, as the SDK's SQLiteSession reads
    it) means every item."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInputError(f"limit must be an int or None, got {limit!r}")
    return None if limit < 0 else limit


def _check_budget(budget: object) -> float | None:
    return None if budget is None else check_budget(budget)


def _stored_tokens(stored: StoredItem) -> float:
    return stored.tokens


def _settings(value: object) -> SessionSettings:
    if value is None:
        return SessionSettings()
    coerce = getattr(_sdk_settings, "coerce_session_settings", None)
    if coerce is not None:
        settings: SessionSettings = coerce(value)  # the SDK's own checks and messages
    elif isinstance(value, SessionSettings):
        settings = value
    elif isinstance(value, dict):  # pragma: no cover - SDK versions without the coercion
        settings = SessionSettings(**value)
    else:  # pragma: no cover
        raise InvalidInputError(f"session_settings must be SessionSettings, got {value!r:.80}")
    _check_limit(settings.limit)
    return settings


def _key(*parts: object) -> str:
    return "openai-agents:" + sha256_hex("\x1f".join(str(part) for part in parts))


class JournalSession:
    """An OpenAI Agents SDK session (``isinstance(s, agents.memory.Session)``) whose items
    live on a journal stream: give it to ``Runner.run(..., session=...)``.

    ``journal`` is a :class:`~contextfold.Journal` (async code) or a
    :class:`~contextfold.SyncJournal` (also for ``Runner.run_sync``). ``stream`` overrides
    :func:`session_stream`. ``session_settings`` are the SDK's (its ``limit`` is the
    default item limit); ``budget`` a default token budget for every read, counted by
    ``count_tokens(item)`` (default ⌈JSON length / 4⌉). ``hard_clear`` makes
    ``clear_session`` delete the stream instead of appending a clear record.
    Raises InvalidInputError for a bad argument.
    """

    def __init__(
        self,
        journal: Journal | SyncJournal,
        session_id: str,
        *,
        stream: str | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        budget: float | None = None,
        count_tokens: ItemCounter | None = None,
        hard_clear: bool = False,
    ) -> None:
        self._bridge = JournalBridge(journal, what="JournalSession")
        derived = session_stream(session_id)  # checks the id, whichever stream is used
        self.stream = derived if stream is None else check_stream(stream)
        self.session_id = session_id
        self.session_settings: SessionSettings | None = _settings(session_settings)
        self.budget = _check_budget(budget)
        if count_tokens is not None and not callable(count_tokens):
            raise InvalidInputError(f"count_tokens must be a function, got {count_tokens!r:.80}")
        self.count_tokens = count_tokens
        if not isinstance(hard_clear, bool):
            raise InvalidInputError(f"hard_clear must be True or False, got {hard_clear!r}")
        self.hard_clear = hard_clear
        # add_items whose outcome is unknown (the store failed mid-append): digest -> the
        # version it was made at, so the caller's retry is the same idempotent append.
        self._unsettled: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<JournalSession {self.session_id!r} on {self.stream!r}>"

    @property
    def journal(self) -> Journal:
        return self._bridge.journal

    def _run(self, work: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        return self._bridge.arun(work)

    async def _state(self) -> SessionState:
        return await self.journal.fold(SESSION_FOLD, self.stream)

    # -- reading ------------------------------------------------------------------------------

    def _counter(self) -> Callable[[StoredItem], float] | None:
        count = self.count_tokens
        if count is None:
            return None
        return checked_counter(
            lambda stored: count(cast(TResponseInputItem, stored.decode())),
            default=_stored_tokens,
            what=lambda stored: f"the item at {self.stream}@{stored.position}",
        )

    async def view(self, *, limit: int | None = None, budget: float | None = None) -> SessionView:
        """The newest whole units with at most ``limit`` items (default: the session
        settings' limit; a negative limit: every item, as with the SDK's SQLiteSession) and
        at most ``budget`` tokens (default: the session's budget).
        A unit that does not fit is left out whole: the limit rounds down to whole units.
        Raises InvalidInputError for a bad limit or budget."""
        settings = self.session_settings
        chosen = _check_limit(
            limit if limit is not None else (settings.limit if settings else None)
        )
        tokens = _check_budget(budget if budget is not None else self.budget)
        state = await self._run(self._state)
        window = newest_window(state, limit=chosen, budget=tokens, count=self._counter())
        items = tuple(
            cast(TResponseInputItem, state.items[index].decode())
            for index in range(window.start, state.length)
        )
        return SessionView(items, window.tokens, window.start)

    async def get_items(
        self, limit: int | None = None, *, budget: float | None = None
    ) -> list[TResponseInputItem]:
        """The session's newest items, oldest first (see :meth:`view`): all of them
        without a limit or budget."""
        return list((await self.view(limit=limit, budget=budget)).items)

    # -- writing ------------------------------------------------------------------------------

    def _events(self, items: object) -> list[Event]:
        if not isinstance(items, (list, tuple)):
            raise InvalidInputError(
                f"session {self.session_id!r}: add_items takes a list of items, "
                f"got {type(items).__name__}"
            )
        events: list[Event] = []
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidInputError(
                    f"session {self.session_id!r}: items[{index}] is a {type(item).__name__}, "
                    "not an input item (a dict)"
                )
            try:
                check_json_value(item, where=f"items[{index}]")
            except ValueError as exc:
                raise PayloadError(f"session {self.session_id!r}: {exc}") from exc
            events.append(ItemAdded(item=item))
        return events

    async def _append(
        self,
        make: Callable[[SessionState], Sequence[Event] | None],
        key: Callable[[int, SessionState], str | None],
        *,
        own: int | None = None,
        lost: Callable[[int], None] | None = None,
    ) -> SessionState | None:
        """Append ``make(state)`` at the session's version (``own``: the position of its
        newest event; by default the one read now), with ``key(own, state)``. Retried
        while only other writers' events moved the stream; remade from the new state when
        the session itself changed. ``make`` returning None appends nothing (returns None);
        else returns the state the events were made from. A store failure other than a
        conflict calls ``lost(own)`` (the outcome is unknown) and is raised."""
        state = await self._state()
        own = state.last_position if own is None else own
        expected = own
        events = make(state)
        for _ in range(_ATTEMPTS):
            if events is None:
                return None
            try:
                await self.journal.append(
                    self.stream, events, expected_version=expected, idempotency_key=key(own, state)
                )
                return state
            except WrongExpectedVersionError as exc:
                fresh = await self._state()  # read after the refusal: sees its cause
                if fresh.last_position == own:
                    expected = exc.actual
                    continue
                state, own, expected = fresh, fresh.last_position, fresh.last_position
                events = make(state)
            except StoreError:
                if lost is not None:
                    lost(own)
                raise
        raise StoreError(f"stream {self.stream!r} moved under {_ATTEMPTS} appends in a row")

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` as one atomic append, idempotent: the key is derived from the
        items and the session version they were added at, so a retry of a call whose
        outcome was lost writes nothing twice. Raises InvalidInputError (PayloadError)
        naming the item at fault; nothing is stored then."""
        events = self._events(items)
        if not events:
            return
        digest = sha256_hex(orjson.dumps(list(items)))

        def lost(own: int) -> None:
            self._unsettled[digest] = own

        async def add() -> None:
            await self._append(
                lambda state: events,
                lambda own, state: _key("add", self.stream, own, digest),
                own=self._unsettled.pop(digest, None),
                lost=lost,
            )

        await self._run(add)

    async def pop_item(self) -> TResponseInputItem | None:
        """Retract the newest item and return it (None when the session is empty): an
        ``item-retracted`` record appended at the version read, never a deletion."""

        def retraction(state: SessionState) -> list[Event] | None:
            if not state.length:
                return None
            newest = state.item(state.length - 1)
            return [ItemRetracted(position=newest.position, sha256=item_sha256(newest))]

        def key(own: int, state: SessionState) -> str:
            newest = state.item(state.length - 1)
            return _key("pop", self.stream, newest.position, item_sha256(newest))

        async def pop() -> TResponseInputItem | None:
            state = await self._append(retraction, key)
            if state is None:
                return None
            return cast(TResponseInputItem, state.item(state.length - 1).decode())

        result: TResponseInputItem | None = await self._run(pop)
        return result

    async def clear_session(self, *, hard: bool | None = None) -> None:
        """Empty the session: a ``session-cleared`` record (the journal keeps the items),
        or with ``hard`` (default: the session's ``hard_clear``) the stream deleted."""
        if hard is not None and not isinstance(hard, bool):
            raise InvalidInputError(f"hard must be True, False or None, got {hard!r}")

        async def clear() -> None:
            self._unsettled.clear()
            if self.hard_clear if hard is None else hard:
                await self.journal.delete_stream(self.stream)
                return
            state = await self._state()
            if state.length:
                await self.journal.append(self.stream, SessionCleared(items=state.length))

        await self._run(clear)

    async def add_untrusted(
        self, content: str, *, actor: str, id: str | None = None, origin: str | None = None
    ) -> TResponseInputItem:
        """Add content from an untrusted source (a webhook, a chat, an email) as user
        input, whatever it claims to be: its first line is contextfold's item header
        naming the actor (``@<position> actor=email actor_id="..."``), then the content.
        The record keeps the actor. Returns the item added. Raises InvalidInputError for
        a trusted or malformed actor type, or content that is not text."""
        if not isinstance(content, str):
            raise InvalidInputError(
                f"add_untrusted takes the content as text, got {type(content).__name__}"
            )
        source = untrusted_actor(actor, id, origin=origin, what="add_untrusted")

        def event(position: int) -> ItemAdded:
            header = ItemHeader(offset=position, actor=source.type, actor_id=source.id)
            item = {"role": "user", "content": f"{header.render()}\n{content}"}
            return ItemAdded(item=item, actor=source)

        async def add() -> ItemAdded:
            version = await self.journal.version(self.stream)
            for _ in range(_ATTEMPTS):
                made = event(version + 1)  # the position it gets: appended at that version
                key = _key("untrusted", self.stream, version, source.type, source.id, content)
                try:
                    await self.journal.append(
                        self.stream, made, expected_version=version, idempotency_key=key
                    )
                    return made
                except WrongExpectedVersionError as exc:
                    version = exc.actual
            raise StoreError(f"stream {self.stream!r} moved under {_ATTEMPTS} appends in a row")

        added: ItemAdded = await self._run(add)
        return cast(TResponseInputItem, dict(added.item))

    # -- the SDK's compaction (OpenAIResponsesCompactionSession) ------------------------------

    def _own_storage(self) -> bool:
        """Whether items are read and written as JournalSession does. A subclass overriding
        ``get_items``, ``view``, ``add_items`` or ``clear_session`` (to transform items, keep
        an index) gets no atomic replacement and no snapshot, which would bypass it: the SDK
        then compacts through its ``clear_session`` and ``add_items``, as it does for a
        subclass of its own sessions."""
        cls = type(self)
        return all(
            getattr(cls, name) is getattr(JournalSession, name)
            for name in ("get_items", "view", "add_items", "clear_session")
        )

    def _compaction(
        self,
        replaces_from: int | None,
        replaced: int,
        items: Sequence[TResponseInputItem],
        kept: Sequence[StoredItem] = (),
    ) -> list[Event]:
        copies = [ItemAdded(item=stored.decode(), actor=stored.actor) for stored in kept]
        added = [*copies, *self._events(list(items))]
        marker = SessionCompacted(replaces_from=replaces_from, replaced=replaced, items=len(added))
        return [marker, *added]

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The compaction session's whole-history replacement, as one append: a
        ``session-compacted`` record, then the compacted items. False (the SDK then clears
        and adds) for a subclass with storage of its own."""
        if not self._own_storage():
            return False

        async def replace() -> bool:
            state = await self._state()
            await self.journal.append(self.stream, self._compaction(None, state.length, items))
            return True

        done: bool = await self._run(replace)
        return done

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[TResponseInputItem], bool] | None = None
    ) -> Any:
        """The compaction session's bounded snapshot: the newest ``limit`` items exactly, and
        a replacement of a suffix of them that is appended at the version read, so it
        applies only to the history it saw (else it reports False and changes nothing).
        None (the SDK then checks the complete history) when this SDK has no snapshots or
        for a subclass with storage of its own.

        ``prune_prefix`` (the SDK's EncryptedSession passes its expiry test) names the
        oldest items that leave the session with the compaction, as the SDK's SQLite
        sessions delete them: the run of them from the oldest on, cut back to whole units.
        The items between them and the suffix stay, copied after the compaction record
        (items leave a session from its end or all at once); the journal keeps every
        record."""
        if _Snapshot is None or not self._own_storage():
            return None
        if prune_prefix is not None and not callable(prune_prefix):
            raise InvalidInputError(f"prune_prefix must be a function, got {prune_prefix!r:.80}")
        count = _check_limit(limit)
        state: SessionState = await self._run(self._state)
        start = 0 if count is None else max(0, state.length - count)
        window = [state.items[index] for index in range(start, state.length)]

        def pruned(end: int) -> int:
            """How many of the oldest items before index ``end`` leave."""
            cut = 0
            while (
                prune_prefix is not None
                and cut < end
                and prune_prefix(cast(TResponseInputItem, state.items[cut].decode()))
            ):
                cut += 1
            while cut < end:  # whole units: no item kept travels with one that leaves
                low = min(state.items[index].link for index in range(cut, end))
                if low >= cut:
                    break
                cut = low
            return cut

        async def replace_suffix(first: int, output: list[TResponseInputItem]) -> bool:
            if not 0 <= first < len(window):
                return False
            end = start + first
            leaving = pruned(end)
            if leaving:  # the whole history, the items between the two copied
                kept = [state.items[index] for index in range(leaving, end)]
                events = self._compaction(None, state.length, output, kept)
            else:
                events = self._compaction(window[first].position, len(window) - first, output)

            def unchanged(now: SessionState) -> list[Event] | None:
                # Only onto the history the snapshot saw: a changed session is left alone.
                return events if now.last_position == state.last_position else None

            async def replace() -> bool:
                done = await self._append(unchanged, lambda own, now: None)
                return done is not None

            replaced: bool = await self._run(replace)
            return replaced

        items = [cast(TResponseInputItem, stored.decode()) for stored in window]
        return _Snapshot(items, start == 0, replace_suffix)
