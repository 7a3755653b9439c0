"""The users of ``benchmarks/workers.py``: streams receiving user messages over time, and
what the run measured from them.

Each stream gets its first message at a random moment of the ramp, then its next one a
think time after its previous one was answered (exponential, mean ``think``
seconds, seeded), until the run's end. So every stream is a conversation in progress and
a share of them is busy (a message unanswered) at any time: the ideal turn rate is that
number of busy streams over the model's mean delay, what workers of zero cost would make.

A message is answered once the stream holds the second model response after it (the
first asks for the tool); the users poll the events table for responses every
``POLL`` seconds (a think time starts after that poll, so it delays nothing measured).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import random
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime

from _workers_app import RESPONSE, message_text
from _workers_pg import DRIVER

import contextfold as cf

__all__ = ["Conversation", "Measured", "converse", "measure"]

POLL = 0.05
_DRAIN = 20.0  # seconds the last messages get to be answered after the run's end


@dataclass(slots=True)
class Conversation:
    """What the users sent and saw: each message's time in the journal (its append
    returned) and when its answer was recorded (``time.time()`` seconds)."""

    sent: dict[tuple[str, int], float] = field(default_factory=dict)
    answered: dict[tuple[str, int], float] = field(default_factory=dict)


def _random(*key: object) -> random.Random:
    raw = hashlib.blake2b("/".join(map(str, key)).encode(), digest_size=8).digest()
    return random.Random(raw)


def _think(seed: int, stream: str, k: int, mean: float) -> float:
    """The think time before message ``k + 1`` of ``stream``."""
    return _random("think", seed, stream, k).expovariate(1 / mean)


def _unit(seed: int, stream: str) -> float:
    """Where in the ramp the stream's first message comes (0 to 1)."""
    return _random("start", seed, stream).random()


async def converse(
    dsn: str,
    namespace: str,
    streams: list[str],
    *,
    think: float,
    ramp: float,
    seed: int,
    until: float,
) -> Conversation:
    """Send every stream its messages (the first at a random moment of the first ``ramp``
    seconds) until ``until`` (``time.time()``), then wait for the last ones to be answered;
    returns what was sent and answered."""
    import psycopg

    done = Conversation()
    start = time.time()
    due = [(start + ramp * _unit(seed, s), s, 0) for s in streams]
    heapq.heapify(due)
    waiting: dict[str, tuple[int, int]] = {}  # stream -> (message, its position)
    async with (
        cf.open_journal(dsn, namespace=namespace, min_size=2, max_size=4) as journal,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        while True:
            now = time.time()
            if now >= until and not waiting:
                return done
            if now >= until + _DRAIN:
                raise RuntimeError(
                    f"{len(waiting)} messages unanswered {_DRAIN}s after the end: {sorted(waiting)}"
                )
            while due and due[0][0] <= now and now < until:
                _, stream, k = heapq.heappop(due)
                appended = await journal.append(
                    stream, cf.ContextAdded(role="user", content=message_text(k, stream))
                )
                done.sent[(stream, k)] = time.time()
                waiting[stream] = (k, appended.version)
            if waiting:
                # By stream and position, not by global position: those commit out of order.
                names = list(waiting)
                cur = await conn.execute(
                    f"SELECT {DRIVER} e.stream, count(*), max(e.time) FROM cf_events e"
                    " JOIN unnest(%s::text[], %s::bigint[]) AS w(stream, after)"
                    " ON e.namespace = %s AND e.stream = w.stream AND e.type = %s"
                    " AND e.position > w.after GROUP BY e.stream",
                    (names, [waiting[s][1] for s in names], namespace, RESPONSE),
                )
                for stream, responses, at in await cur.fetchall():
                    if responses < 2:  # the first asks for the tool
                        continue
                    k, _ = waiting.pop(stream)
                    done.answered[(stream, k)] = datetime.fromisoformat(at).timestamp()
                    then = time.time() + _think(seed, stream, k, think)
                    heapq.heappush(due, (then, stream, k + 1))
            await asyncio.sleep(POLL)


@dataclass(frozen=True, slots=True)
class Measured:
    """A run's window, as the users and the model saw it."""

    seconds: float
    turns: int
    """Model calls sent in the window."""
    mean_delay: float
    """Their mean delay (seconds)."""
    busy: float
    """Streams with a message unanswered, on average over the window."""
    waits: tuple[float, ...]
    """Seconds from each message of the window landing to its first request going out."""

    @property
    def rate(self) -> float:
        return self.turns / self.seconds

    @property
    def ideal(self) -> float:
        """Turns per second of workers that cost nothing: busy streams over mean delay."""
        return self.busy / self.mean_delay if self.mean_delay else float("inf")

    def wait(self, share: float) -> float:
        """The ``share`` quantile of the trigger-to-request waits (seconds)."""
        if len(self.waits) < 2:
            return self.waits[0] if self.waits else float("nan")
        return statistics.quantiles(self.waits, n=1000, method="inclusive")[
            min(int(share * 1000), 999) - 1
        ]


def measure(
    done: Conversation,
    calls: list[tuple[str, int, int, float, float]],
    begin: float,
    end: float,
) -> Measured:
    """The window ``[begin, end)`` (``time.time()``) of a run: its model calls, and the
    messages sent in it."""
    in_window = [c for c in calls if begin <= c[3] < end]
    first: dict[tuple[str, int], float] = {}
    for stream, k, step, sent, _ in calls:
        if step == 0:
            key = (stream, k)
            first[key] = min(first.get(key, sent), sent)
    busy = 0.0
    for key, sent in done.sent.items():
        answered = done.answered.get(key, end)
        busy += max(0.0, min(answered, end) - max(sent, begin))
    waits = tuple(
        first[key] - sent for key, sent in done.sent.items() if begin <= sent < end and key in first
    )
    delays = [c[4] for c in in_window]
    return Measured(
        seconds=end - begin,
        turns=len(in_window),
        mean_delay=statistics.fmean(delays) if delays else 0.0,
        busy=busy / (end - begin),
        waits=waits,
    )
