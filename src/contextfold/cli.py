"""The ``contextfold`` command line: a thin layer, each command calls one library function.

Every command reads the journal at ``--url`` (else ``CONTEXTFOLD_URL``, else
:data:`DEFAULT_URL`, where the demo writes). Read commands open it read-only: a missing
file is an error, never a new empty journal. A mistake (a missing journal, an unknown
stream, a cursor or offset that names nothing) is one line on stderr and exit status 1;
a usage error exits 2. Output is never wrapped, so a pipe gets whole lines.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from pathlib import Path
from typing import Annotated, Any

try:
    import typer
except ImportError as exc:  # pragma: no cover - typer is a core dependency
    raise SystemExit("the contextfold CLI needs typer and rich: pip install contextfold") from exc

from ._cli_support import (
    CONNECT_TIMEOUT,
    DEFAULT_URL,
    URL_ENV,
    AsJson,
    DemoUrl,
    Namespace,
    Stream,
    Url,
    _dumps,
    _events,
    _fail,
    _open,
    _print_version,
    _progress,
    _reports_errors,
    _shown,
    _usage_error,
    _where,
    _write,
    console,
    err_console,
)

__all__ = ["CONNECT_TIMEOUT", "DEFAULT_URL", "URL_ENV", "app", "main"]

app = typer.Typer(
    help="contextfold: the context of LLM agents, from an append-only journal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print contextfold's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Options of every command (``contextfold --version``)."""


@app.command()
@_reports_errors
def demo(
    url: DemoUrl = DEFAULT_URL,
    db: Annotated[
        Path | None, typer.Option(help="SQLite journal file to use (instead of --url).")
    ] = None,
    fresh: Annotated[bool, typer.Option(help="Start the demo stream from scratch.")] = True,
    context_window: Annotated[
        int | None,
        typer.Option(
            min=1,
            envvar="CONTEXTFOLD_CONTEXT_WINDOW",
            help="The model's input limit in tokens, for a model contextfold does not know "
            "and whose server does not report one (llama.cpp and vLLM do).",
        ),
    ] = None,
) -> None:
    """Run the demo agent session on an embedded SQLite journal and show what happened."""
    from .demo import run_demo
    from .errors import ModelError
    from .store.urls import parse_store_url

    if db is None:
        parsed = parse_store_url(url)
        if parsed.scheme != "sqlite" or parsed.target == ":memory:":
            _usage_error("--url", f"must name an SQLite file for the demo, got {_shown(url)!r}")
        db = Path(parsed.target)
    try:
        ok = asyncio.run(run_demo(db, fresh=fresh, console=console, context_window=context_window))
    except ModelError as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        console.print(
            "the provider failed; the unanswered request stays recorded in the journal "
            "(`contextfold demo --no-fresh` sends it again). "
            "Unset OPENAI_API_KEY, OPENAI_BASE_URL and ANTHROPIC_API_KEY to run with the "
            "local model.",
            markup=False,
        )
        raise typer.Exit(1) from None
    if not ok:
        raise typer.Exit(1)


@app.command()
@_reports_errors
def streams(
    url: Url = DEFAULT_URL,
    namespace: Namespace = "default",
    prefix: Annotated[str | None, typer.Option(help="Only streams starting with this.")] = None,
    as_json: AsJson = False,
) -> None:
    """List the streams of a journal with their versions (one per line: name, tab, version).

    Every stream is listed, page after page; ``--json`` is the shape of ``GET /v1/streams``
    with all of them in one page.
    """
    from .journal.encode import escape_hidden, shown_name

    async def run() -> list[Any]:
        async with _open(url, namespace) as journal:
            return [info async for info in journal.all_streams(prefix=prefix)]

    found = asyncio.run(run())
    # A name stored before names were checked may hold characters that hide or reorder
    # text: printed escaped, never raw.
    if as_json:
        listed = [{"stream": info.stream, "version": info.version} for info in found]
        _write(escape_hidden(_dumps({"streams": listed, "next": None})))
    else:
        for info in found:
            _write(f"{shown_name(info.stream)}\t{info.version}")
        if not found:
            err_console.print(
                f"no streams in {_where(url, namespace)}", markup=False, highlight=False
            )


@app.command()
@_reports_errors
def events(
    stream: Stream,
    url: Url = DEFAULT_URL,
    namespace: Namespace = "default",
    after: Annotated[
        str | None, typer.Option(help="Start after this cursor (one that events printed).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Most events to print (default: all).")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing events as they land.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document (a page) instead of lines.")
    ] = False,
) -> None:
    """Print a stream's events as JSON lines: position, cursor, type, payload and meta.

    ``--after`` takes a cursor these lines carry; a page cut by ``--limit`` ends with a
    line on stderr giving the cursor to continue from. ``--follow`` on a stream without
    events yet waits for its first ones (saying so on stderr). A corrupt row (not JSON, or no
    longer valid for its event class) is reported on stderr with its stream and position,
    the others are printed, and the exit status is 1.
    """
    if follow and (limit is not None or as_json):
        _usage_error("--follow", "cannot be combined with --limit or --json")
    try:
        corrupt = asyncio.run(_events(url, namespace, stream, after, limit, follow, as_json))
    except KeyboardInterrupt:  # the end of --follow
        raise typer.Exit(130) from None
    if corrupt:
        err_console.print(
            f"{corrupt} corrupt row(s) in stream {stream!r}, not printed",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(1)


@app.command()
@_reports_errors
def rebuild(
    stream: Stream,
    offset: Annotated[int, typer.Argument(help="Offset (@N) of the request event.")],
    url: Url = DEFAULT_URL,
    namespace: Namespace = "default",
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the body with its transport, SHA-256 and manifest."),
    ] = False,
    manifest: Annotated[
        bool,
        typer.Option(
            "--manifest",
            help="Print the request's manifest instead (null outside an event-driven turn).",
        ),
    ] = False,
) -> None:
    """Print the exact body of a recorded model request, rebuilt from the journal.

    A framework's request (a call record) is printed as the canonical JSON of its
    framework, model, messages and options, whose SHA-256 it recorded; ``--json`` adds
    its framework and digests, ``--manifest`` is null for it.
    """
    from .context.rebuild import rebuild_manifest, rebuild_request
    from .errors import RebuildError
    from .inspection import FrameworkRequest, rebuild_framework_request, require_stream

    async def run() -> Any:
        async with _open(url, namespace) as journal:
            version = await require_stream(journal, stream, where=_where(url, namespace))
            if not 1 <= offset <= version:
                raise RebuildError(
                    f"stream {stream!r} has positions 1 to {version}: @{offset} is none of "
                    "them; pass the offset of a request event"
                )
            called = await rebuild_framework_request(journal, stream, offset)
            if called is not None:
                return called, None
            rendered = await rebuild_request(journal, stream, offset)
            return rendered, await rebuild_manifest(journal, stream, offset)

    rendered, recomputed = asyncio.run(run())
    shown = recomputed.model_dump(mode="json") if recomputed is not None else None
    if manifest:
        _write(_dumps(shown))
    elif as_json:
        import orjson

        body = orjson.loads(rendered.body)
        if isinstance(rendered, FrameworkRequest):
            shape = {"stream": stream, "offset": offset, "framework": rendered.framework}
            shape |= {"model": rendered.model, "recorded_sha256": rendered.recorded_sha256}
        else:
            shape = {"stream": stream, "offset": offset, "transport": rendered.transport}
        _write(
            _dumps(
                {
                    **shape,
                    "sha256": rendered.sha256,
                    "size": len(rendered.body),
                    "manifest": shown,
                    "body": body,
                }
            )
        )
    else:
        _write(rendered.body.decode())


@app.command()
@_reports_errors
def ref(
    target: Annotated[
        str,
        typer.Argument(
            metavar="STREAM@OFFSET", help="The ref as item headers write it: stream@offset."
        ),
    ],
    url: Url = DEFAULT_URL,
    namespace: Namespace = "default",
) -> None:
    """Print the whole text a ref names (a tool output or a context item), byte for byte.

    The model saw it cut, with this ref; the text is written as UTF-8 as recorded, with no
    newline added.
    """
    from .context.evidence import parse_ref, read_ref
    from .inspection import require_stream

    stream, offset = parse_ref(target)

    async def run() -> str:
        async with _open(url, namespace) as journal:
            await require_stream(journal, stream, where=_where(url, namespace))
            return await read_ref(journal, stream, offset)

    text = asyncio.run(run())
    sys.stdout.buffer.write(text.encode())
    sys.stdout.flush()


@app.command()
@_reports_errors
def verify(
    stream: Stream,
    url: Url = DEFAULT_URL,
    namespace: Namespace = "default",
    as_json: AsJson = False,
) -> None:
    """Rebuild every recorded request of a stream and report any whose bytes drifted.

    One pass, holding one request at a time: each drift is printed as it is found.
    A corrupt row is reported as a drift too, with its stream and position; the rebuild
    leaves it out, as the folds do. A framework's call records on the stream are checked
    after: each request rebuilt to its recorded digest, each recorded view recomputed,
    each problem printed with its position. A stream without recorded requests has
    nothing to verify: that is said, with exit status 1. ``--json`` lists every drift and
    problem at the end.
    """
    from .context.call_records import CallProblem
    from .context.rebuild import RequestDrift
    from .inspection import Verification, verification_json, verify_stream
    from .store.rows import CorruptRow

    def show(found: RequestDrift | CorruptRow | CallProblem) -> None:
        if isinstance(found, RequestDrift):
            line = f"@{found.request_offset}: {found.error or 'bytes differ'}"
        elif isinstance(found, CallProblem):
            line = f"@{found.position}: {found.problem}"
        else:
            line = f"@{found.position}: corrupt row, {found}"
        console.print(line, markup=False, highlight=False)

    async def run(progress: Any) -> Verification:
        async with _open(url, namespace) as journal:
            return await verify_stream(
                journal,
                stream,
                where=_where(url, namespace),
                progress=progress,
                problem=None if as_json else show,
            )

    with _progress() as progress:
        done = asyncio.run(run(progress))
    if as_json:
        _write(_dumps(verification_json(done)))
        if not done.ok:
            raise typer.Exit(1)
        return
    checked = done.requests or done.framework_requests
    if not checked and not done.corrupt and not done.framework_problem_count:
        _fail(
            f"stream {stream!r} has no recorded requests: nothing to verify (requests are "
            "recorded when an agent, or a framework's integration, sends them)"
        )
    if not done.ok:
        raise typer.Exit(1)
    if done.requests:
        console.print(
            f"all {done.requests} recorded request(s) of {stream!r} rebuild byte for byte",
            markup=False,
            highlight=False,
        )
    if done.framework_requests:
        console.print(
            f"all {done.framework_requests} framework request(s) of {stream!r} "
            f"({', '.join(done.frameworks)}) rebuild to their recorded digest, and the "
            f"{done.framework_views} view(s) that chose their messages recompute",
            markup=False,
            highlight=False,
        )


@app.command()
@_reports_errors
def stats(
    stream: Stream,
    url: Url = DEFAULT_URL,
    namespace: Namespace = "default",
    prices: Annotated[
        Path | None,
        typer.Option(
            envvar="CONTEXTFOLD_PRICES",
            help="A JSON price table overriding the genai-prices catalogue, model by model: "
            "model -> {input, output, cached_input, cache_write} in US dollars per million "
            "tokens (default: $CONTEXTFOLD_PRICES).",
            show_default=False,
        ),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Show a stream's requests, tokens per lane, prompt-cache share, compactions and cost.

    The cache share is measured twice: the bytes of each request that repeat the previous
    request exactly (what a prompt cache can reuse), and the cached input tokens the
    provider reported. Costs come from the genai-prices catalogue, overridden by
    ``--prices``; a model neither knows costs "unknown", never a wrong number.
    """
    from .inspection import require_stream
    from .prices import Prices, load_prices
    from .timeline.build import build_timeline
    from .timeline.stats import stats_json, stats_of, stats_text

    table = Prices(load_prices(prices) if prices is not None and str(prices) else None)

    async def run() -> Any:
        async with _open(url, namespace) as journal:
            await require_stream(journal, stream, where=_where(url, namespace))
            return await build_timeline(journal, stream)

    done = stats_of(asyncio.run(run()), table)
    for line in (_dumps(stats_json(done)),) if as_json else stats_text(done):
        _write(line)


@app.command()
@_reports_errors
def serve(
    url: Url = DEFAULT_URL,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on (0-65535).")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(envvar="CONTEXTFOLD_TOKEN", help="Require 'Authorization: Bearer <token>'."),
    ] = None,
    trusted_token: Annotated[
        list[str] | None,
        typer.Option(
            envvar="CONTEXTFOLD_TRUSTED_TOKEN",
            help="Also accept this token, from a trusted writer: it may append the runtime's "
            "events and items with instruction precedence (repeatable).",
        ),
    ] = None,
    trusted_actor_type: Annotated[
        list[str] | None,
        typer.Option(
            help="An actor type the agents trust (cf.register_actor_type(..., trusted=True)): "
            "only a trusted writer may use it (repeatable).",
        ),
    ] = None,
    runtime_type_prefix: Annotated[
        list[str] | None,
        typer.Option(
            help="A type prefix ('myapp/') of your own runtime_only events: only a trusted "
            "writer may append them (repeatable).",
        ),
    ] = None,
    max_live_streams: Annotated[
        int,
        typer.Option(min=1, help="Live SSE streams served at once; past it, 503 (retry later)."),
    ] = 100,  # server.sse.DEFAULT_MAX_LIVE_STREAMS (the server extra may be absent)
    extra_connections: Annotated[
        int,
        typer.Option(min=0, help="Requests in flight beyond the live streams; past it, 503."),
    ] = 100,  # server.runner.DEFAULT_EXTRA_CONNECTIONS (a test keeps the two equal)
    header_timeout: Annotated[
        float,
        typer.Option(help="Seconds a connection has to send its request headers, or is closed."),
    ] = 10.0,  # server.protocol.DEFAULT_HEADER_TIMEOUT
    create: Annotated[
        bool,
        typer.Option(
            "--create", help="Start a new SQLite journal when the file does not exist yet."
        ),
    ] = False,
    pool_timeout: Annotated[
        float | None,
        typer.Option(
            help="PostgreSQL: seconds a request waits for a database connection before it "
            "gets 503 (default: the URL's pool_timeout=, else 5).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a journal and the transcript kept with it over HTTP + SSE, inspector at /.

    An SQLite journal must exist already (a mistyped path would serve an empty journal):
    ``--create`` starts a new one.
    """
    trusted = tuple(trusted_token or ())
    if not 0 <= port <= 65535:
        _usage_error("--port", f"must be a TCP port from 0 to 65535, got {port}")
    if token is not None and not token:
        _usage_error("--token", "must not be empty (leave it out to serve without a token)")
    if any(not value for value in trusted):
        _usage_error("--trusted-token", "must not be empty")
    if token is not None and token in trusted:
        _usage_error("--trusted-token", "must differ from --token")
    for option, seconds in (("--header-timeout", header_timeout), ("--pool-timeout", pool_timeout)):
        if seconds is not None and not 0 < seconds < float("inf"):
            _usage_error(option, f"must be a positive number of seconds, got {seconds}")
    try:
        from .server import serve as run_server
    except ImportError as exc:  # the server extra is not installed: one line saying so
        _fail(str(exc))

    run_server(
        url,
        host,
        port,
        token=token,
        trusted_tokens=trusted,
        trusted_actor_types=tuple(trusted_actor_type or ()),
        runtime_type_prefixes=tuple(runtime_type_prefix or ()),
        max_live_streams=max_live_streams,
        extra_connections=extra_connections,
        header_timeout=header_timeout,
        create=create,
        pool_timeout=pool_timeout,
    )


workers = typer.Typer(help="Serve every stream of a namespace that has pending triggers.")
app.add_typer(workers, name="worker")


@workers.callback(invoke_without_command=True)
@_reports_errors
def worker(
    ctx: typer.Context,
    url: Url = DEFAULT_URL,
    namespace: Namespace = "default",
    app_spec: Annotated[
        str | None,
        typer.Option("--app", help="module:factory, a function (journal, stream) -> cf.Agent."),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Streams served at once.")] = 4,
    ttl: Annotated[float, typer.Option(min=0.1, help="Seconds a lease lasts unrenewed.")] = 30.0,
) -> None:
    """Claim each stream with pending triggers by lease and run its agent, until SIGTERM."""
    if ctx.invoked_subcommand is not None:
        return
    if app_spec is None:
        _usage_error("--app", "is required: module:factory naming what builds a stream's agent")
    from .runtime.worker_process import load_app, serve_worker

    say = functools.partial(err_console.print, markup=False, highlight=False)
    factory = load_app(app_spec)
    run = serve_worker(url, factory, namespace=namespace, concurrency=concurrency, ttl=ttl, say=say)
    say(f"worker stopped: {asyncio.run(run)}")


@workers.command("status")
@_reports_errors
def worker_status(
    url: Url = DEFAULT_URL, namespace: Namespace = "default", as_json: AsJson = False
) -> None:
    """Who holds which stream's lease: stream, holder, state (held, backoff, released,
    expired) and expiry, one per line."""
    from .runtime.lease import lease_table

    async def run() -> tuple[Any, Any]:
        async with _open(url, namespace) as journal:
            return await lease_table(journal), journal.clock()

    leases, now = asyncio.run(run())
    rows = [record.as_json(now) for record in leases]
    if as_json:
        _write(_dumps({"namespace": namespace, "leases": rows}))
        return
    for row in rows:
        _write("\t".join(str(row[k]) for k in ("stream", "holder", "state", "expires_at")))
    if not rows:
        err_console.print(f"no leases in namespace {namespace!r}", markup=False, highlight=False)


def main() -> None:
    """Run the CLI (each command reports contextfold's errors as one line, exit status 1)."""
    app()
