"""The PostgreSQL store's schema and statements: tables, the NOTIFY channel, and the SQL
of an append (one statement, or a pipelined transaction with an idempotency key), of its
wake-ups, and of reads (one snapshot each)."""

from __future__ import annotations

__all__ = ["NOTIFY_CHANNEL"]

NOTIFY_CHANNEL = "contextfold_events"
"""The LISTEN/NOTIFY channel; the payload names the stream (a hash of namespace and stream),
its version and its head (``postgres.parse_wake``)."""

_SCHEMA_LOCK = 0x63665F736368656D  # pg_advisory_xact_lock key ("cf_schem")
_CHANNEL_SEP = "\x1f"  # channel names hold no control characters

# namespace and stream sort by code point (COLLATE "C"), like the memory and SQLite stores.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS cf_events (
    global_position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace TEXT COLLATE "C" NOT NULL,
    stream TEXT COLLATE "C" NOT NULL,
    position BIGINT NOT NULL,
    type TEXT NOT NULL,
    data BYTEA NOT NULL,
    event_id TEXT NOT NULL,
    time TEXT NOT NULL,
    run_id TEXT,
    actor TEXT,
    idempotency_key TEXT,
    channels TEXT[] NOT NULL,
    UNIQUE (namespace, stream, position)
);
CREATE INDEX IF NOT EXISTS cf_events_by_type ON cf_events (namespace, stream, type, position);
CREATE TABLE IF NOT EXISTS cf_streams (
    namespace TEXT COLLATE "C" NOT NULL,
    stream TEXT COLLATE "C" NOT NULL,
    version BIGINT NOT NULL,
    PRIMARY KEY (namespace, stream)
);
CREATE TABLE IF NOT EXISTS cf_idempotency (
    namespace TEXT COLLATE "C" NOT NULL,
    stream TEXT COLLATE "C" NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    first_position BIGINT NOT NULL,
    last_position BIGINT NOT NULL,
    last_global BIGINT NOT NULL,
    PRIMARY KEY (namespace, stream, key)
);
"""
_SCHEMA_PRESENT = (
    "SELECT to_regclass('cf_events_by_type') IS NOT NULL"
    " AND to_regclass('cf_streams') IS NOT NULL AND to_regclass('cf_idempotency') IS NOT NULL"
)

_COLUMNS = (
    "global_position, position, type, data, event_id, time, run_id, actor,"
    " idempotency_key, channels"
)
_WHERE = "namespace = %(ns)s AND stream = %(s)s"

# Locks the stream row and reserves the batch's positions; rolled back on any refusal.
_LOCK = (
    "INSERT INTO cf_streams AS t (namespace, stream, version) VALUES (%(ns)s, %(s)s, %(n)s)"
    " ON CONFLICT (namespace, stream) DO UPDATE SET version = t.version + %(n)s RETURNING version"
)
_SEEN = (
    "SELECT digest, first_position, last_position, last_global FROM cf_idempotency"
    f" WHERE {_WHERE} AND key = %(key)s"
)


def _insert(cur: str, *, previous: bool = True) -> str:
    """An append's insert, its positions numbered from the version before (``cur``'s one
    row, ``v``; none: nothing is inserted, no row back). A row per event inserted, straight
    from the insert's own returned rows (no pass over them to aggregate, no sort): that
    version, the event's global position (they grow with positions), and the global
    position of the event before the batch (NULL at version 0, or without ``previous``),
    looked up once. The idempotency key is recorded when one is given."""
    before = (
        f"(SELECT global_position FROM cf_events, cur WHERE {_WHERE} AND position = cur.v)"
        if previous
        else "NULL::bigint"
    )
    return f"""
WITH cur AS ({cur}), ins AS (
    INSERT INTO cf_events (namespace, stream, position, type, data, event_id, time, run_id,
                           actor, idempotency_key, channels)
    SELECT %(ns)s, %(s)s, cur.v + u.n, u.type, u.data, u.event_id, u.time, u.run_id, u.actor,
           u.key, string_to_array(u.channels, chr(31))
    FROM cur, unnest(%(types)s::text[], %(data)b::bytea[], %(ids)s::text[], %(times)s::text[],
                     %(runs)s::text[], %(actors)s::text[], %(keys)s::text[], %(chans)s::text[])
         WITH ORDINALITY AS u(type, data, event_id, time, run_id, actor, key, channels, n)
    ORDER BY u.n
    RETURNING global_position
), idem AS (
    INSERT INTO cf_idempotency
    SELECT %(ns)s, %(s)s, %(key)s::text, %(digest)s::text, v + 1, v + %(n)s,
           (SELECT max(global_position) FROM ins)
    FROM cur WHERE %(key)s::text IS NOT NULL
)
SELECT cur.v, ins.global_position, {before} FROM cur, ins
"""


# The positions come from the version the lock statement just reserved (same transaction).
_INSERT = _insert(f"SELECT version - %(n)s AS v FROM cf_streams WHERE {_WHERE}")
# An append with an expected version and no idempotency key in one statement, one round
# trip: the stream row is locked and bumped only at the expected version (created only when
# 0 is expected; a row ON CONFLICT leaves as it is stays locked); no row back: it differed.
_INSERT_EXPECTED = _insert(
    f"""
    INSERT INTO cf_streams AS t (namespace, stream, version)
    SELECT %(ns)s, %(s)s, %(n)s
    WHERE %(expected)s::bigint = 0 OR EXISTS (SELECT 1 FROM cf_streams WHERE {_WHERE})
    ON CONFLICT (namespace, stream) DO UPDATE SET version = t.version + %(n)s
        WHERE t.version = %(expected)s::bigint
    RETURNING version - %(n)s AS v
"""
)
# The same at an expected version above 0: the row exists, so a plain update locks and
# bumps it (cheaper than an upsert's insertion attempt); no row back: it differed.
_INSERT_AT = _insert(
    f"""
    UPDATE cf_streams SET version = version + %(n)s
    WHERE {_WHERE} AND version = %(expected)s::bigint
    RETURNING version - %(n)s AS v
"""
)
# An append with no check at all, in one statement too: the stream row is locked and bumped
# first (its CTE feeds the insert), so global positions are still drawn under the lock. It
# names no event before its batch: its snapshot, taken before it waited for the stream's
# lock, may show an event of a history deleted and recreated meanwhile (or none).
_INSERT_ANY = _insert(
    """
    INSERT INTO cf_streams AS t (namespace, stream, version) VALUES (%(ns)s, %(s)s, %(n)s)
    ON CONFLICT (namespace, stream) DO UPDATE SET version = t.version + %(n)s
    RETURNING version - %(n)s AS v
""",
    previous=False,
)
# The wake-ups of appends that committed, one per stream, in a transaction of their own
# that commits without waiting for its WAL flush. A NOTIFY in the append's transaction
# would hold PostgreSQL's database-wide notification lock through the append's flush:
# every append of every process would commit one after another, never as a group.
_NOTIFY_MANY = f"""
SELECT set_config('synchronous_commit', 'off', true),
       (SELECT count(pg_notify('{NOTIFY_CHANNEL}', k)) FROM unnest(%(keys)s::text[]) AS k)
"""
# One statement, one snapshot: an unknown cursor gives no row, a known one at least one.
_READ_AFTER = f"""
SELECT e.* FROM cf_events c LEFT JOIN LATERAL (
    SELECT {_COLUMNS} FROM cf_events
    WHERE namespace = c.namespace AND stream = c.stream AND position > c.position {{typed}}
    ORDER BY position LIMIT %(limit)s
) e ON true
WHERE c.global_position = %(g)s AND c.namespace = %(ns)s AND c.stream = %(s)s
ORDER BY e.position
"""
_READ = (
    f"SELECT {_COLUMNS} FROM cf_events WHERE {_WHERE} {{typed}} ORDER BY position LIMIT %(limit)s"
)
_TYPED = "AND type = ANY(%(types)s::text[])"
# A stream's version, head and newest event of some types, in one snapshot: a version
# alone may be an old history's (a stream deleted and made again reaches it), a head never.
_LOOK = f"""
SELECT s.version, s.head, e.* FROM (
    SELECT (SELECT version FROM cf_streams WHERE {_WHERE}) AS version,
           (SELECT global_position FROM cf_events WHERE {_WHERE}
            ORDER BY position DESC LIMIT 1) AS head
) s LEFT JOIN LATERAL (
    SELECT {_COLUMNS} FROM cf_events WHERE {_WHERE} {_TYPED} ORDER BY position DESC LIMIT 1
) e ON true
"""
