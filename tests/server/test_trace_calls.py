"""The Trace tab over a framework's call records, for each of the four frameworks: over
HTTP on loopback (turns, requests, tool calls, tokens and costs; a request's page with its
body rebuilt to its digest), and in headless Chromium (the trace and a request page drawn
from them, with no console error)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import contextfold as cf
from contextfold.canonical import sha256_hex
from contextfold.context.call_records import call_body, read_calls
from contextfold.server import create_app
from contextfold.timeline import Price, PriceTable
from tests.call_streams import FRAMEWORKS, MODEL, SUMMARY, USAGES, Session, record_session
from tests.server.helpers import CHROMIUM, Running, running
from tests.server.test_inspector import Browser, _data, _in_ci, _in_thread, _open, _texts

PRICES = PriceTable(prices={MODEL: Price(input=2.0, output=8.0, cached_input=0.5)})


@pytest.fixture
def chromium() -> str:
    """The headless Chromium the inspector's tests use: skipped without it, unless in CI."""
    if not Path(CHROMIUM).exists():
        if _in_ci():
            pytest.fail(f"{CHROMIUM} is missing (CI is set, so this is an error, not a skip)")
        pytest.skip(f"headless Chromium is not installed at {CHROMIUM}; CI is not set")
    return CHROMIUM


def _stream(framework: str) -> str:
    return f"framework/{framework}"


async def _sessions(journal: cf.Journal) -> dict[str, Session]:
    return {
        framework: await record_session(journal, _stream(framework), framework, compact_at=80)
        for framework in FRAMEWORKS
    }


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_trace_and_request_pages_over_http(journal: cf.Journal, framework: str) -> None:
    session = await record_session(journal, _stream(framework), framework, compact_at=80)
    app = create_app(journal)
    app.state.prices = PRICES
    async with running(app) as server:
        base = f"/v1/streams/{_stream(framework)}"
        body = (await server.client.get(f"{base}/trace")).json()
        page = (await server.client.get(f"{base}/trace/{session.requests[1]}")).json()
        stats = (await server.client.get(f"{base}/stats")).json()
    requests = [r for turn in body["turns"] for r in turn["requests"]]
    assert body["total_turns"] == 2
    assert [r["offset"] for r in requests] == session.requests
    assert {(r["framework"], r["model"], r["verify"]) for r in requests} == {
        (framework, MODEL, "ok")
    }
    assert [r["usage"]["input_tokens"] for r in requests] == [u.input_tokens for u in USAGES]
    assert all(r["cost"] == PRICES.cost(MODEL, u) for r, u in zip(requests, USAGES, strict=True))
    calls = [(c["call_id"], c["output"]) for r in requests for c in r["tool_calls"]]
    assert calls == [("c1", "18C, sunny"), ("c2", "22C, clear")]
    compaction = body["turns"][1]["items"][0]
    assert compaction["kind"] == "compaction" and compaction["text"] == SUMMARY
    assert body["stats"] == stats and stats["frameworks"] == [framework]
    assert stats["requests"] == 4 and stats["compactions"] == 1 and stats["cost"] > 0
    assert stats["tokens"]["input"] == sum(u.input_tokens for u in USAGES)

    records = await read_calls(journal, _stream(framework))
    rebuilt = call_body(records, session.requests[1])
    assert page["framework"] == framework and page["header"]["model"] == MODEL
    assert page["body"] == rebuilt.decode() and page["size"] == len(rebuilt)
    assert page["sha256"] == sha256_hex(rebuilt) == records.requests[session.requests[1]].sha256
    assert page["trace"]["verify"] == "ok"
    assert page["diff"]["previous_offset"] == session.requests[0]
    sent = records.requests[session.requests[1]].messages
    assert [m["sha256"] for m in page["messages"]] == list(sent)
    shown = page["messages"][-1]
    assert (shown["role"], shown["text"], shown["tool_call_id"]) == ("tool", "18C, sunny", "c1")


async def test_every_frameworks_trace_in_headless_chromium(
    journal: cf.Journal,
    chromium: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    shots = tmp_path_factory.mktemp("inspector-screenshots")  # kept by pytest: the artifact
    sessions = await _sessions(journal)
    app = create_app(journal)
    app.state.prices = PRICES
    async with running(app) as server:
        browser = await asyncio.to_thread(
            Browser, tmp_path / "profile", tmp_path / "chromium.log", binary=chromium
        )
        try:
            for framework, session in sessions.items():
                await _check_trace(browser, server, framework, session, shots)
            await _check_request(browser, server, journal, sessions["langchain"])
            assert not browser.errors(), browser.errors()
        finally:
            await _in_thread(browser.close)


async def _check_trace(
    browser: Browser, server: Running, framework: str, session: Session, shots: Path
) -> None:
    await _open(browser, f"{server.url}/?stream={_stream(framework)}")
    assert await _data(browser, "li.turn", "index") == ["0", "1"]
    assert await _data(browser, "li.span-request", "offset") == [str(n) for n in session.requests]
    assert set(await _data(browser, "li.span-request", "verify")) == {"ok"}
    assert await _data(browser, "li.span-tool", "callId") == ["c1", "c2"]
    compactions = await _data(browser, "li.span-compaction", "position")
    assert compactions == [str(p) for p in session.compactions]
    [label] = await _texts(browser, "li.span-compaction .span-label")
    assert label.startswith(f"compaction @{session.compactions[0]} replaces ")
    assert label.endswith(" messages")
    assert set(await _texts(browser, "li.span-request .badge.framework")) == {framework}
    tokens = await _texts(browser, "li.span-request .badge.tokens")
    assert tokens[1] == "in 150 · cached 90 · out 20"
    costs = [t for t in await _texts(browser, "li.span-request .badge") if t.startswith("$")]
    assert len(costs) == len(session.requests)
    cards = await _texts(browser, "#stats .card-value")
    assert "4" in cards and any(c.startswith("$") for c in cards)
    assert await _data(browser, ".gauge", "lane") == [
        "system",
        "summary",
        "history",
        "request options",
        "latest request",
    ]
    await _in_thread(browser.screenshot, shots / f"trace-{framework}.png")


async def _check_request(
    browser: Browser, server: Running, journal: cf.Journal, session: Session
) -> None:
    stream = _stream("langchain")
    offset = session.requests[1]
    records = await read_calls(journal, stream)
    sent = records.requests[offset]
    await _open(browser, f"{server.url}/?stream={stream}&view=request&offset={offset}")
    assert await _texts(browser, "#request-facts .sha") == [sent.sha256]
    assert await _texts(browser, "#request-verify") == ["ok"]
    assert await _texts(browser, "#request-raw") == [call_body(records, offset).decode()]
    assert len(await _texts(browser, "#request-chat > li")) == len(sent.messages)
    assert await _texts(browser, "#request-chat > li.cached")  # what the previous one sent
    [result] = await _texts(browser, "#request-chat > li:last-child .item-content")
    assert result == "18C, sunny"
