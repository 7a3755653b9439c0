"""The ``contextfold`` command line: a thin layer, each command calls one library function."""

from __future__ import annotations

import asyncio
from pathlib import Path

try:
    import typer
    from rich.console import Console
except ImportError as exc:  # pragma: no cover - typer and rich are core dependencies
    raise SystemExit("the contextfold CLI needs typer and rich: pip install contextfold") from exc

__all__ = ["app", "main"]

app = typer.Typer(help="contextfold: the context of LLM agents, from an append-only journal.")
console = Console()


@app.command()
def demo(
    db: Path = typer.Option(Path(".contextfold/demo.db"), help="SQLite journal file to use."),
    fresh: bool = typer.Option(True, help="Start the demo stream from scratch."),
) -> None:
    """Run the demo session on an embedded SQLite journal and show what happened."""
    from .demo import run_demo

    if not asyncio.run(run_demo(db, fresh=fresh, console=console)):
        raise typer.Exit(1)


@app.command()
def streams(url: str = typer.Argument("sqlite:///.contextfold/demo.db", help="Journal URL.")) -> None:
    """List the streams of a journal with their versions."""
    from .journal import open_journal_sync

    with open_journal_sync(url) as journal:
        for info in journal.list_streams():
            console.print(f"{info.stream}\t{info.version}")


@app.command()
def serve(
    url: str = typer.Option("sqlite:///contextfold.db", help="Journal URL to serve."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8765, help="TCP port to listen on."),
    token: str | None = typer.Option(
        None, envvar="CONTEXTFOLD_TOKEN", help="Require 'Authorization: Bearer <token>' on the API."
    ),
) -> None:
    """Serve a journal over HTTP + SSE, with the web inspector at /."""
    try:
        from .server import serve as run_server
    except ImportError as exc:  # the server extra is not installed: one line saying so
        console.print(str(exc), style="red", markup=False)
        raise typer.Exit(1) from None

    run_server(url, host, port, token=token)


def main() -> None:
    app()
