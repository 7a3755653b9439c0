"""What the ``contextfold`` commands share: the default journal URL, the options, the
consoles, how a mistake becomes one line on stderr, opening a journal read-only (in a
namespace), output (the events of ``contextfold events``) and progress."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar
from urllib.parse import urlsplit

try:
    import typer
    from rich.console import Console
except ImportError as exc:  # pragma: no cover - typer and rich are core dependencies
    raise SystemExit("the contextfold CLI needs typer and rich: pip install contextfold") from exc

if TYPE_CHECKING:
    from .journal import Journal

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_URL",
    "URL_ENV",
    "console",
    "err_console",
]

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_URL = "sqlite:///.contextfold/journal.db"
"""The journal every command uses when neither ``--url`` nor ``CONTEXTFOLD_URL`` names one."""

URL_ENV = "CONTEXTFOLD_URL"

CONNECT_TIMEOUT = 3.0
"""Seconds a command waits for a PostgreSQL server before saying it cannot be reached."""

_FOLLOW_POLL = 0.25  # seconds between polls for another process's appends

# soft_wrap: rich would break lines at the terminal width, or at 80 columns into a pipe.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

Url = Annotated[
    str,
    typer.Option(
        envvar=URL_ENV,
        help="Journal URL: sqlite:///path.db, postgresql://… (default: $CONTEXTFOLD_URL, "
        f"else {DEFAULT_URL}).",
        show_default=False,
    ),
]
Stream = Annotated[str, typer.Argument(help="Stream name.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def _check_namespace(namespace: str) -> str:
    """``--namespace``: a name the journal takes, else a usage error naming the option."""
    from .errors import InvalidInputError
    from .journal.encode import check_namespace

    try:
        return check_namespace(namespace)
    except InvalidInputError as exc:
        _usage_error("--namespace", f"is no namespace: {exc}")


Namespace = Annotated[
    str,
    typer.Option(help="The namespace (tenant) of the journal.", callback=_check_namespace),
]

DemoUrl = Annotated[
    str,
    typer.Option(
        envvar=URL_ENV,
        help="SQLite journal URL, sqlite:///path.db: the demo runs on an embedded journal "
        f"(default: $CONTEXTFOLD_URL, else {DEFAULT_URL}).",
        show_default=False,
    ),
]
"""The demo's ``--url``: an SQLite file only (its workspace and transcript sit beside it)."""


def _print_version(asked: bool) -> None:
    """``--version``: print the installed version and exit."""
    if asked:
        from . import __version__

        _write(f"contextfold {__version__}")
        raise typer.Exit()


def _reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """contextfold's own errors become one line on stderr and exit status 1."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        from .errors import ContextfoldError

        pool_log = _QuietPool()
        try:
            with pool_log.installed():
                return command(*args, **kwargs)
        except ContextfoldError as exc:
            _fail(str(exc) + pool_log.detail())

    return run


class _QuietPool(logging.Handler):
    """Keeps the connection pool's retry warnings off the terminal, remembering the last
    one: it says why the server could not be reached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage().splitlines()[0]

    def detail(self) -> str:
        return f" (last attempt: {self.last})" if self.last else ""

    @contextmanager
    def installed(self) -> Iterator[None]:
        logger = logging.getLogger("psycopg.pool")
        kept = logger.propagate
        logger.addHandler(self)
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(self)
            logger.propagate = kept


def _fail(message: str) -> NoReturn:
    err_console.print(f"error: {message}", style="red", markup=False, highlight=False)
    raise typer.Exit(1)


def _usage_error(option: str, message: str) -> NoReturn:
    """One line naming the option, and exit status 2 (a usage error), no traceback."""
    err_console.print(f"error: {option} {message}", style="red", markup=False, highlight=False)
    raise typer.Exit(2)


def _shown(url: str) -> str:
    """``url`` without its password, for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rsplit("@", 1)[1]
        return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
    except ValueError:
        return "<unparsable URL>"


def _where(url: str, namespace: str) -> str:
    """Where a command reads, for messages: ``url`` without its password, and the
    namespace unless it is the default one."""
    shown = _shown(url)
    return shown if namespace == "default" else f"namespace {namespace!r} of {shown}"


def _open(url: str, namespace: str = "default") -> Journal:
    """The journal at ``url`` for reading, in ``namespace``: an SQLite file must exist
    already (nothing is created), a PostgreSQL server must answer within
    :data:`CONNECT_TIMEOUT`."""
    from .journal import open_journal
    from .store.urls import parse_store_url

    parsed = parse_store_url(url)
    options: dict[str, Any] = {}
    if parsed.scheme == "sqlite":
        options["read_only"] = True
    elif parsed.scheme == "postgresql":
        options.update(min_size=1, max_size=2)
        if parsed.pool_timeout is None:  # the URL's pool_timeout= is the user's choice
            options["timeout"] = CONNECT_TIMEOUT
    return open_journal(url, namespace=namespace, **options)


def _dumps(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")


async def _events(
    url: str,
    namespace: str,
    stream: str,
    after: str | None,
    limit: int | None,
    follow: bool,
    as_json: bool,
) -> int:
    """Print the events (see ``events``); returns how many corrupt rows were left out."""
    from .errors import UnknownCursorError, UnknownStreamError
    from .inspection import event_json, require_cursor, require_stream
    from .store.base import TailReset
    from .store.rows import corrupt_row

    corrupt = 0
    page_events: list[dict[str, Any]] = []

    def emit(event: Any) -> None:
        nonlocal corrupt
        bad = corrupt_row(event)
        if bad is not None:
            corrupt += 1
            err_console.print(f"corrupt row: {bad}", markup=False, highlight=False)
        elif as_json:
            page_events.append(event_json(event))
        else:
            _write(_dumps(event_json(event)))

    async with _open(url, namespace) as journal:
        try:
            await require_stream(journal, stream, where=_where(url, namespace))
        except UnknownStreamError as exc:
            if not follow or after is not None:
                raise
            # Like the HTTP tail: a stream is followed from before its first event.
            err_console.print(
                f"-- {exc}; waiting for its first events", markup=False, highlight=False
            )
        if after is not None:
            await require_cursor(journal, stream, after)
        cursor, printed, more = after, 0, False
        while True:
            size = 1000 if limit is None else min(1000, limit - printed)
            page = await journal.read(stream, after=cursor, limit=size)
            if page.reset:  # deleted between the check and the read
                raise UnknownCursorError(
                    f"stream {stream!r} was deleted while it was read", stream=stream, cursor=""
                )
            for event in page.events:
                emit(event)
            printed += len(page.events)
            cursor = page.cursor
            if not page.more:
                break
            if limit is not None and printed >= limit:
                more = True
                break
        if as_json:
            _write(
                _dumps({"stream": stream, "events": page_events, "cursor": cursor, "more": more})
            )
        elif more:
            err_console.print(
                f"-- {printed} events shown, more follow: continue with --after {cursor}",
                markup=False,
                highlight=False,
            )
        if not follow:
            return corrupt
        sys.stdout.flush()
        live = journal.subscribe(stream, after=cursor, poll_interval=_FOLLOW_POLL, resets=True)
        async for item in live:
            if isinstance(item, TailReset):
                err_console.print(
                    f"-- stream {stream!r} was deleted or recreated: following it from its start",
                    markup=False,
                    highlight=False,
                )
                continue
            emit(item)
            sys.stdout.flush()
    return corrupt


@contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress callback drawing a bar on stderr when it is a terminal, else None."""
    if not err_console.is_terminal:
        yield None
        return
    from rich.progress import Progress

    with Progress(console=err_console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def advance(phase: str, position: int, version: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=version)
            bar.update(tasks[phase], completed=position)

        yield advance
