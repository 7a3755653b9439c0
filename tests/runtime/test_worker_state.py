"""A worker's per-stream status: one record per stream, its state changed only by the
transitions of ``Streams``, which keep the queue (first in, first out) and the running and
blocked indexes exactly the streams in those states, whatever the order of events."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from contextfold.runtime._worker_state import ChangeKeys, Mark, Streams, StreamState, StreamStatus

NAMES = ("a", "b", "c", "d")
T0 = datetime(2025, 1, 1, tzinfo=UTC)

Op = tuple[str, int, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(["change", "start", "block", "finish", "due"]),
        st.integers(0, len(NAMES) - 1),
        st.integers(0, 20),
    ),
    max_size=60,
)


def _fixed(wall: datetime) -> Callable[[], datetime]:
    return lambda: wall


def _check(streams: Streams, statuses: list[StreamStatus], order: list[str]) -> None:
    by_state = {state: {s.stream for s in statuses if s.state is state} for state in StreamState}
    assert list(streams.waiting) == order  # the queue: exactly the QUEUED ones, in order
    assert set(order) == by_state[StreamState.QUEUED] and len(set(order)) == len(order)
    assert streams.queued == len(order)
    assert set(streams.running) == by_state[StreamState.RUNNING]
    assert (streams.next_due(0.0, lambda: T0) is None) == (not by_state[StreamState.BLOCKED])
    for status in statuses:
        if status.state is not StreamState.RUNNING:
            assert (status.task, status.lease, status.again) == (None, None, False)
        if status.state is StreamState.BLOCKED:
            assert status.until is not None
        elif status.state is not StreamState.RUNNING:
            assert (status.until, status.recheck) == (None, None)


@given(ops)
def test_every_transition_keeps_one_state_per_stream_and_the_indexes_exact(ops: list[Op]) -> None:
    streams = Streams()
    statuses = [streams.add(name) for name in NAMES]
    order: list[str] = []  # the queue as a model: first in, first out
    blocked: list[StreamStatus] = []  # in the order they were blocked
    for op, index, at in ops:
        status = statuses[index]
        if op == "change":
            state = status.state
            woke = streams.change(status, recheck=float(at))
            if state is StreamState.IDLE:
                order.append(status.stream)
            assert woke == (state in (StreamState.IDLE, StreamState.BLOCKED))
            assert status.again == (state is StreamState.RUNNING)
        elif op == "start":
            started = streams.start()
            if order:
                assert started is not None and started.stream == order.pop(0)
                assert started.state is StreamState.RUNNING
            else:
                assert started is None
        elif op == "block" and status.state is StreamState.RUNNING:
            streams.block(status, T0 + timedelta(seconds=at))
        elif op == "finish" and status.state is StreamState.RUNNING:
            until, again = status.until, status.again
            assert streams.finish(status) == again
            assert status.state is (StreamState.IDLE if until is None else StreamState.BLOCKED)
            if until is not None:
                blocked.append(status)
        elif op == "due":
            wall = T0 + timedelta(seconds=at)
            due = [
                s
                for s in blocked
                if (s.until is not None and wall >= s.until)
                or (s.recheck is not None and at >= s.recheck)
            ]
            assert streams.due(float(at), _fixed(wall)) == bool(due)
            order += [s.stream for s in due]
            blocked = [s for s in blocked if s not in due]
        _check(streams, statuses, order)


def test_a_blocked_stream_is_due_at_its_time_or_soon_after_it_changed() -> None:
    streams = Streams()
    status = streams.add("s")
    streams.change(status, recheck=0.0)
    assert streams.start() is status
    streams.block(status, T0 + timedelta(seconds=30))
    assert not streams.finish(status)
    assert status.state is StreamState.BLOCKED
    assert streams.next_due(0.0, lambda: T0) == 30.0
    assert not streams.due(0.0, lambda: T0)
    assert streams.change(status, recheck=5.0)  # changed: looked at by then at the latest
    assert streams.change(status, recheck=9.0)  # the first recheck holds
    assert streams.next_due(1.0, lambda: T0) == 4.0
    assert not streams.due(4.0, lambda: T0)
    assert streams.due(5.0, lambda: T0)
    assert streams.waiting == ("s",) and (status.until, status.recheck) == (None, None)


def test_a_key_no_scan_listed_is_noted_once_then_another_namespace_s() -> None:
    keys = ChangeKeys(limit=10)
    status = StreamStatus("s")
    keys.learn("k-s", status)
    assert keys.find("k-s") is status
    assert keys.find("k-x") is None
    assert keys.note("k-x")  # new: a scan should look
    assert not keys.note("k-x")  # noted already
    keys.scanned()  # the scan did not list it: another namespace's
    assert not keys.note("k-x")
    keys.learn("k-x", StreamStatus("x"))  # a stream of this namespace after all
    keys.scanned()
    assert keys.find("k-x") is not None


def test_changes_heard_merge_to_the_newer_and_a_deletion_is_never_lost() -> None:
    left_idle = Mark(8, 8)
    deleted = Mark(0)
    listed = Mark(8)  # a scan's: the stream made again to the version it was left at
    assert deleted.newer(listed) == deleted  # not the listing, which it would cover
    assert not left_idle.covers(deleted.newer(listed))
    assert listed.newer(deleted) == deleted
    assert Mark(5).newer(Mark(7)) == Mark(7)  # a later listing
    assert Mark(9, 20).newer(Mark(8, 18)) == Mark(9, 20)  # by head, whatever came last
    assert Mark(9, 20).newer(Mark(9)) == Mark(9, 20)  # the same version, said with less
    assert Mark(9, 20).newer(Mark(10)) == Mark(10)
    assert Mark(10).newer(Mark(9, 20)) == Mark(9, 20)
