"""The transcript routes: a session's message and part rows, and its live bus as SSE.

Rows hold every finished block; text and reasoning deltas travel only on the bus. A UI
opens ``/live`` *before* it starts a turn (or the first deltas are gone), then reads
``/transcript`` for what was written before it subscribed.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import InvalidInputError
from ..transcript.bus import Subscription, TranscriptBus, encode_bus_event
from ..transcript.history import compacted_history
from ..transcript.parts import MessageWithParts
from ..transcript.store.base import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, TranscriptStore, check_session
from .body import query_int, resolve_namespace
from .encode import transcript_json
from .errors import NotFoundError
from .sse import EventStreamResponse, SSEMessage, StreamSlots

__all__ = ["SessionRoutes"]

_VIEWS = ("full", "compacted")


class SessionRoutes:
    """The ``/v1/sessions`` routes over a transcript store and/or a bus (either may be absent:
    its routes then answer 404 naming what the server was started without)."""

    def __init__(
        self,
        transcript: TranscriptStore | None,
        bus: TranscriptBus | None,
        *,
        default_namespace: str,
        heartbeat: float,
        slots: StreamSlots,
        namespaces: frozenset[str] | None = None,
    ) -> None:
        self.transcript = transcript
        self.bus = bus
        self.default_namespace = default_namespace
        self.heartbeat = heartbeat
        self.slots = slots
        self.namespaces = namespaces

    def routes(self) -> list[Route]:
        return [
            Route("/v1/sessions/{session:path}/transcript", self.rows, methods=["GET"]),
            Route("/v1/sessions/{session:path}/live", self.live, methods=["GET"]),
        ]

    async def rows(self, request: Request) -> Response:
        """``GET …/transcript?after=&limit=&view=full|compacted``: message rows with their parts.

        ``full`` pages through every message; ``compacted`` is the model-facing view
        (``filter_compacted`` of the whole history) in one response.
        """
        if self.transcript is None:
            raise NotFoundError(
                "this server has no transcript store: pass transcript= to create_app"
            )
        namespace = resolve_namespace(request, self.default_namespace, self.namespaces)
        session = check_session(request.path_params["session"])
        store = self.transcript
        if namespace != store.namespace:
            store = store.with_namespace(namespace)
        view = request.query_params.get("view", "full")
        if view not in _VIEWS:
            raise InvalidInputError(
                f"unknown transcript view {view!r}: use one of {', '.join(_VIEWS)}"
            )
        if view == "compacted":
            entries = await compacted_history(store, session)
            return JSONResponse(transcript_json(session, entries, cursor=None, more=False))
        limit = query_int(request, "limit", default=DEFAULT_PAGE_SIZE, low=1, high=MAX_PAGE_SIZE)
        page = await store.page_messages(
            session, after=request.query_params.get("after") or None, limit=limit
        )
        parts = await store.parts_of(session, [m.id for m in page.messages])
        entries = tuple(MessageWithParts(message=m, parts=parts[m.id]) for m in page.messages)
        return JSONResponse(transcript_json(session, entries, cursor=page.cursor, more=page.more))

    async def live(self, request: Request) -> Response:
        """``GET …/live``: SSE of the session's bus events (rows written, deltas) from now on.

        A subscriber that falls too far behind gets a final ``event: error`` frame
        (``BusOverflowError``): re-read the rows and subscribe again.
        """
        if self.bus is None:
            raise NotFoundError("this server has no transcript bus: pass bus= to create_app")
        namespace = resolve_namespace(request, self.default_namespace, self.namespaces)
        session = check_session(request.path_params["session"])
        self.slots.acquire()
        try:
            frames = _BusFrames()
            response = EventStreamResponse(
                frames, heartbeat=self.heartbeat, on_close=self.slots.release, slots=self.slots
            )
            # Subscribed last, once nothing can fail any more (a failure would leave a
            # subscription nobody closes), and before the response starts: nothing
            # published after this is missed.
            frames.subscription = self.bus.subscribe(session, namespace=namespace)
        except BaseException:
            self.slots.release()
            raise
        return response


class _BusFrames:
    """A bus subscription as SSE messages; closing it (even unstarted) unsubscribes."""

    def __init__(self) -> None:
        self.subscription: Subscription | None = None

    def __aiter__(self) -> _BusFrames:
        return self

    async def __anext__(self) -> SSEMessage:
        if self.subscription is None:
            raise StopAsyncIteration
        event = await self.subscription.__anext__()
        return SSEMessage(encode_bus_event(event))

    async def aclose(self) -> None:
        if self.subscription is not None:
            self.subscription.close()
