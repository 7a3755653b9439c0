"""A claim on PostgreSQL reads the stream's head with its version and passes it to the
folds: a stream another process deleted and made again to the same version is never taken
for the cached state of its old history (a version alone cannot tell the two apart)."""

from __future__ import annotations

from typing import Any

import psycopg

import contextfold as cf
from contextfold.journal import Journal, open_journal
from contextfold.runtime.lease import StreamLeased, claim_lease, view_lease
from contextfold.runtime.worker import Worker
from contextfold.store.postgres import NOTIFY_CHANNEL, wake_key
from tests.runtime.helpers import answered, echo_app, eventually, new_agent_stream, running, user

NEVER_POLLS: dict[str, Any] = {"poll_interval": 600.0, "rescan_interval": 600.0}


class Said(cf.Event, type="test.lease-recreated/said"):
    text: str


SAID: cf.Fold[tuple[str, ...]] = cf.Fold(
    "lease_recreated_said", state=tuple[str, ...], initial=tuple
)
SAID.on(Said)(lambda state, ev: (*state, ev.payload.text))


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn.replace("postgresql+psycopg", "postgresql"))


def _recreate(dsn: str, namespace: str, stream: str, scratch: str, *, notify: bool) -> None:
    """Delete ``stream`` and make it again from the events of ``scratch`` (moved there),
    in one transaction, as another process would; with ``notify`` the deletion's wake-up
    is sent at its commit, and none of the appends' that followed it (not yet sent)."""
    with _connect(dsn) as other, other.transaction():
        where = "namespace = %s AND stream = %s"
        version = other.execute(
            f"SELECT version FROM cf_streams WHERE {where}", (namespace, scratch)
        ).fetchone()
        assert version is not None
        other.execute(f"DELETE FROM cf_events WHERE {where}", (namespace, stream))
        other.execute(f"DELETE FROM cf_streams WHERE {where}", (namespace, stream))
        for table in ("cf_events", "cf_streams"):
            other.execute(
                f"UPDATE {table} SET stream = %s WHERE {where}", (stream, namespace, scratch)
            )
        if notify:
            payload = f"{wake_key(namespace, stream)} 0"  # a deletion's
            other.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, payload))


async def test_a_claim_at_a_recreated_stream_s_old_version_folds_the_new_history(
    pg_dsn: str,
) -> None:
    async with open_journal(pg_dsn) as journal, open_journal(pg_dsn) as other:
        await journal.append("s", [Said(text="old"), Said(text="older")])
        assert await journal.fold(SAID, "s") == ("old", "older")  # cached at version 2
        # Another process's history of the same length, moved in place of the old one.
        await other.append("scratch", [Said(text="new"), Said(text="newer")])
        _recreate(pg_dsn, journal.namespace, "s", "scratch", notify=False)
        # The claim's look, told version 2 as a scan would have: it reads the head too.
        view = await view_lease(journal, "s", version=2)
        lease = await claim_lease(journal, "s", holder="w1", ttl=10, lazy=True, view=view)
        lease.watch()
        assert await lease.journal.fold(SAID, "s") == ("new", "newer")
        head = await other.head("s")
        assert view.version == 2 and view.head == head and lease.known == (2, head)


async def test_a_worker_serves_a_stream_made_again_to_the_version_it_left_idle(
    pg_dsn: str,
) -> None:
    async with open_journal(pg_dsn) as journal, open_journal(pg_dsn) as other:
        await new_agent_stream(journal, "chat/x", "first question")
        worker = Worker(journal, echo_app(), **NEVER_POLLS)
        async with running(worker):
            await eventually(lambda: answered(journal, "chat/x"), what="the first answer")
            await eventually(lambda: _idle(worker), what="the worker idles")
            version = await journal.version("chat/x")
            # The same number of events: a question nobody answered, and a lease handed
            # back last (not idle), so the look lands at exactly the old version.
            await new_agent_stream(other, "scratch", "second question")
            fillers = [user(f"and {n}") for n in range(version - 4)]
            await other.append("scratch", fillers)
            await _hand_back(other, "scratch")
            assert await other.version("scratch") == version
            _recreate(pg_dsn, journal.namespace, "chat/x", "scratch", notify=True)
            await eventually(
                lambda: answered(other, "chat/x"), what="the new question answered", limit=20
            )


async def _idle(worker: Worker) -> bool:
    return not worker.serving and not worker.waiting


async def _hand_back(journal: Journal, stream: str) -> None:
    lease = await claim_lease(journal, stream, holder="another", ttl=10)
    await lease.release()
    found = await journal.latest(stream, [StreamLeased])
    assert found and found[0].position == await journal.version(stream)
