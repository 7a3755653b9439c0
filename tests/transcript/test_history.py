"""filter_compacted: the model-facing view starts at the newest completed compaction and
keeps the tail it retained (opencode's ``tail_start_id``) behind the summary."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from contextfold.transcript import (
    CompactionPart,
    CompactionRequested,
    Message,
    MessageFinished,
    MessageStarted,
    MessageWithParts,
    PartAdded,
    TextDelta,
    TextEnd,
    TextPart,
    TextStart,
    TranscriptStore,
    TranscriptWriter,
    compacted_history,
    filter_compacted,
    is_compaction_boundary,
    read_history,
)

S = "s"


def user(mid: str, *, compaction: bool = False, tail: str | None = None) -> MessageWithParts:
    message = Message(id=mid, session=S, role="user", created=mid, completed=mid)
    parts: list[Any] = [TextPart(id=f"{mid}-t", session=S, message_id=mid, text=f"prompt {mid}")]
    if compaction or tail is not None:
        parts.append(
            CompactionPart(id=f"{mid}-c", session=S, message_id=mid, auto=True, tail_start_id=tail)
        )
    return MessageWithParts(message=message, parts=tuple(parts))


def assistant(mid: str, parent: str, *, summary: bool = False, **end: Any) -> MessageWithParts:
    fields = {"finish": "stop", "completed": mid} | end
    message = Message(
        id=mid,
        session=S,
        role="assistant",
        created=mid,
        parent_id=parent,
        summary=summary,
        **fields,
    )
    return MessageWithParts(
        message=message, parts=(TextPart(id=f"{mid}-t", session=S, message_id=mid, text="answer"),)
    )


def ids(view: tuple[MessageWithParts, ...]) -> list[str]:
    return [entry.message.id for entry in view]


OLD = [user("u1"), assistant("a1", "u1"), user("u2"), assistant("a2", "u2")]


def test_a_boundary_drops_older_history_and_keeps_the_tail_oldest_first() -> None:
    history = [
        *OLD,
        user("u3", compaction=True),
        assistant("a3", "u3", summary=True),
        user("u4"),  # the retained tail: everything after the boundary stays
        assistant("a4", "u4"),
        user("u5"),
    ]
    snapshot = list(history)
    view = filter_compacted(history)
    assert ids(view) == ["u3", "a3", "u4", "a4", "u5"]
    assert history == snapshot  # the input is not changed
    assert view[0].parts == history[4].parts  # the boundary keeps its compaction part


def test_a_retained_tail_follows_the_summary() -> None:
    """opencode's tail_start_id: u1, a1, u2, a2, C(tail u2), S gives [C, S, u2, a2]."""
    history = [*OLD, user("C", tail="u2"), assistant("S", "C", summary=True)]
    snapshot = list(history)
    assert ids(filter_compacted(history)) == ["C", "S", "u2", "a2"]
    assert history == snapshot
    # What came after the summary follows the tail.
    later = [*history, user("u3"), assistant("a3", "u3")]
    assert ids(filter_compacted(later)) == ["C", "S", "u2", "a2", "u3", "a3"]


def test_without_a_tail_the_view_starts_at_the_boundary() -> None:
    """u1, a1, C, S gives [C, S]."""
    history = [user("u1"), assistant("a1", "u1"), user("C", compaction=True)]
    history.append(assistant("S", "C", summary=True))
    assert ids(filter_compacted(history)) == ["C", "S"]


def test_a_tail_naming_no_older_message_retains_nothing() -> None:
    for tail in ("gone", "C", "S", "u3"):  # missing, the boundary itself, or not older
        history = [*OLD, user("C", tail=tail), assistant("S", "C", summary=True), user("u3")]
        assert ids(filter_compacted(history)) == ["C", "S", "u3"], tail


def test_a_failed_summary_retains_the_whole_history_whatever_its_tail() -> None:
    history = [*OLD, user("C", tail="u2"), assistant("S", "C", summary=True, error="500")]
    assert filter_compacted(history) == tuple(history)


def test_without_a_boundary_everything_is_returned() -> None:
    assert filter_compacted(OLD) == tuple(OLD)
    assert filter_compacted([]) == ()


def test_a_failed_summary_is_no_boundary() -> None:
    for failed in (
        {"error": "provider returned 500"},
        {"finish": "interrupted", "error": None},
        {"finish": None, "completed": None},  # still streaming
        {"finish": None},
    ):
        history = [*OLD, user("u3", compaction=True), assistant("a3", "u3", summary=True, **failed)]
        assert ids(filter_compacted(history)) == ["u1", "a1", "u2", "a2", "u3", "a3"], failed


def test_a_summary_needs_a_parent_with_a_compaction_part() -> None:
    no_part = [*OLD, user("u3"), assistant("a3", "u3", summary=True)]
    assert filter_compacted(no_part) == tuple(no_part)
    not_summary = [*OLD, user("u3", compaction=True), assistant("a3", "u3")]
    assert filter_compacted(not_summary) == tuple(not_summary)
    # A compaction request whose summary has not come yet: nothing dropped.
    pending = [*OLD, user("u3", compaction=True)]
    assert filter_compacted(pending) == tuple(pending)


def test_the_newest_boundary_wins() -> None:
    history = [
        *OLD,
        user("u3", compaction=True),
        assistant("a3", "u3", summary=True),
        user("u4"),
        user("u5", compaction=True),
        assistant("a5", "u5", summary=True),
        user("u6"),
    ]
    assert ids(filter_compacted(history)) == ["u5", "a5", "u6"]
    # A failed newer compaction falls back to the older successful one.
    history[-2] = assistant("a5", "u5", summary=True, error="context too long")
    assert ids(filter_compacted(history)) == ["u3", "a3", "u4", "u5", "a5", "u6"]


entries = st.lists(
    st.tuples(
        st.sampled_from(["user", "user+c", "user+tail", "assistant", "summary", "bad-summary"]),
        st.integers(0, 30),
    ),
    max_size=30,
)


def _history(spec: list[tuple[str, int]]) -> list[MessageWithParts]:
    history = []
    for index, (kind, link) in enumerate(spec):
        mid, other = f"x{index}", f"x{link}"
        if kind.startswith("user"):
            tail = other if kind == "user+tail" else None
            history.append(user(mid, compaction=kind == "user+c", tail=tail))
        else:
            extra: dict[str, Any] = {"error": "failed"} if kind == "bad-summary" else {}
            history.append(assistant(mid, other, summary=kind != "assistant", **extra))
    return history


def _summaries_of(history: list[MessageWithParts], index: int) -> list[int]:
    """Indices of the successful summaries newer than ``history[index]`` answering it."""
    mid = history[index].message.id
    return [
        i
        for i in range(index + 1, len(history))
        if history[i].message.summary
        and history[i].message.succeeded
        and history[i].message.parent_id == mid
    ]


@given(entries)
def test_the_view_starts_at_the_newest_boundary_with_its_summary_and_tail(
    spec: list[tuple[str, int]],
) -> None:
    history = _history(spec)
    snapshot = list(history)
    boundaries = [
        i for i, e in enumerate(history) if is_compaction_boundary(e) and _summaries_of(history, i)
    ]
    view = filter_compacted(history)
    assert history == snapshot
    if not boundaries:
        assert view == tuple(history)
        return
    boundary = boundaries[-1]
    summary = _summaries_of(history, boundary)[0]
    [part] = [p for p in history[boundary].parts if isinstance(p, CompactionPart)]
    older = [e.message.id for e in history[:boundary]]
    tail_id = part.tail_start_id
    tail = history[older.index(tail_id) : boundary] if tail_id in older else []
    assert view == (*history[boundary : summary + 1], *tail, *history[summary + 1 :])


async def test_compacted_history_from_a_store(store: TranscriptStore) -> None:
    writer = TranscriptWriter(store)

    async def turn(uid: str, aid: str, *, compaction: bool = False, summary: bool = False) -> None:
        await writer.publish(MessageStarted(session=S, message_id=uid, role="user", time=uid))
        part = TextPart(id=f"{uid}-t", session=S, message_id=uid, text="go")
        await writer.publish(PartAdded(session=S, message_id=uid, part=part))
        if compaction:
            await writer.publish(CompactionRequested(session=S, message_id=uid, part_id=f"{uid}-c"))
        await writer.publish(MessageFinished(session=S, message_id=uid, time=uid))
        await writer.publish(
            MessageStarted(
                session=S,
                message_id=aid,
                role="assistant",
                time=aid,
                parent_id=uid,
                summary=summary,
            )
        )
        await writer.publish(TextStart(session=S, message_id=aid, part_id=f"{aid}-t", time=aid))
        await writer.publish(TextDelta(session=S, message_id=aid, part_id=f"{aid}-t", delta="ok"))
        await writer.publish(TextEnd(session=S, message_id=aid, part_id=f"{aid}-t", time=aid))
        await writer.publish(MessageFinished(session=S, message_id=aid, time=aid, finish="stop"))

    for i in range(30):
        await turn(f"u{i:02d}", f"a{i:02d}")
    await turn("u30", "a30", compaction=True, summary=True)
    await turn("u31", "a31")

    full = await read_history(store, S, page_size=7)
    assert len(full) == 64  # nothing is ever dropped from the full history
    view = await compacted_history(store, S, page_size=7)
    assert ids(view) == ["u30", "a30", "u31", "a31"]
    assert [p.kind for p in view[0].parts] == ["text", "compaction"]
