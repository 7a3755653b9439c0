"""The worker side of ``benchmarks/workers.py``: the agent every worker process serves, the
model's latency, and the worker process itself.

The agent answers each user message in two model calls with a tool run between them: the
first call asks for ``lookup``, the tool answers at once with 400 characters, the second
call answers. The model answers after a delay drawn from a lognormal distribution (median
400 ms, 99th percentile 3 s), seeded by the stream and the call, so every configuration
of a run meets the same delays; ``instant`` answers at once. Each call is logged in the
process (stream, user message, step, when it was sent, its delay) and reported at the end.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import math
import os
import random
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import contextfold as cf

__all__ = [
    "MEDIAN",
    "P99",
    "ChildConfig",
    "delay_of",
    "message_text",
    "run_child",
]

MEDIAN = 0.4
"""Seconds: the model's median delay."""
P99 = 3.0
"""Seconds: its 99th percentile."""
_SIGMA = math.log(P99 / MEDIAN) / 2.3263478740408408  # the 99th percentile's z-score
_MESSAGE = re.compile(r"^m(\d+) ", re.MULTILINE)
_RESULT = "catalog: " + "in stock, shelf 4, restocked on Monday; " * 10
SYSTEM_PROMPT = "You answer catalog questions. Look items up with lookup first."
RESPONSE = "contextfold.agent/llm-response"


def delay_of(seed: int, stream: str, call: int) -> float:
    """The model's delay for the ``call``-th request of ``stream`` (seconds)."""
    raw = hashlib.blake2b(f"{seed}/{stream}/{call}".encode(), digest_size=8).digest()
    return random.Random(raw).lognormvariate(math.log(MEDIAN), _SIGMA)


def message_text(k: int, stream: str) -> str:
    """The ``k``-th user message of ``stream``: the model finds ``k`` in it."""
    return f"m{k} where is item {k} of {stream}?"


@dataclass(frozen=True, slots=True)
class ChildConfig:
    """What one worker process is told: where, how, and with which model."""

    dsn: str
    namespace: str
    concurrency: int
    lease: bool
    latency: bool
    seed: int
    pool: int
    cached_streams: int
    """The streams the journal's fold cache is sized for."""


Call = tuple[str, int, int, float, float]
"""A model call: stream, user message, step (0: the trigger's first call), when it was
sent (``time.time()``), its delay."""


async def _model(
    config: ChildConfig, calls: list[Call], stream: str, request: cf.NeutralRequest
) -> cf.ModelOutput | str:
    sent = time.time()
    messages = request.messages
    last = messages[-2]  # the last message is the request's timestamp tail
    users = [m for m in messages if m.role == "user" and _MESSAGE.search(m.content or "")]
    found = _MESSAGE.search(users[-1].content or "") if users else None
    k = int(found.group(1)) if found else -1
    step = 1 if last.role == "tool" else 0
    delay = delay_of(config.seed, stream, len(messages)) if config.latency else 0.0
    calls.append((stream, k, step, sent, delay))
    if delay:
        await asyncio.sleep(delay)
    if step:
        return f"Item {k} is in stock on shelf 4."
    call = cf.ToolCall(id=f"call-{len(messages)}", name="lookup", arguments='{"item": 1}')
    return cf.ModelOutput(tool_calls=(call,))


async def lookup(ctx: cf.ToolContext, item: int) -> str:
    """Look an item up in the catalog."""
    return _RESULT


_TOOLS = (cf.Tool.from_function(lookup),)


def make_app(config: ChildConfig, calls: list[Call]) -> Callable[[cf.Journal, str], cf.Agent]:
    """The app every worker runs: the agent above, its calls logged in ``calls``."""

    def app(journal: cf.Journal, stream: str) -> cf.Agent:
        model = cf.FunctionModel(partial(_model, config, calls, stream))
        return cf.Agent(journal, stream, model, tools=_TOOLS)

    return app


async def _warm_up(journal: cf.Journal, config: ChildConfig) -> None:
    """One user message served in a namespace of the process's own, before the clock
    starts: a long-running worker has its imports, caches and prepared statements warm."""
    warm = ChildConfig(**{**asdict(config), "latency": False})
    await journal.append(
        "warm", [cf.system_prompt(SYSTEM_PROMPT), cf.ContextAdded(role="user", content="m0 hi")]
    )
    worker = cf.Worker(journal, make_app(warm, []), lease=config.lease, poll_interval=0.01)
    task = asyncio.create_task(worker.run())
    while len(await journal.latest("warm", [RESPONSE], limit=2)) < 2:
        await asyncio.sleep(0.01)
    worker.stop()
    await task
    await journal.delete_stream("warm")


async def _serve(config: ChildConfig) -> None:
    """Ready once warm; serves from "go" on stdin until SIGTERM; then one JSON line: its
    CPU seconds, the worker's counts and every model call."""
    # Two fold states per stream (its context and its scheduler), for every stream this
    # process may serve: a turn on a stream evicted from the cache folds it cold.
    cache = cf.FoldCache(max_entries=max(1000, 2 * config.cached_streams + 100))
    async with cf.open_journal(
        config.dsn,
        namespace=config.namespace,
        min_size=2,
        max_size=config.pool,
        fold_cache=cache,
    ) as journal:
        await _warm_up(journal.with_namespace(f"{config.namespace}-warm-{os.getpid()}"), config)
        calls: list[Call] = []
        worker = cf.Worker(
            journal, make_app(config, calls), concurrency=config.concurrency, lease=config.lease
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        gc.collect()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        began = time.process_time()
        lags: list[float] = []
        watch = asyncio.create_task(_lag(lags))
        await worker.run()
        watch.cancel()
        report: dict[str, Any] = {
            "cpu": time.process_time() - began,
            "stats": asdict(worker.stats),
            "calls": calls,
            "lags": lags,
        }
        print(json.dumps(report), flush=True)


async def _lag(lags: list[float]) -> None:
    """How late the event loop wakes a task that sleeps 50 ms, every 50 ms: the wait a
    notification or a model's answer has before the worker gets to it."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + 0.05
        await asyncio.sleep(0.05)
        lags.append(loop.time() - asked)


def run_child(argument: str) -> None:
    """The worker process: ``argument`` is its :class:`ChildConfig` as JSON."""
    asyncio.run(_serve(ChildConfig(**json.loads(argument))))
