"""The journal routes: streams, events, the agent context, rebuilt requests, the live tail.

Every route works in the request's namespace (see :func:`.body.request_namespace`) and
raises contextfold errors; :mod:`.errors` turns them into responses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import canonical
from ..context.evidence import read_ref
from ..context.projection import AgentContext
from ..context.rebuild import rebuild_manifest, rebuild_request
from ..errors import InvalidInputError, RebuildError, WrongExpectedVersionError
from ..inspection import require_cursor, require_stream, verification_json, verify_stream
from ..journal import Journal
from ..journal.encode import check_stored_stream, check_stream, check_stream_cursor
from ..store.base import TailReset, parse_cursor
from .body import check_query, parse_append, query_int, read_json, resolve_namespace
from .encode import (
    append_json,
    context_json,
    event_json,
    page_json,
    streams_json,
)
from .sse import EventStreamResponse, SSEMessage, StreamSlots, aclose_iterator
from .writers import ANONYMOUS, Writer, check_keyed_slots, keyed_items, writer_of

__all__ = ["MANIFEST_HEADER", "MAX_PAGE", "SHA256_HEADER", "TRANSPORT_HEADER", "StreamRoutes"]

MAX_PAGE = 1000
SHA256_HEADER = "X-Contextfold-Sha256"
TRANSPORT_HEADER = "X-Contextfold-Transport"
MANIFEST_HEADER = "X-Contextfold-Manifest-Hash"
_REQUEST_VIEWS = ("body", "manifest")
_LIST_QUERY = frozenset({"after", "limit", "namespace", "prefix"})
_KEYED_ATTEMPTS = 3
"""How often an external keyed append re-checks its slots when another writer came first."""


class StreamRoutes:
    """The ``/v1/streams`` routes over one journal (any namespace of it)."""

    def __init__(
        self,
        journal: Journal,
        *,
        max_body_bytes: int,
        heartbeat: float,
        poll_interval: float,
        slots: StreamSlots,
        trusted_writer: bool = False,
        trusted_actor_types: frozenset[str] = frozenset(),
        runtime_type_prefixes: tuple[str, ...] = (),
        namespaces: frozenset[str] | None = None,
    ) -> None:
        self.journal = journal
        self.max_body_bytes = max_body_bytes
        self.heartbeat = heartbeat
        self.poll_interval = poll_interval
        self.slots = slots
        self.trusted_writer = trusted_writer
        self.trusted_actor_types = trusted_actor_types
        self.runtime_type_prefixes = runtime_type_prefixes
        self.namespaces = namespaces

    def routes(self) -> list[Route]:
        base = "/v1/streams"
        return [
            Route(base, self.list_streams, methods=["GET"]),
            # one route for both methods: a 405 (and OPTIONS) then allows both
            Route(base + "/{stream:path}/events", self.events, methods=["GET", "POST"]),
            Route(base + "/{stream:path}/context", self.context, methods=["GET"]),
            Route(base + "/{stream:path}/requests/{offset:int}", self.request, methods=["GET"]),
            Route(base + "/{stream:path}/refs/{offset:int}", self.ref, methods=["GET"]),
            Route(base + "/{stream:path}/verify", self.verify, methods=["GET"]),
            Route(base + "/{stream:path}/tail", self.tail, methods=["GET"]),
        ]

    def _scope(
        self, request: Request, check: Callable[[object], str] = check_stream
    ) -> tuple[Journal, str | None]:
        namespace = resolve_namespace(request, self.journal.namespace, self.namespaces)
        journal = (
            self.journal
            if namespace == self.journal.namespace
            else self.journal.with_namespace(namespace)
        )
        stream = request.path_params.get("stream")
        return journal, check(stream) if stream is not None else None

    def _stream(self, request: Request) -> tuple[Journal, str]:
        journal, stream = self._scope(request)
        assert stream is not None  # every route calling this has {stream} in its path
        return journal, stream

    async def _named(self, request: Request) -> tuple[Journal, str]:
        """The journal and stream of a route that reads: a name stored before names were
        checked for hidden characters is taken while that stream exists (so old data can be
        read), any other name is checked as a new one (a tail never waits on such a name)."""
        try:
            return self._stream(request)
        except InvalidInputError as strict:
            try:
                journal, stream = self._scope(request, check_stored_stream)
            except InvalidInputError:
                raise strict from None
            if stream is None or await journal.version(stream) == 0:
                raise strict from None
            return journal, stream

    async def list_streams(self, request: Request) -> Response:
        """``GET /v1/streams?prefix=&after=&limit=``: a page of the namespace's streams by
        name, with their versions, and ``next``: the ``after`` of the following page (null
        on the last). 400 for a query parameter it does not take or an ``after`` that is
        no stream name."""
        check_query(request, _LIST_QUERY)
        journal, _ = self._scope(request)
        limit = query_int(request, "limit", default=MAX_PAGE, low=1, high=MAX_PAGE)
        prefix = request.query_params.get("prefix") or None
        after = request.query_params.get("after") or None
        if after is not None:
            # A cursor, not a new name: it may be a name stored before names were checked
            # for hidden characters, which a page can end on.
            try:
                check_stream_cursor(after)
            except InvalidInputError as exc:
                raise InvalidInputError(
                    f"query parameter after={after[:80]!r} is no stream name ({exc}): pass "
                    "the next of a previous page, or leave it out to list from the start"
                ) from None
        found = await journal.list_streams(prefix=prefix, limit=limit + 1, after=after)
        page = found[:limit]
        more = len(found) > limit
        return JSONResponse(streams_json(page, page[-1].stream if more else None))

    async def events(self, request: Request) -> Response:
        """``…/events``: :meth:`append` for a POST, else :meth:`read`."""
        return await (self.append if request.method == "POST" else self.read)(request)

    async def append(self, request: Request) -> Response:
        """``POST …/events``: append atomically; 201, or 200 for an idempotent retry."""
        journal, stream = self._stream(request)
        found = writer_of(request.scope, ANONYMOUS)
        trusted = found.trusted or self.trusted_writer
        writer = Writer(found.name, trusted, self.trusted_actor_types, self.runtime_type_prefixes)
        body = parse_append(await read_json(request, max_bytes=self.max_body_bytes), writer)
        keyed = () if writer.trusted else keyed_items(body.events)
        for attempt in range(_KEYED_ATTEMPTS):
            expected = body.expected_version
            if keyed:
                # The slots are checked at one version and the append expects it, so no
                # trusted item can take a slot between the check and the append.
                version = await journal.version(stream)
                check_keyed_slots(await journal.fold(AgentContext, stream), keyed, writer)
                expected = version if expected is None else expected
            try:
                result = await journal.append(
                    stream,
                    body.events,
                    expected_version=expected,
                    idempotency_key=body.idempotency_key,
                    run_id=body.run_id,
                    actor=body.actor,
                )
            except WrongExpectedVersionError:
                if not keyed or body.expected_version is not None or attempt + 1 == _KEYED_ATTEMPTS:
                    raise
                continue  # another writer appended between the check and the append
            return JSONResponse(
                append_json(result), status_code=200 if result.deduplicated else 201
            )
        raise AssertionError("unreachable")

    async def _existing(self, request: Request) -> tuple[Journal, str, int]:
        """The journal, stream and version of a read route: 404 for a stream without events."""
        journal, stream = await self._named(request)
        version = await require_stream(journal, stream, where=f"namespace {journal.namespace!r}")
        return journal, stream, version

    async def read(self, request: Request) -> Response:
        """``GET …/events?after=&limit=``: a page of events, oldest first; 400 for a
        malformed cursor, 404 for one naming no event of the stream."""
        limit = query_int(request, "limit", default=100, low=1, high=MAX_PAGE)
        after = request.query_params.get("after") or None
        if after is not None and parse_cursor(after) is None:
            raise InvalidInputError(
                f"query parameter after={after[:80]!r} is not a cursor: pass the cursor of "
                "an event of this stream"
            )
        journal, stream, _ = await self._existing(request)
        if after is not None:
            await require_cursor(journal, stream, after)
        return JSONResponse(page_json(stream, await journal.read(stream, after=after, limit=limit)))

    async def context(self, request: Request) -> Response:
        """``GET …/context``: the agent context fold of the stream, with item headers."""
        journal, stream, _ = await self._existing(request)
        state = await journal.fold(AgentContext, stream)
        version = await journal.version(stream)
        return JSONResponse(context_json(stream, version, state))

    async def request(self, request: Request) -> Response:
        """``GET …/requests/{offset}``: the exact body of request @offset, rebuilt (its
        manifest's hash in a header); ``?view=manifest``: the manifest, null outside a turn."""
        journal, stream, version = await self._existing(request)
        offset: int = request.path_params["offset"]
        view = request.query_params.get("view", "body")
        if view not in _REQUEST_VIEWS:
            raise InvalidInputError(
                f"unknown request view {view!r}: use one of {', '.join(_REQUEST_VIEWS)}"
            )
        if not 1 <= offset <= version:
            raise RebuildError(
                f"stream {stream!r} has positions 1 to {version}: @{offset} is none of them; "
                "pass the offset of a request event"
            )
        rendered = await rebuild_request(journal, stream, offset)
        manifest = await rebuild_manifest(journal, stream, offset)
        # both views carry the request's headers (the document requires them on the 200)
        headers = {SHA256_HEADER: rendered.sha256, TRANSPORT_HEADER: rendered.transport}
        if manifest is not None:
            headers[MANIFEST_HEADER] = manifest.hash
        if view == "manifest":
            shown = manifest.model_dump(mode="json") if manifest is not None else None
            body = {"stream": stream, "offset": offset, "manifest": shown}
            return JSONResponse(body, headers=headers)
        return Response(rendered.body, media_type="application/json", headers=headers)

    async def ref(self, request: Request) -> Response:
        """``GET …/refs/{offset}``: the whole text the ref ``stream@offset`` names (a tool
        output, its chunks joined, or a context item's content), as UTF-8, byte for byte."""
        journal, stream, _ = await self._existing(request)
        text = await read_ref(journal, stream, request.path_params["offset"])
        return Response(text.encode(), media_type="text/plain; charset=utf-8")

    async def verify(self, request: Request) -> Response:
        """``GET …/verify?limit=``: how many recorded requests were checked, the first
        ``limit`` whose rebuild differs (``drift_count`` counts all) and each corrupt row;
        ``ok`` only when requests were checked and none drifted. One streaming pass that
        holds one request at a time and at most ``limit`` drifts."""
        limit = query_int(request, "limit", default=100, low=1, high=MAX_PAGE)
        journal, stream = await self._named(request)
        where = f"namespace {journal.namespace!r}"
        done = await verify_stream(journal, stream, where=where, keep=limit)
        return JSONResponse(verification_json(done))

    async def tail(self, request: Request) -> Response:
        """``GET …/tail?after=``: SSE of the stream's events from ``after`` on, live.

        Each event's ``id:`` is its cursor, so a reconnecting ``EventSource`` resumes
        after the last event it got (``Last-Event-ID`` wins over ``after``). When the
        cursor names no event of the stream (an unknown cursor, or the stream deleted and
        perhaps recreated while the tail runs), an ``event: reset`` frame with the cursor that
        became unknown comes first and the tail goes on from the beginning of the stream,
        like a read: a client drops what it derived from the events before it.
        """
        journal, stream = await self._named(request)
        after = request.headers.get("last-event-id") or request.query_params.get("after") or None

        async def frames() -> AsyncIterator[SSEMessage]:
            live = journal.subscribe(
                stream, after=after, poll_interval=self.poll_interval, resets=True
            )
            try:
                async for event in live:
                    if isinstance(event, TailReset):
                        data = canonical.dumps({"stream": stream, "after": event.after})
                        yield SSEMessage(data.decode(), event="reset")
                        continue
                    message = SSEMessage(canonical.dumps(event_json(event)), id=event.cursor)
                    del event  # a reader that stops reading holds its frame, not the event too
                    yield message
            finally:
                await aclose_iterator(live)

        self.slots.acquire()
        return EventStreamResponse(
            frames(), heartbeat=self.heartbeat, on_close=self.slots.release, slots=self.slots
        )
