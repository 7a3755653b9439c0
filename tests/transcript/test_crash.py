"""Crash cleanup for real: a child process streaming into SQLite is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from contextfold.transcript import (
    INTERRUPTED,
    ReasoningPart,
    SQLiteTranscriptStore,
    StepStartPart,
    TextPart,
    ToolPart,
    is_unfinished,
    read_history,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL"),
]

S = "crash-session"

# The child: a user turn, then an assistant message that finishes a reasoning block, opens a
# text block, streams deltas, starts a tool, says "ready", and streams on (deltas, and step
# rows now and then, so the kill may land inside a write) until it is killed.
CHILD = """
import asyncio, sys
from contextfold.transcript import *

S = "crash-session"

async def main(path):
    store = SQLiteTranscriptStore(path)
    await store.open()
    bus = TranscriptBus()
    watcher = bus.subscribe(S)
    w = TranscriptWriter(store, bus)
    await w.publish(MessageStarted(session=S, message_id="u1", role="user", time="t0"))
    part = TextPart(id="u1-t", session=S, message_id="u1", text="list the files")
    await w.publish(PartAdded(session=S, message_id="u1", part=part))
    await w.publish(MessageFinished(session=S, message_id="u1", time="t0"))
    ids = dict(session=S, message_id="a1")
    await w.publish(MessageStarted(**ids, role="assistant", time="t1", parent_id="u1"))
    await w.publish(StepStarted(**ids, part_id="step-0", time="t1"))
    await w.publish(ReasoningStart(**ids, part_id="r", time="t1"))
    await w.publish(ReasoningDelta(**ids, part_id="r", delta="I should run ls.  "))
    await w.publish(ReasoningEnd(**ids, part_id="r", time="t2"))
    await w.publish(TextStart(**ids, part_id="text", time="t2"))
    for i in range(50):
        await w.publish(TextDelta(**ids, part_id="text", delta=f"word{i} "))
    tool = dict(ids, part_id="tool", call_id="call-1", tool="bash")
    await w.publish(ToolStateChanged(**tool, state="pending", time="t3"))
    await w.publish(ToolInputDelta(**ids, part_id="tool", delta='{"cmd": "ls"}'))
    await w.publish(ToolStateChanged(**tool, state="running", time="t4", input={"cmd": "ls"}))
    assert watcher.pending > 50
    print("ready", flush=True)
    i = 50
    while True:
        await w.publish(TextDelta(**ids, part_id="text", delta=f"word{i} "))
        if i % 25 == 0:
            await w.publish(StepStarted(**ids, part_id=f"step-{i}", time="t5"))
        watcher.drain()
        i += 1
        await asyncio.sleep(0)

asyncio.run(main(sys.argv[1]))
"""


async def test_cleanup_after_sigkill_closes_every_unfinished_part(tmp_path: Path) -> None:
    path = tmp_path / "transcript.db"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        if line.strip() != b"ready":
            assert child.stderr is not None
            pytest.fail(f"child did not start: {line!r} {await child.stderr.read()!r}")
        await asyncio.sleep(0.3)  # let it stream (and write) mid-block for a while
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL

    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    raw.close()

    async with SQLiteTranscriptStore(path) as store:
        messages, parts = await store.unfinished(S)
        assert [m.id for m in messages] == ["a1"]
        assert {p.id for p in parts} == {"text", "tool"}
        stored_text = next(p for p in parts if p.id == "text")
        assert isinstance(stored_text, TextPart) and stored_text.text == ""  # deltas never stored

        # Nobody holds the dead writer's buffer: parts close with what was stored.
        result = await store.cleanup_unfinished(S, now="t-cleanup")
        assert {p.id for p in result.parts} == {"text", "tool"}
        assert await store.unfinished(S) == ((), ())
        assert not await store.cleanup_unfinished(S, now="t-again")  # nothing left to do

        history = await read_history(store, S)
    user, answer = history
    assert user.message.succeeded and [p.text for p in user.parts] == ["list the files"]  # type: ignore[union-attr]
    assert answer.message.finish == INTERRUPTED and answer.message.completed == "t-cleanup"
    assert not answer.message.succeeded
    by_id = {p.id: p for p in answer.parts}
    text, tool, reasoning = by_id["text"], by_id["tool"], by_id["r"]
    assert isinstance(text, TextPart) and text.end == "t-cleanup" and text.text == ""
    assert isinstance(tool, ToolPart)
    assert (tool.state, tool.error, tool.end) == ("error", INTERRUPTED, "t-cleanup")
    assert tool.input == {"cmd": "ls"} and tool.start == "t4"
    assert isinstance(reasoning, ReasoningPart)
    assert (reasoning.text, reasoning.end) == ("I should run ls.", "t2")  # finished: untouched
    steps = [p for p in answer.parts if isinstance(p, StepStartPart)]
    assert steps and steps[0].id == "step-0"
    # Every message and part is closed now.
    for entry in history:
        assert not is_unfinished(entry.message)
        for part in entry.parts:
            assert not is_unfinished(part)
            assert not isinstance(part, ToolPart) or part.state in ("completed", "error")


async def test_a_live_cleanup_keeps_the_confirmed_text(tmp_path: Path) -> None:
    """The other way a block ends early: the writer's process lives and confirms its buffer."""
    from contextfold.transcript import (
        MessageStarted,
        TextDelta,
        TextStart,
        TranscriptWriter,
    )

    async with SQLiteTranscriptStore(tmp_path / "t.db") as store:
        writer = TranscriptWriter(store)
        await writer.publish(MessageStarted(session=S, message_id="a", role="assistant", time="t"))
        await writer.publish(TextStart(session=S, message_id="a", part_id="p", time="t"))
        await writer.publish(TextDelta(session=S, message_id="a", part_id="p", delta="kept "))
        await store.cleanup_unfinished(S, writer.confirmed(S), now="t2")
        part = await store.get_part(S, "p")
        assert isinstance(part, TextPart) and (part.text, part.end) == ("kept", "t2")
