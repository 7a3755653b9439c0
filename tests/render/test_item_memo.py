"""Each context item's rendered text is computed once (items are immutable) and equals what
rendering it afresh gives; the memo lives exactly as long as its item."""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st

from contextfold.context import _item_memo
from contextfold.context import request as req
from contextfold.context.state import ContextItem

items = st.builds(
    ContextItem,
    offset=st.integers(min_value=1, max_value=10**9),
    role=st.sampled_from(["user", "assistant", "developer"]),
    content=st.text(max_size=300),
    key=st.none() | st.text(min_size=1, max_size=20),
    tool_call_id=st.none() | st.text(min_size=1, max_size=10),
)
limits = st.none() | st.integers(min_value=40, max_value=400)


@given(items, limits)
def test_a_memoized_text_is_the_fresh_rendering(item: ContextItem, limit: int | None) -> None:
    first = req.render_item(item, content_limit=limit)
    assert first == req._render_item(item, limit)
    assert req.render_item(item, content_limit=limit) is first  # computed once
    copy = item.model_copy()  # an equal item renders equally, cached or not
    assert req.render_item(copy, content_limit=limit) == first


def test_the_memo_lives_with_its_item_and_keeps_no_stale_text() -> None:
    # The table memos drop themselves from is bound at definition: count in it, from empty
    # (memos of other tests' items are only a cache).
    _item_memo._MEMOS.clear()
    made = [ContextItem(offset=i, role="user", content=f"text {i}") for i in range(1, 40)]
    for item in made:
        assert req.render_item(item) == f"@{item.offset}\ntext {item.offset}"
    kept = made[-8:]
    del made, item
    gc.collect()
    assert len(_item_memo._MEMOS) == 8  # the collected items took their texts with them
    newest = kept[-1]
    assert req.render_item(newest) is req.render_item(newest)
    for offset in range(100, 140):  # new items at the ids of collected ones: their own text
        assert req.render_item(ContextItem(offset=offset, role="user")) == f"@{offset}\n"
