"""What the ``contextfold`` commands share: the default journal URL, the consoles, how a
mistake becomes one line on stderr, opening a journal read-only, output and progress."""

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

# soft_wrap: rich would break lines at the terminal width, or at 80 columns into a pipe.
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

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


def _open(url: str) -> Journal:
    """The journal at ``url`` for reading: an SQLite file must exist already (nothing is
    created), a PostgreSQL server must answer within :data:`CONNECT_TIMEOUT`."""
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
    return open_journal(url, **options)


def _dumps(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")


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
