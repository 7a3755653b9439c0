"""A PostgreSQL append that waited for its stream's lock while another writer deleted and
recreated the stream must not be folded into the cached state of the deleted history: the
event its batch follows cannot be read from a snapshot taken before that wait."""

from __future__ import annotations

import asyncio

import psycopg

import contextfold as cf
from contextfold.journal import open_journal


class Said(cf.Event, type="test.recreated/said"):
    text: str


SAID: cf.Fold[tuple[str, ...]] = cf.Fold("recreated_said", state=tuple[str, ...], initial=tuple)
SAID.on(Said)(lambda state, ev: (*state, ev.payload.text))


async def test_an_append_that_waited_out_a_recreate_is_not_folded_into_the_old_history(
    pg_dsn: str,
) -> None:
    async with open_journal(pg_dsn) as journal:
        await journal.append("s", Said(text="old"))
        assert await journal.fold(SAID, "s") == ("old",)  # cached at version 1
        other = psycopg.connect(pg_dsn.replace("postgresql+psycopg", "postgresql"))
        try:
            row = other.execute(
                "SELECT type, data, event_id, time, channels FROM cf_events"
                " WHERE namespace = %s AND stream = 's'",
                (journal.namespace,),
            ).fetchone()
            assert row is not None
            # Deleted and recreated to the same version in one transaction, held open.
            other.execute(
                "DELETE FROM cf_events WHERE namespace = %s AND stream = 's'", (journal.namespace,)
            )
            other.execute(
                "DELETE FROM cf_streams WHERE namespace = %s AND stream = 's'", (journal.namespace,)
            )
            other.execute(
                "INSERT INTO cf_streams (namespace, stream, version) VALUES (%s, 's', 1)",
                (journal.namespace,),
            )
            other.execute(
                "INSERT INTO cf_events (namespace, stream, position, type, data, event_id, time,"
                " channels) VALUES (%s, 's', 1, %s, %s, %s, %s, %s)",
                (
                    journal.namespace,
                    row[0],
                    bytes(row[1]).replace(b"old", b"new"),
                    row[2] + "-new",
                    row[3],
                    row[4],
                ),
            )
            append = asyncio.create_task(journal.append("s", Said(text="mine")))
            # The append waits for the stream's lock, which the open transaction holds.
            for _ in range(200):
                waiting = other.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                await asyncio.sleep(0.01)
            assert not append.done()
            other.commit()
            result = await append
        finally:
            other.close()
        assert result.first_position == 2
        assert await journal.fold(SAID, "s") == ("new", "mine")
    async with open_journal(pg_dsn) as fresh:
        assert await fresh.fold(SAID, "s") == ("new", "mine")
