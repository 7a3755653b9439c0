"""The demo session behind ``contextfold demo``: the journal on an embedded SQLite file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .events import Event
from .journal import open_journal

__all__ = ["run_demo"]


class DemoNote(Event, type="contextfold.demo/note"):
    text: str


async def run_demo(db: Path, *, fresh: bool = True, console: Console | None = None) -> None:
    """Append, read and tail a stream in ``db``, printing each step."""
    out = console or Console()
    db.parent.mkdir(parents=True, exist_ok=True)
    journal = open_journal(f"sqlite:///{db}")
    stream = "demo/session-1"
    try:
        if fresh:
            await journal.delete_stream(stream)
        out.print(f"[bold]contextfold demo[/] journal: [cyan]{db.resolve()}[/]")
        first = await journal.append(
            stream, [DemoNote(text="hello"), DemoNote(text="world")], idempotency_key="demo-1"
        )
        out.print(f"appended positions {first.first_position}..{first.last_position}")
        retry = await journal.append(
            stream, [DemoNote(text="hello"), DemoNote(text="world")], idempotency_key="demo-1"
        )
        out.print(f"retried the same idempotent append: deduplicated={retry.deduplicated}")

        received: list[str] = []

        async def tail() -> None:
            async for event in journal.subscribe(stream, after=first.cursor, poll_interval=0.02):
                received.append(event.payload["text"])
                out.print(f"  tail received @{event.position}: {event.payload['text']}")
                if len(received) == 2:
                    return

        task = asyncio.create_task(tail())
        await journal.append(stream, DemoNote(text="live one"))
        await journal.append(stream, DemoNote(text="live two"))
        await asyncio.wait_for(task, 10)

        table = Table(title=f"stream {stream}")
        for column in ("position", "type", "payload"):
            table.add_column(column)
        async for event in journal.read_all(stream):
            table.add_row(str(event.position), event.type, event.data.decode())
        out.print(table)
    finally:
        await journal.close()
