"""A claim on SQLite reads the stream's head after its version and passes it to the folds,
as on PostgreSQL: a stream another process deleted and made again to the same version is
never taken for the cached state of its old history."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import contextfold as cf
from contextfold.journal import open_journal
from contextfold.runtime.lease import claim_lease, view_lease


class Said(cf.Event, type="test.lease-recreated-sqlite/said"):
    text: str


SAID: cf.Fold[tuple[str, ...]] = cf.Fold(
    "lease_recreated_sqlite_said", state=tuple[str, ...], initial=tuple
)
SAID.on(Said)(lambda state, ev: (*state, ev.payload.text))


def _recreate(path: Path, namespace: str, stream: str, scratch: str) -> None:
    """Delete ``stream`` and make it again from the events of ``scratch`` (moved there), in
    one transaction of another connection, as another process would."""
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        where = "namespace = ? AND stream = ?"
        other.execute(f"DELETE FROM cf_events WHERE {where}", (namespace, stream))
        other.execute(f"DELETE FROM cf_streams WHERE {where}", (namespace, stream))
        for table in ("cf_events", "cf_streams"):
            other.execute(
                f"UPDATE {table} SET stream = ? WHERE {where}", (stream, namespace, scratch)
            )
        other.execute("COMMIT")
    finally:
        other.close()


async def test_a_claim_at_a_recreated_stream_s_old_version_folds_the_new_history(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    async with open_journal(f"sqlite:///{path}") as journal:
        await journal.append("s", [Said(text="old"), Said(text="older")])
        assert await journal.fold(SAID, "s") == ("old", "older")  # cached at version 2
        await journal.append("scratch", [Said(text="new"), Said(text="newer")])
        _recreate(path, journal.namespace, "s", "scratch")
        # The claim's look, told version 2 as a notification or a scan would have.
        view = await view_lease(journal, "s", version=2)
        lease = await claim_lease(journal, "s", holder="w1", ttl=10, lazy=True, view=view)
        lease.watch()
        assert await lease.journal.fold(SAID, "s") == ("new", "newer")
        assert view.version == 2 and view.head == await journal.head("s")
