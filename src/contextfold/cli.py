"""The ``contextfold`` command line: a thin layer, each command calls one library function."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, NoReturn

try:
    import typer
    from rich.console import Console
except ImportError as exc:  # pragma: no cover - typer and rich are core dependencies
    raise SystemExit("the contextfold CLI needs typer and rich: pip install contextfold") from exc

__all__ = ["app", "main"]


app = typer.Typer(
    help="contextfold: the context of LLM agents, from an append-only journal.",
    no_args_is_help=True,
)
console = Console()

DEMO_DB = Path(".contextfold/demo.db")
DEMO_URL = f"sqlite:///{DEMO_DB}"
Url = Annotated[str, typer.Option(help="Journal URL: sqlite:///path.db, postgresql://…")]
Stream = Annotated[str, typer.Argument(help="Stream name.")]


@app.command()
def demo(
    db: Annotated[Path, typer.Option(help="SQLite journal file to use.")] = DEMO_DB,
    fresh: Annotated[bool, typer.Option(help="Start the demo stream from scratch.")] = True,
) -> None:
    """Run the demo agent session on an embedded SQLite journal and show what happened."""
    from .demo import run_demo
    from .runtime.models import ModelError

    try:
        ok = asyncio.run(run_demo(db, fresh=fresh, console=console))
    except ModelError as exc:
        console.print(f"error: {exc}", style="red", markup=False)
        console.print(
            "the provider failed; the unanswered request stays recorded in the journal "
            "(`contextfold demo --no-fresh` sends it again). "
            "Unset OPENAI_API_KEY and ANTHROPIC_API_KEY to run with the local model.",
            markup=False,
        )
        raise typer.Exit(1) from None
    if not ok:
        raise typer.Exit(1)


@app.command()
def streams(url: Url = DEMO_URL) -> None:
    """List the streams of a journal with their versions."""
    from .journal import open_journal_sync

    with open_journal_sync(url) as journal:
        for info in journal.list_streams():
            console.print(f"{info.stream}\t{info.version}", markup=False)


@app.command()
def events(
    stream: Stream,
    url: Url = DEMO_URL,
    after: Annotated[str | None, typer.Option(help="Cursor to read after.")] = None,
    limit: Annotated[int, typer.Option(help="Most events to print.")] = 100,
) -> None:
    """Print a stream's events as JSON lines: position, type and payload.

    A corrupt row (not JSON, or no longer valid for its event class) is reported on stderr
    with its stream and position, the others are printed, and the exit status is 1.
    """
    from .journal import open_journal_sync
    from .store.rows import corrupt_row

    corrupt = 0
    with open_journal_sync(url) as journal:
        page = journal.read(stream, after=after, limit=limit)
        for event in page.events:
            bad = corrupt_row(event)
            if bad is None:
                sys.stdout.write(f"{event.position}\t{event.type}\t{event.data.decode()}\n")
            else:
                corrupt += 1
                sys.stderr.write(f"corrupt row: {bad}\n")
    if corrupt:
        sys.stderr.write(f"{corrupt} corrupt row(s) in stream {stream!r}, not printed\n")
        raise typer.Exit(1)


@app.command()
def rebuild(
    stream: Stream,
    offset: Annotated[int, typer.Argument(help="Offset (@N) of the request event.")],
    url: Url = DEMO_URL,
) -> None:
    """Print the exact body of a recorded model request, rebuilt from the journal."""
    from .context.rebuild import rebuild_request
    from .journal import open_journal

    async def run() -> bytes:
        async with open_journal(url) as journal:
            return (await rebuild_request(journal, stream, offset)).body

    sys.stdout.write(asyncio.run(run()).decode() + "\n")


@app.command()
def verify(stream: Stream, url: Url = DEMO_URL) -> None:
    """Rebuild every recorded request of a stream and report any whose bytes drifted.

    A corrupt row is reported as a drift too, with its stream and position; the rebuild
    leaves it out, as the folds do.
    """
    from .context.rebuild import verify_requests
    from .journal import open_journal
    from .store.rows import SkipCorrupt

    async def run() -> int:
        async with open_journal(url) as journal:
            reader = SkipCorrupt(journal)
            drifts = await verify_requests(reader, stream)
        for row in reader.corrupt:
            console.print(f"@{row.position}: corrupt row, {row}", markup=False, soft_wrap=True)
        for drift in drifts:
            console.print(f"@{drift.request_offset}: {drift.error or 'bytes differ'}", markup=False)
        return len(drifts) + len(reader.corrupt)

    if asyncio.run(run()):
        raise typer.Exit(1)
    console.print("every recorded request rebuilds byte for byte")


@app.command()
def serve(
    url: Url = "sqlite:///contextfold.db",
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
) -> None:
    """Serve a journal over HTTP + SSE, with the web inspector at /."""
    trusted = tuple(trusted_token or ())
    if not 0 <= port <= 65535:
        _usage_error("--port", f"must be a TCP port from 0 to 65535, got {port}")
    if token is not None and not token:
        _usage_error("--token", "must not be empty (leave it out to serve without a token)")
    if any(not value for value in trusted):
        _usage_error("--trusted-token", "must not be empty")
    if token is not None and token in trusted:
        _usage_error("--trusted-token", "must differ from --token")
    if not 0 < header_timeout < float("inf"):
        _usage_error(
            "--header-timeout", f"must be a positive number of seconds, got {header_timeout}"
        )
    try:
        from .server import serve as run_server
    except ImportError as exc:  # the server extra is not installed: one line saying so
        console.print(str(exc), style="red", markup=False)
        raise typer.Exit(1) from None

    run_server(
        url,
        host,
        port,
        token=token,
        trusted_tokens=trusted,
        max_live_streams=max_live_streams,
        extra_connections=extra_connections,
        header_timeout=header_timeout,
    )


def _usage_error(option: str, message: str) -> NoReturn:
    """One line naming the option, and exit status 2 (a usage error), no traceback."""
    Console(stderr=True).print(
        f"error: {option} {message}", style="red", markup=False, soft_wrap=True
    )
    raise typer.Exit(2)


def main() -> None:
    """Run the CLI; contextfold's own errors print as one line and exit with status 1."""
    from .errors import ContextfoldError

    try:
        app()
    except ContextfoldError as exc:
        Console(stderr=True).print(f"error: {exc}", style="red", markup=False)
        raise SystemExit(1) from None
