"""The trace routes the inspector reads: a stream's timeline of turns, one request in full,
the context as of any offset, event search, stats, and the transcript's sessions.

    GET /v1/streams/{stream}/trace?start=&limit=      turns (newest page by default), stats
    GET /v1/streams/{stream}/trace/{offset}           request @offset: body, header, diff
    GET /v1/streams/{stream}/context/{offset}         the agent context folded through @offset
    GET /v1/streams/{stream}/search?q=&type=&actor=&after=&limit=   matching events, paged
    GET /v1/streams/{stream}/stats                    requests, tokens, cache share, cost
    GET /v1/sessions?prefix=                          transcript sessions, and whether /live is

A timeline is built incrementally and kept per stream (a few streams): a read after an
append folds only the new events. A framework's call records make turns and requests like
an agent's; such a request's page is its body rebuilt from the records. Costs come from
``app.state.prices`` (a :class:`~contextfold.timeline.PriceTable` overriding the
catalogue, or a :class:`~contextfold.prices.Prices`), else ``prices=``, else
``genai-prices``' catalogue overridden by the table ``CONTEXTFOLD_PRICES`` names.
Read-only: nothing here writes.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..context.rebuild import rebuild_state
from ..errors import CorruptEventError, InvalidInputError, RebuildError
from ..events import StoredEvent
from ..inspection import event_json, read_call_records, require_cursor, require_stream
from ..journal import Journal
from ..journal.encode import check_stream
from ..prices import Prices, PriceTable, Pricing, default_prices
from ..store.base import parse_cursor
from ..timeline.build import Timeline, TimelineBuilder
from ..timeline.detail import request_bodies
from ..timeline.encode import bodies_json, framework_page_json, timeline_json
from ..timeline.stats import stats_json, stats_of
from ..transcript.bus import TranscriptBus
from ..transcript.store.base import TranscriptStore
from .body import query_int, resolve_namespace
from .encode import context_json

__all__ = ["MAX_TURNS", "SEARCH_SCAN", "TraceRoutes"]

MAX_TURNS = 200
"""Most turns of one trace page."""
SEARCH_SCAN = 5000
"""Most events one search request looks through (it says where to go on)."""
_KEPT_TIMELINES = 16
_PAGE = 1000


class TraceRoutes:
    """The trace routes over one journal (any namespace of it) and its transcript."""

    def __init__(
        self,
        journal: Journal,
        transcript: TranscriptStore | None = None,
        bus: TranscriptBus | None = None,
        *,
        namespaces: frozenset[str] | None = None,
        prices: Pricing | None = None,
    ) -> None:
        self.journal = journal
        self.transcript = transcript
        self.bus = bus
        self.namespaces = namespaces
        self.prices = prices if prices is not None else default_prices()
        self._builders: OrderedDict[tuple[str, str], TimelineBuilder] = OrderedDict()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def routes(self) -> list[Route]:
        base = "/v1/streams/{stream:path}"
        return [
            Route(base + "/trace", self.trace, methods=["GET"]),
            Route(base + "/trace/{offset:int}", self.request_page, methods=["GET"]),
            Route(base + "/context/{offset:int}", self.context_at, methods=["GET"]),
            Route(base + "/search", self.search, methods=["GET"]),
            Route(base + "/stats", self.stats, methods=["GET"]),
            Route("/v1/sessions", self.sessions, methods=["GET"]),
        ]

    # -- helpers ------------------------------------------------------------------------------

    def _journal(self, request: Request) -> Journal:
        namespace = resolve_namespace(request, self.journal.namespace, self.namespaces)
        if namespace == self.journal.namespace:
            return self.journal
        return self.journal.with_namespace(namespace)

    async def _stream(self, request: Request) -> tuple[Journal, str, int]:
        journal = self._journal(request)
        stream = check_stream(request.path_params["stream"])
        version = await require_stream(journal, stream, where=f"namespace {journal.namespace!r}")
        return journal, stream, version

    def _prices(self, request: Request) -> Pricing:
        table = getattr(request.app.state, "prices", None)
        if isinstance(table, PriceTable):
            return Prices(table)
        return table if isinstance(table, Prices) else self.prices

    async def timeline(self, journal: Journal, stream: str) -> Timeline:
        """The stream's timeline, folding only the events appended since the last call."""
        key = (journal.namespace, stream)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            builder = self._builders.pop(key, None) or TimelineBuilder(stream)
            while True:
                page = await journal.read(stream, after=builder.cursor, limit=_PAGE)
                if page.reset:  # deleted (and perhaps recreated) since: start again
                    builder = TimelineBuilder(stream)
                    continue
                for event in page.events:
                    builder.add(event)
                if not page.more:
                    break
            self._builders[key] = builder
            while len(self._builders) > _KEPT_TIMELINES:
                old, _ = self._builders.popitem(last=False)
                self._locks.pop(old, None)
            return builder.snapshot()

    # -- routes -------------------------------------------------------------------------------

    async def trace(self, request: Request) -> Response:
        """``GET …/trace?start=&limit=``: turns from ``start`` (default: the newest page)."""
        journal, stream, _ = await self._stream(request)
        limit = query_int(request, "limit", default=50, low=1, high=MAX_TURNS)
        timeline = await self.timeline(journal, stream)
        total = len(timeline.turns)
        start = query_int(request, "start", default=max(total - limit, 0), low=0, high=2**62)
        prices = self._prices(request)
        return JSONResponse(timeline_json(timeline, start=start, limit=limit, prices=prices))

    async def request_page(self, request: Request) -> Response:
        """``GET …/trace/{offset}``: request @offset rebuilt, its header, verify status and
        diff against the previous request; 404 when @offset is no request."""
        journal, stream, version = await self._stream(request)
        offset: int = request.path_params["offset"]
        if not 1 <= offset <= version:
            raise RebuildError(
                f"stream {stream!r} has positions 1 to {version}: @{offset} is none of them; "
                "pass the offset of a request event"
            )
        timeline = await self.timeline(journal, stream)
        trace = next((r for r in timeline.requests if r.offset == offset), None)
        if trace is not None and trace.framework is not None:  # a framework's call record
            calls = await read_call_records(journal, stream)
            page = framework_page_json(stream, calls, trace, self._prices(request))
            return JSONResponse(page)
        bodies = await request_bodies(journal, stream, offset)
        return JSONResponse(bodies_json(stream, bodies, trace, self._prices(request)))

    async def context_at(self, request: Request) -> Response:
        """``GET …/context/{offset}``: the agent context as it was at @offset."""
        journal, stream, version = await self._stream(request)
        offset: int = request.path_params["offset"]
        if not 1 <= offset <= version:
            raise RebuildError(
                f"stream {stream!r} has positions 1 to {version}: @{offset} is none of them"
            )
        state = await rebuild_state(journal, stream, offset)
        return JSONResponse(context_json(stream, offset, state))

    async def stats(self, request: Request) -> Response:
        """``GET …/stats``: the stream's totals (as ``contextfold stats --json``)."""
        journal, stream, _ = await self._stream(request)
        timeline = await self.timeline(journal, stream)
        return JSONResponse(stats_json(stats_of(timeline, self._prices(request))))

    async def search(self, request: Request) -> Response:
        """``GET …/search?q=&type=&actor=&after=&limit=``: events after ``after`` whose type,
        actor and text match, oldest first. One call looks through at most
        :data:`SEARCH_SCAN` events; ``cursor`` says where the next call goes on."""
        limit = query_int(request, "limit", default=100, low=1, high=_PAGE)
        after = request.query_params.get("after") or None
        if after is not None and parse_cursor(after) is None:
            raise InvalidInputError(
                f"query parameter after={after[:80]!r} is not a cursor: pass the cursor of "
                "an event of this stream"
            )
        journal, stream, _ = await self._stream(request)
        if after is not None:
            await require_cursor(journal, stream, after)
        match = _Match(
            text=request.query_params.get("q", ""),
            type=request.query_params.get("type", ""),
            actor=request.query_params.get("actor", ""),
        )
        found: list[dict[str, Any]] = []
        cursor, scanned, more = after, 0, False
        while len(found) < limit and scanned < SEARCH_SCAN:
            page = await journal.read(stream, after=cursor, limit=min(_PAGE, SEARCH_SCAN - scanned))
            if not page.events:
                more = False
                break
            for event in page.events:
                scanned += 1
                cursor = event.cursor
                if match(event):
                    found.append(event_json(event))
                    if len(found) == limit:
                        break
            more = page.more or cursor != page.cursor
            if not more:
                break
        return JSONResponse(
            {"stream": stream, "events": found, "cursor": cursor, "more": more, "scanned": scanned}
        )

    async def sessions(self, request: Request) -> Response:
        """``GET /v1/sessions?prefix=``: the transcript's sessions, newest last, and whether
        this server has a transcript store and a live bus."""
        namespace = resolve_namespace(request, self.journal.namespace, self.namespaces)
        prefix = request.query_params.get("prefix", "")
        listed: list[dict[str, str]] = []
        if self.transcript is not None:
            store = self.transcript
            if namespace != store.namespace:
                store = store.with_namespace(namespace)
            listed = [
                {"id": s.id, "created": s.created, "updated": s.updated}
                for s in await store.sessions()
                if s.id.startswith(prefix)
            ]
        return JSONResponse(
            {
                "sessions": listed,
                "transcript": self.transcript is not None,
                "live": self.bus is not None,
            }
        )


class _Match:
    """A search's filters: all given ones must match (case-insensitive)."""

    def __init__(self, *, text: str, type: str, actor: str) -> None:
        self.text = text.lower()
        self.type = type.lower()
        self.actor = actor.lower()

    def __call__(self, event: StoredEvent) -> bool:
        if self.type:
            name = event.type.lower()
            if name != self.type and not name.endswith("/" + self.type):
                return False
        if self.actor and self.actor not in _actors(event):
            return False
        if self.text:
            raw = event.data.decode("utf-8", errors="replace").lower()
            if self.text not in raw and self.text not in event.type.lower():
                return False
        return True


def _actors(event: StoredEvent) -> set[str]:
    """The names an event's actor goes by: its journal writer, and a payload actor's type
    and ``type:id``."""
    names = {event.meta.actor.lower()} if event.meta.actor else set()
    try:
        payload = event.payload
    except CorruptEventError:  # a corrupt row has no payload actor
        payload = None
    actor = payload.get("actor") if isinstance(payload, dict) else None
    if isinstance(actor, dict) and isinstance(actor.get("type"), str):
        kind = actor["type"].lower()
        names.add(kind)
        if isinstance(actor.get("id"), str):
            names.add(f"{kind}:{actor['id'].lower()}")
    return names
