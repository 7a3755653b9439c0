"""The Google ADK sides of ``benchmarks/frameworks.py``: ADK's ``SqliteSessionService`` (what
ADK's own tools open for a ``sqlite://`` URI and for ``.adk/session.db``) against contextfold's
``JournalSessionService`` on a SQLite journal.

Each turn appends four events through ``append_event``: the user's message, the agent's
function call, the function response carrying the 2,000-character result, the agent's answer.
A Runner reads the session before each invocation with ``get_session`` and the run config's
``GetSessionConfig``: by default none, so every event (``get_session()``); the model is then
handed the newest whole units within the budget. contextfold's service reads only what it
returns, so its load asks for the newest events (``num_recent_events``, widened until the
budget is exhausted inside them). The baseline runs that same read too (``windowed``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from _frameworks_sides import FileSide, JournalSide, NewestUnits
from _frameworks_workload import Loader, TurnText, approx, digest
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.session import Session
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types

import contextfold as cf
from contextfold.integrations.adk import JournalSessionService

__all__ = ["NAME", "Baseline", "Contextfold", "baseline", "contextfold", "events_of"]

NAME = "adk"
APP, USER, SESSION = "bench", "user", "session"
AGENT = "catalog"
_START = 1_750_000_000.0


def events_of(text: TurnText) -> list[Event]:
    """One turn as ADK's runner appends it (fixed ids and timestamps)."""

    def event(k: int, author: str, role: str, part: types.Part) -> Event:
        return Event(
            id=f"e{text.turn}-{k}",
            invocation_id=f"inv-{text.turn}",
            author=author,
            timestamp=_START + 4 * text.turn + k,
            content=types.Content(role=role, parts=[part]),
        )

    call = types.FunctionCall(id=text.call_id, name=text.tool, args=dict(text.arguments))
    response = types.FunctionResponse(
        id=text.call_id, name=text.tool, response={"result": text.result}
    )
    return [
        event(0, "user", "user", types.Part(text=text.user)),
        event(1, AGENT, "model", types.Part(function_call=call)),
        event(2, AGENT, "user", types.Part(function_response=response)),
        event(3, AGENT, "model", types.Part(text=text.answer)),
    ]


def _size(event: Event) -> int:
    return approx(event.model_dump_json(exclude_none=True))


def _calls(event: Event) -> tuple[Iterable[str], Iterable[str]]:
    made = [call.id for call in event.get_function_calls() if call.id]
    answered = [response.id for response in event.get_function_responses() if response.id]
    return made, answered


def _digest(context: Sequence[Any]) -> str:
    return digest(event.model_dump_json(exclude_none=True).encode() for event in context)


class _Service:
    """One session of one ADK session service: appends, full reads, newest-events reads."""

    def __init__(self, service: BaseSessionService, budget: float) -> None:
        self.service = service
        self.units = NewestUnits(budget, size=_size, calls=_calls)
        self.session: Session | None = None

    async def write(self, text: TurnText, *, loading: bool) -> None:
        if self.session is None:
            self.session = await self.service.create_session(
                app_name=APP, user_id=USER, session_id=SESSION
            )
        for event in events_of(text):
            await self.service.append_event(self.session, event)

    async def _get(self, config: GetSessionConfig | None) -> list[Event]:
        session = await self.service.get_session(
            app_name=APP, user_id=USER, session_id=SESSION, config=config
        )
        assert session is not None
        return session.events

    async def load(self) -> Sequence[Any]:
        return await self.units.whole(lambda: self._get(None))

    async def windowed(self) -> Sequence[Any]:
        async def fetch(n: int) -> Sequence[Any]:
            return await self._get(GetSessionConfig(num_recent_events=n))

        return await self.units.windowed(fetch)


class Baseline(FileSide):
    """ADK's SqliteSessionService on a file."""

    digest = staticmethod(_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("SqliteSessionService", path, budget)
        self.service = _Service(SqliteSessionService(db_path=str(path)), budget)
        self.loaders: dict[str, Loader] = {
            "get_session()": self.service.load,
            "windowed": self.service.windowed,
        }

    async def write(self, text: TurnText, *, loading: bool) -> None:
        await self.service.write(text, loading=loading)

    async def close(self) -> None:
        close = getattr(self.service.service, "close", None)
        if close is not None:
            await close()


class Contextfold(JournalSide):
    """contextfold's JournalSessionService on a SQLite journal."""

    digest = staticmethod(_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("JournalSessionService", path, budget)
        self.service = _Service(JournalSessionService(self.journal), budget)
        self.loaders: dict[str, Loader] = {"windowed": self.service.windowed}

    async def write(self, text: TurnText, *, loading: bool) -> None:
        await self.service.write(text, loading=loading)

    def first_load(self, journal: cf.Journal) -> Callable[[], Awaitable[object]]:
        return _Service(JournalSessionService(journal), self.budget).windowed


def baseline(directory: Path, budget: float) -> Baseline:
    return Baseline(directory / "sessions.db", budget)


def contextfold(directory: Path, budget: float) -> Contextfold:
    return Contextfold(directory / "contextfold.db", budget)
