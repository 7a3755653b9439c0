"""The streaming persistence policy: deltas on the bus only, rows at boundaries."""

from __future__ import annotations

from typing import Any

import pytest

import contextfold as cf
from contextfold.errors import InvalidInputError
from contextfold.transcript import (
    INTERRUPTED,
    BusEvent,
    Message,
    MessageFinished,
    MessageStarted,
    Part,
    PartAdded,
    PartDelta,
    PartUpdated,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    SQLiteTranscriptStore,
    StepFinished,
    StepFinishPart,
    StepStarted,
    Subscription,
    TextDelta,
    TextEnd,
    TextPart,
    TextStart,
    ToolInputDelta,
    ToolPart,
    ToolStateChanged,
    TranscriptBus,
    TranscriptStore,
    TranscriptWriter,
    read_history,
    rebuild,
)
from contextfold.transcript.projector import BOUNDARY_TYPES
from contextfold.wire import Usage

S = "session-1"
M = "msg-a"


class WriteSpy:
    """Records every ``store.write`` call (each one a transaction of rows)."""

    def __init__(self, store: TranscriptStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[Message | Part, ...]] = []
        original = store.write

        async def write(*, messages: Any = (), parts: Any = ()) -> None:
            self.calls.append((*messages, *parts))
            await original(messages=messages, parts=parts)

        monkeypatch.setattr(store, "write", write)

    @property
    def rows(self) -> list[Message | Part]:
        return [row for call in self.calls for row in call]


def drain(sub: Subscription) -> list[BusEvent]:
    return sub.drain()


async def start(writer: TranscriptWriter, message_id: str = M, **kwargs: Any) -> None:
    await writer.publish(
        MessageStarted(session=S, message_id=message_id, role="assistant", time="t0", **kwargs)
    )


async def test_deltas_are_never_written_as_rows(
    store: TranscriptStore, raw_rows: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = WriteSpy(store, monkeypatch)
    writer = TranscriptWriter(store, TranscriptBus())
    await start(writer)
    await writer.publish(TextStart(session=S, message_id=M, part_id="t", time="t1"))
    after_start = await raw_rows(store)
    deltas = [f"token{i} " for i in range(99)] + ["end.  \n\t "]
    for delta in deltas:
        assert (
            await writer.publish(TextDelta(session=S, message_id=M, part_id="t", delta=delta))
            is None
        )
    assert await raw_rows(store) == after_start  # 100 deltas, not one row touched
    assert len(spy.calls) == 2
    row = await writer.publish(TextEnd(session=S, message_id=M, part_id="t", time="t2"))

    rows = await raw_rows(store)
    assert [(r.table, r.id, r.open) for r in rows] == [("messages", M, True), ("parts", "t", False)]
    assert rows[1].data["text"] == "".join(deltas).rstrip() == row.text  # type: ignore[union-attr]
    assert rows[1].data["text"].endswith("token98 end.")
    assert (rows[1].data["start"], rows[1].data["end"]) == ("t1", "t2")
    # Exactly three writes: message start, text start (empty), text end (whole, trimmed).
    assert [type(r).__name__ for r in spy.rows] == ["Message", "TextPart", "TextPart"]
    assert [r.text for r in spy.rows if isinstance(r, TextPart)] == ["", row.text]  # type: ignore[union-attr]


async def test_reasoning_follows_the_same_policy(store: TranscriptStore, raw_rows: Any) -> None:
    writer = TranscriptWriter(store)
    await start(writer)
    await writer.publish(ReasoningStart(session=S, message_id=M, part_id="r", time="t1"))
    for word in ("think ", "hard", "  "):
        await writer.publish(ReasoningDelta(session=S, message_id=M, part_id="r", delta=word))
    assert [r.data["text"] for r in await raw_rows(store) if r.table == "parts"] == [""]
    await writer.publish(ReasoningEnd(session=S, message_id=M, part_id="r", time="t2"))
    parts = [r for r in await raw_rows(store) if r.table == "parts"]
    assert [(p.data["kind"], p.data["text"], p.open) for p in parts] == [
        ("reasoning", "think hard", False)
    ]


async def test_deltas_reach_every_subscriber_in_order(store: TranscriptStore) -> None:
    bus = TranscriptBus()
    first, second = bus.subscribe(S), bus.subscribe(S)
    other = bus.subscribe("another-session")
    writer = TranscriptWriter(store, bus)
    await start(writer)
    await writer.publish(TextStart(session=S, message_id=M, part_id="t", time="t1"))
    deltas = [f"d{i}" for i in range(100)]
    for delta in deltas:
        await writer.publish(TextDelta(session=S, message_id=M, part_id="t", delta=delta))
    await writer.publish(TextEnd(session=S, message_id=M, part_id="t", time="t2"))

    for sub in (first, second):
        events = drain(sub)
        kinds = [e.type for e in events]
        assert kinds == ["message-updated", "part-updated"] + ["part-delta"] * 100 + [
            "part-updated"
        ]
        received = [e.delta for e in events if isinstance(e, PartDelta)]
        assert received == deltas
        assert all(
            e.part_id == "t" and e.message_id == M for e in events if isinstance(e, PartDelta)
        )
        end = events[-1]
        assert isinstance(end, PartUpdated) and end.part.text == "".join(deltas)  # type: ignore[union-attr]
    assert other.pending == 0


async def test_tool_input_deltas_are_neither_stored_nor_broadcast(
    store: TranscriptStore, raw_rows: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = TranscriptBus()
    sub = bus.subscribe(S)
    writer = TranscriptWriter(store, bus)
    await start(writer)
    tool = {"session": S, "message_id": M, "part_id": "call", "call_id": "c1", "tool": "grep"}
    await writer.publish(ToolStateChanged(**tool, state="pending", time="t1"))
    before_rows, before_events = await raw_rows(store), drain(sub)
    spy = WriteSpy(store, monkeypatch)
    for chunk in ('{"pat', 'tern": ', '"x"}'):
        result = await writer.publish(
            ToolInputDelta(session=S, message_id=M, part_id="call", delta=chunk)
        )
        assert result is None
    assert spy.calls == []
    assert sub.pending == 0
    assert await raw_rows(store) == before_rows
    assert [e.type for e in before_events] == ["message-updated", "part-updated"]


async def test_every_tool_state_transition_is_written_as_a_row(
    store: TranscriptStore, raw_rows: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = WriteSpy(store, monkeypatch)
    bus = TranscriptBus()
    sub = bus.subscribe(S)
    writer = TranscriptWriter(store, bus)
    await start(writer)
    ids = {"session": S, "message_id": M, "call_id": "c1", "tool": "grep"}
    args = {"pattern": "TODO", "path": "src"}
    await writer.publish(ToolStateChanged(**ids, part_id="a", state="pending", time="t1"))
    await writer.publish(
        ToolStateChanged(**ids, part_id="a", state="running", time="t2", input=args)
    )
    await writer.publish(
        ToolStateChanged(**ids, part_id="a", state="completed", time="t3", output="3 matches")
    )
    await writer.publish(
        ToolStateChanged(**ids, part_id="b", state="running", time="t4", input=args)
    )
    await writer.publish(
        ToolStateChanged(**ids, part_id="b", state="error", time="t5", error="boom")
    )

    tools = [r for r in spy.rows if isinstance(r, ToolPart)]
    assert [(t.id, t.state) for t in tools] == [
        ("a", "pending"),
        ("a", "running"),
        ("a", "completed"),
        ("b", "running"),
        ("b", "error"),
    ]
    updates = [e.part.state for e in drain(sub) if isinstance(e, PartUpdated)]  # type: ignore[union-attr]
    assert updates == ["pending", "running", "completed", "running", "error"]
    stored = {r.id: r.data for r in await raw_rows(store) if r.table == "parts"}
    a = stored["a"]
    assert (a["state"], a["output"], a["error"]) == ("completed", "3 matches", None)
    assert a["input"] == args  # kept from the running transition
    assert (a["start"], a["end"]) == ("t2", "t3")
    assert (stored["b"]["state"], stored["b"]["error"], stored["b"]["input"]) == (
        "error",
        "boom",
        args,
    )


async def test_step_boundaries_are_rows_with_usage_and_cost(
    store: TranscriptStore, raw_rows: Any
) -> None:
    writer = TranscriptWriter(store)
    await start(writer)
    await writer.publish(
        StepStarted(session=S, message_id=M, part_id="s1", time="t1", snapshot="snap-0")
    )
    usage = Usage(
        input_tokens=1200,
        output_tokens=340,
        reasoning_tokens=55,
        cached_input_tokens=800,
        cache_write_tokens=64,
    )
    row = await writer.publish(
        StepFinished(
            session=S,
            message_id=M,
            part_id="s2",
            time="t2",
            reason="stop",
            usage=usage,
            cost=0.0123,
        )
    )
    assert isinstance(row, StepFinishPart) and row.usage == usage
    parts = {r.id: r.data for r in await raw_rows(store) if r.table == "parts"}
    assert parts["s1"]["kind"] == "step-start" and parts["s1"]["snapshot"] == "snap-0"
    assert parts["s2"]["kind"] == "step-finish"
    assert parts["s2"]["usage"] == {
        "input_tokens": 1200,
        "output_tokens": 340,
        "cached_input_tokens": 800,
        "cache_write_tokens": 64,
        "reasoning_tokens": 55,
    }
    assert parts["s2"]["cost"] == pytest.approx(0.0123)
    assert parts["s2"]["reason"] == "stop"


async def test_message_finish_rewrites_the_message_row(
    store: TranscriptStore, raw_rows: Any
) -> None:
    writer = TranscriptWriter(store)
    await start(writer, parent_id="u1", model="m/x")
    await writer.publish(MessageFinished(session=S, message_id=M, time="t9", finish="stop"))
    (row,) = [r for r in await raw_rows(store) if r.table == "messages"]
    assert not row.open
    assert (row.data["finish"], row.data["completed"], row.data["parent_id"]) == (
        "stop",
        "t9",
        "u1",
    )


async def test_post_processing_runs_before_the_trim(tmp_path: Any) -> None:
    async with SQLiteTranscriptStore(tmp_path / "t.db") as store:
        writer = TranscriptWriter(
            store, post_process=lambda text: text.replace("secret", "***") + "  "
        )
        await start(writer)
        await writer.publish(TextStart(session=S, message_id=M, part_id="t", time="t1"))
        await writer.publish(TextDelta(session=S, message_id=M, part_id="t", delta="a secret"))
        row = await writer.publish(TextEnd(session=S, message_id=M, part_id="t", time="t2"))
        assert isinstance(row, TextPart) and row.text == "a ***"


async def test_misuse_is_refused_and_writes_nothing(store: TranscriptStore, raw_rows: Any) -> None:
    bus = TranscriptBus()
    sub = bus.subscribe(S)
    writer = TranscriptWriter(store, bus)
    with pytest.raises(InvalidInputError, match="text-start first"):
        await writer.publish(TextDelta(session=S, message_id=M, part_id="nope", delta="x"))
    with pytest.raises(InvalidInputError, match="never started"):
        await writer.publish(TextEnd(session=S, message_id=M, part_id="nope", time="t"))
    with pytest.raises(InvalidInputError, match="message-started first"):
        await writer.publish(MessageFinished(session=S, message_id=M, time="t"))
    await start(writer)
    await writer.publish(ReasoningStart(session=S, message_id=M, part_id="r", time="t1"))
    with pytest.raises(InvalidInputError, match="no text block"):
        await writer.publish(TextDelta(session=S, message_id=M, part_id="r", delta="x"))
    with pytest.raises(InvalidInputError, match="is a reasoning part"):
        await writer.publish(TextEnd(session=S, message_id=M, part_id="r", time="t"))
    wrong = TextPart(id="p", session="elsewhere", message_id=M, text="hi")
    with pytest.raises(InvalidInputError, match="belongs to message"):
        await writer.publish(PartAdded(session=S, message_id=M, part=wrong))
    with pytest.raises(InvalidInputError, match="transcript stream events"):
        await writer.publish("text-delta")  # type: ignore[arg-type]
    assert [e.type for e in drain(sub)] == ["message-updated", "part-updated"]
    assert len(await raw_rows(store)) == 2


async def test_a_new_writer_finishes_rows_another_started(store: TranscriptStore) -> None:
    await start(TranscriptWriter(store))
    row = await TranscriptWriter(store).publish(
        MessageFinished(session=S, message_id=M, time="t2", finish="stop")
    )
    assert isinstance(row, Message) and row.completed == "t2"


async def test_interrupt_closes_open_rows_with_confirmed_text(store: TranscriptStore) -> None:
    bus = TranscriptBus()
    sub = bus.subscribe(S)
    writer = TranscriptWriter(store, bus)
    await start(writer)
    await writer.publish(TextStart(session=S, message_id=M, part_id="t", time="t1"))
    for delta in ("partial ", "answer ", " "):
        await writer.publish(TextDelta(session=S, message_id=M, part_id="t", delta=delta))
    tool = {"session": S, "message_id": M, "part_id": "c", "call_id": "c", "tool": "sh"}
    await writer.publish(ToolStateChanged(**tool, state="running", time="t2", input={"cmd": "ls"}))
    assert writer.confirmed(S) == {"t": "partial answer  "}
    drain(sub)

    result = await writer.interrupt(S, now="t3")
    assert [m.finish for m in result.messages] == [INTERRUPTED]
    by_id = {p.id: p for p in result.parts}
    assert by_id["t"].text == "partial answer" and by_id["t"].end == "t3"  # type: ignore[union-attr]
    assert (by_id["c"].state, by_id["c"].error) == ("error", INTERRUPTED)  # type: ignore[union-attr]
    announced = drain(sub)
    assert {e.type for e in announced} == {"message-updated", "part-updated"} and len(
        announced
    ) == 3
    assert writer.confirmed(S) == {}
    assert await store.unfinished(S) == ((), ())
    assert not (await store.cleanup_unfinished(S, now="t4"))  # nothing left to close


async def test_journal_holds_boundaries_only_and_rebuilds_the_rows(
    store: TranscriptStore, tmp_path: Any
) -> None:
    journal = cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}")
    writer = TranscriptWriter(store, journal=journal)
    await writer.publish(MessageStarted(session=S, message_id="u", role="user", time="t0"))
    await writer.publish(
        PartAdded(
            session=S, message_id="u", part=TextPart(id="u-t", session=S, message_id="u", text="hi")
        )
    )
    await writer.publish(MessageFinished(session=S, message_id="u", time="t0"))
    await start(writer, parent_id="u")
    await writer.publish(StepStarted(session=S, message_id=M, part_id="s1", time="t1"))
    await writer.publish(TextStart(session=S, message_id=M, part_id="t", time="t1"))
    for delta in ("Hello", ", ", "world!\n"):
        await writer.publish(TextDelta(session=S, message_id=M, part_id="t", delta=delta))
    await writer.publish(TextEnd(session=S, message_id=M, part_id="t", time="t2"))
    tool = {"session": S, "message_id": M, "part_id": "c", "call_id": "c", "tool": "sh"}
    await writer.publish(ToolStateChanged(**tool, state="pending", time="t3"))
    await writer.publish(ToolInputDelta(session=S, message_id=M, part_id="c", delta="{}"))
    await writer.publish(ToolStateChanged(**tool, state="running", time="t4", input={"cmd": "ls"}))
    await writer.publish(ToolStateChanged(**tool, state="completed", time="t5", output="a b"))
    await writer.publish(
        StepFinished(session=S, message_id=M, part_id="s2", time="t6", reason="stop", cost=0.5)
    )
    await writer.publish(MessageFinished(session=S, message_id=M, time="t6", finish="stop"))

    stored = [e async for e in journal.read_all(S)]
    assert {e.type for e in stored} <= set(BOUNDARY_TYPES)
    assert not any(e.type.endswith("delta") for e in stored)
    ends = [e.payload for e in stored if e.type == TextEnd.event_type]
    assert [p["text"] for p in ends] == ["Hello, world!"]

    async with SQLiteTranscriptStore(tmp_path / "rebuilt.db") as rebuilt:
        written = await rebuild(journal, S, rebuilt)
        assert written == 7
        assert await read_history(rebuilt, S) == await read_history(store, S)
    await journal.close()
