"""Property tests of JournalSession's units and state: a limited or budgeted window is the
largest run of whole units that fits, for any interleaving of calls, outputs and reasoning;
any sequence of adds, pops, clears and compactions reads as the same list operations on a
plain list, warm or cold."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from agents.items import TResponseInputItem
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.integrations._openai_agents_session import (
    SESSION_FOLD,
    ItemAdded,
    SessionState,
    newest_window,
)
from contextfold.integrations.openai_agents import JournalSession
from contextfold.journal import Journal
from contextfold.store.memory import MemoryStore
from contextfold.testing import envelopes

CALL_IDS = ["a", "b", "c"]


def _item(kind: str, key: str, n: int) -> dict[str, Any]:
    if kind == "call":
        return {"type": "function_call", "call_id": key, "name": "f", "arguments": "{}"}
    if kind == "output":
        return {"type": "function_call_output", "call_id": key, "output": "x" * n}
    if kind == "reasoning":
        return {"type": "reasoning", "id": f"rs_{n}", "summary": []}
    if kind == "request":
        return {"type": "mcp_approval_request", "id": key, "name": "t", "arguments": "{}"}
    if kind == "response":
        return {"type": "mcp_approval_response", "approval_request_id": key, "approve": True}
    return {"role": "user", "content": "y" * n}


items_strategy = st.lists(
    st.builds(
        _item,
        st.sampled_from(["call", "output", "reasoning", "message", "request", "response"]),
        st.sampled_from(CALL_IDS),
        st.integers(0, 40),
    ),
    max_size=25,
)


def _state(items: list[dict[str, Any]]) -> SessionState:
    return SESSION_FOLD.apply_all(
        SESSION_FOLD.initial_state(), envelopes(ItemAdded(item=it) for it in items)
    )


def _pairs(items: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Every (earlier, later) pair of indexes that must travel together, found by brute force."""
    pairs = []
    for j, it in enumerate(items):
        if j and items[j - 1].get("type") == "reasoning":
            pairs.append((j - 1, j))
        if it.get("type") == "function_call_output":
            opened = [
                i
                for i in range(j)
                if items[i].get("type") == "function_call" and items[i]["call_id"] == it["call_id"]
            ]
            if opened:
                pairs.append((opened[-1], j))
        if it.get("type") == "mcp_approval_response":
            opened = [
                i
                for i in range(j)
                if items[i].get("type") == "mcp_approval_request"
                and items[i]["id"] == it["approval_request_id"]
            ]
            if opened:
                pairs.append((opened[-1], j))
    return pairs


def _tokens(item: dict[str, Any]) -> int:
    return -(-len(cf.canonical.dumps(item)) // 4)


@settings(max_examples=300, deadline=None)
@given(items_strategy, st.integers(0, 30), st.one_of(st.none(), st.integers(1, 120)))
def test_a_window_is_the_largest_run_of_whole_units_that_fits(
    items: list[dict[str, Any]], limit: int, budget: int | None
) -> None:
    state = _state(items)
    window = newest_window(state, limit=limit, budget=budget)
    pairs = _pairs(items)
    n = len(items)

    def fits(cut: int) -> bool:
        whole = not any(a < cut <= b for a, b in pairs)
        small = n - cut <= limit
        cheap = budget is None or sum(_tokens(it) for it in items[cut:]) <= budget
        return whole and small and cheap

    best = min((cut for cut in range(n + 1) if fits(cut)), default=n)
    assert window.start == best
    assert window.tokens == sum(_tokens(it) for it in items[best:])


def _message(text: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": "user", "content": text})


def _compaction(n: int) -> TResponseInputItem:
    return cast(TResponseInputItem, {"type": "compaction", "encrypted_content": f"c{n}"})


async def _replay(ops: list[tuple[str, Any]]) -> None:
    store = MemoryStore()
    journal = Journal(store)
    session = JournalSession(journal, "props")
    model: list[TResponseInputItem] = []
    counter = 0
    for op, arg in ops:
        if op == "add":
            batch = [
                cast(TResponseInputItem, {"role": "user", "content": f"m{counter + i}"})
                for i in range(arg)
            ]
            counter += arg
            await session.add_items(batch)
            model.extend(batch)
        elif op == "pop":
            popped = await session.pop_item()
            assert popped == (model.pop() if model else None)
        elif op == "clear":
            await session.clear_session()
            model.clear()
        elif op == "replace":
            out = [
                cast(TResponseInputItem, {"type": "compaction", "encrypted_content": f"c{counter}"})
            ]
            counter += 1
            await session._atomic_replace_items(out)
            model[:] = out
        else:  # a suffix compaction: the newest `size` items, replaced from `first` on
            size, first = arg
            snapshot = await session._get_compaction_snapshot(size)
            assert snapshot.items == (model[-size:] if size else [])
            out = [
                cast(TResponseInputItem, {"type": "compaction", "encrypted_content": f"c{counter}"})
            ]
            counter += 1
            replaced = await snapshot.replace_suffix(first, out)
            kept = len(model) - min(size, len(model))
            assert replaced == (first < len(model) - kept)
            if replaced:
                model[kept + first :] = out
        assert await session.get_items() == model
    # Cold: a new journal over the same store folds the stream from its start.
    cold = JournalSession(Journal(store), "props")
    assert await cold.get_items() == model
    await journal.close()


ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 3)),
        st.tuples(st.just("pop"), st.none()),
        st.tuples(st.just("clear"), st.none()),
        st.tuples(st.just("replace"), st.none()),
        st.tuples(st.just("suffix"), st.tuples(st.integers(0, 4), st.integers(0, 4))),
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(ops_strategy)
def test_operations_read_as_list_operations_warm_and_cold(ops: list[tuple[str, Any]]) -> None:
    asyncio.run(_replay(ops))
