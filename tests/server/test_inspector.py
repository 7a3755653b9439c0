"""The web inspector: served safely, and in a real headless Chromium each of its views (the
trace, a request, the context as of an offset, event search, the transcript) shows the
demo journal's real data, a live append appears without a reload, content is escaped, no
console error happens, and a screenshot of each view is left as an artifact."""

from __future__ import annotations

import asyncio
import base64
import inspect
import io
import json
import os
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

import contextfold as cf
from contextfold.context.rebuild import rebuild_state
from contextfold.demo import run_demo
from contextfold.runtime.transcript import TranscriptObserver
from contextfold.server import create_app
from contextfold.server.app import INSPECTOR_CSP
from contextfold.timeline.build import build_timeline
from contextfold.transcript import TranscriptBus, TranscriptWriter
from contextfold.transcript.store.factory import open_transcript_store
from contextfold.wire import ModelOutput, NeutralRequest, RenderedRequest, Transport, Usage
from tests.server.helpers import CHROMIUM, Chromium, Running, raw, running

HOSTILE = "<img src=x onerror=alert(1)>"
DEMO = "demo/coding-session"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


async def test_the_page_and_its_assets_are_served_with_a_strict_policy(server: Running) -> None:
    page = await server.client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == INSPECTOR_CSP
    assert "'unsafe-inline'" not in INSPECTOR_CSP
    assert page.headers["x-content-type-options"] == "nosniff"
    for src in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert not src.startswith(("http:", "https:", "//")), f"external asset {src}"
        asset = await server.client.get("/" + src)
        assert asset.status_code == 200, src
    assert " style=" not in page.text  # the policy forbids inline style attributes
    script = (await server.client.get("/inspector.js")).text
    assert script.startswith("// contextfold inspector")
    # data reaches the DOM through textContent only
    assert ".innerHTML" not in script and ".outerHTML" not in script
    assert "insertAdjacentHTML" not in script
    assert "document.write" not in script
    assert 'setAttribute("style"' not in script


def test_inspector_files_ship_in_the_package() -> None:
    folder = resources.files("contextfold.server") / "inspector"
    names = {p.name for p in folder.iterdir()}
    assert names >= {"index.html", "inspector.js", "inspector.css", "favicon.svg"}


@pytest.fixture
def chromium_path() -> str:
    if not os.path.exists(CHROMIUM):
        if _in_ci():
            pytest.fail(f"{CHROMIUM} is missing (CI is set, so this is an error, not a skip)")
        pytest.skip(f"headless Chromium is not installed at {CHROMIUM}; CI is not set")
    return CHROMIUM


class Browser(Chromium):
    """Chromium that also records uncaught exceptions and error log entries (a failed
    fetch, a refused policy), and takes screenshots."""

    def __init__(self, profile: Path, log: Path, *, binary: str) -> None:
        self.problems: list[Any] = []
        super().__init__(profile, log, binary=binary)
        self.call("Log.enable", session=self.session)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
            session=self.session,
        )

    def _receive(self, deadline: float) -> dict[str, Any]:
        message = super()._receive(deadline)
        method = message.get("method")
        if method == "Runtime.exceptionThrown":
            self.problems.append(message["params"]["exceptionDetails"])
        elif method == "Log.entryAdded" and message["params"]["entry"]["level"] == "error":
            self.problems.append(message["params"]["entry"])
        return message

    def errors(self) -> list[Any]:
        return [*self.problems, *(c for c in self.console if c.get("type") == "error")]

    def screenshot(self, path: Path) -> None:
        """A PNG of the whole page (up to 6000 pixels tall) at ``path``."""
        height = self.evaluate("document.documentElement.scrollHeight")
        shot = self.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": 1400, "height": min(height, 6000), "scale": 1},
            },
            session=self.session,
        )
        path.write_bytes(base64.b64decode(shot["data"]))


async def _in_thread(call: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(call, *args)


async def _open(browser: Browser, url: str) -> None:
    """Navigate and wait until the page has loaded its data (or failed: then say why)."""
    await _in_thread(browser.navigate, url)
    state = await _in_thread(
        browser.wait_for,
        f"location.href === {json.dumps(url)} && document.body !== null"
        " && document.body.dataset.state !== 'loading' && document.body.dataset.state",
    )
    assert state == "ready", await _in_thread(browser.dump_dom)


async def _texts(browser: Browser, selector: str) -> list[str]:
    found: list[str] = await _in_thread(
        browser.evaluate,
        f"[...document.querySelectorAll({json.dumps(selector)})].map(n => n.textContent)",
    )
    return found


async def _data(browser: Browser, selector: str, name: str) -> list[str]:
    found: list[str] = await _in_thread(
        browser.evaluate,
        f"[...document.querySelectorAll({json.dumps(selector)})].map(n => n.dataset.{name})",
    )
    return found


class GatedModel:
    """A model whose answer streams when the test says so: it sends one delta once
    ``stream`` is set and answers once ``finish`` is."""

    transport: Transport = "openai-chat"
    model = "contextfold-local"

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.stream = asyncio.Event()
        self.finish = asyncio.Event()

    async def complete(
        self,
        request: NeutralRequest,
        rendered: RenderedRequest,
        *,
        on_delta: Callable[[str, str], Awaitable[None] | None] | None = None,
    ) -> ModelOutput:
        self.called.set()
        await self.stream.wait()
        if on_delta is not None:
            sent = on_delta("text", "Streaming part one")
            if inspect.isawaitable(sent):
                await sent
        await self.finish.wait()
        usage = Usage(input_tokens=len(rendered.body) // 4, output_tokens=7)
        return ModelOutput(text="Streaming part one, and done.", usage=usage)


async def test_every_view_shows_the_demo_journal_and_live_appends(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, chromium_path: str
) -> None:
    db = tmp_path / "demo" / "journal.db"
    assert await run_demo(db, console=Console(file=io.StringIO()))
    shots = tmp_path_factory.mktemp("inspector-screenshots")  # kept by pytest: the artifact
    url = f"sqlite:///{db}"
    async with cf.open_journal(url) as journal, open_transcript_store(url) as transcript:
        bus = TranscriptBus()
        timeline = await build_timeline(journal, DEMO)
        async with running(create_app(journal, transcript=transcript, bus=bus)) as server:
            browser = await asyncio.to_thread(
                Browser, tmp_path / "profile", tmp_path / "chromium.log", binary=chromium_path
            )
            try:
                await _check_views(browser, server, journal, transcript, timeline, shots)
                await _check_live(browser, server, journal, transcript, bus, shots)
                assert not browser.errors(), json.dumps(browser.errors())
            finally:
                await asyncio.to_thread(browser.close)
    assert {p.name for p in shots.iterdir()} >= {
        "trace.png",
        "request.png",
        "context.png",
        "events.png",
        "transcript.png",
        "trace-live.png",
        "transcript-live.png",
    }


async def _check_views(
    browser: Browser,
    server: Running,
    journal: cf.Journal,
    transcript: Any,
    timeline: Any,
    shots: Path,
) -> None:
    base = f"{server.url}/?stream={DEMO}"
    # -- the trace: every turn, request and tool call of the demo, each request verified
    await _open(browser, base)
    assert await _data(browser, "li.turn", "index") == [str(t.index) for t in timeline.turns]
    offsets = [str(r.offset) for r in timeline.requests]
    assert await _data(browser, "li.span-request", "offset") == offsets
    assert set(await _data(browser, "li.span-request", "verify")) == {"ok"}
    calls = [c.call_id for r in timeline.requests for c in r.tool_calls]
    assert await _data(browser, "li.span-tool", "callId") == calls
    summaries = [i.position for t in timeline.turns for i in t.items if i.kind == "compaction"]
    assert summaries  # the demo compacts
    assert await _data(browser, "li.span-compaction", "position") == [str(p) for p in summaries]
    prefixes = await _texts(browser, "li.span-request .badge.cache")
    assert len(prefixes) == len(offsets) - 1 and all(p.endswith("%") for p in prefixes)
    assert await _data(browser, ".gauge", "lane") == [
        "system",
        "session prefix",
        "history",
        "latest request",
    ]
    await _in_thread(browser.screenshot, shots / "trace.png")

    # -- one request: the exact body, its hash and verify status, the diff, the chat view
    second = timeline.requests[1]
    rendered = await cf.rebuild_request(journal, DEMO, second.offset)
    await _open(browser, f"{base}&view=request&offset={second.offset}")
    assert await _texts(browser, "#request-facts .sha") == [rendered.sha256]
    assert await _texts(browser, "#request-verify") == ["ok"]
    assert await _texts(browser, "#request-raw") == [rendered.body.decode()]
    [share] = await _texts(browser, "#request-prefix-share")
    assert share.startswith(f"{second.prefix_share * 100:.1f}%")
    body = orjson.loads(rendered.body)
    assert len(await _texts(browser, "#request-chat > li")) == len(body["messages"])
    assert await _texts(browser, "#request-chat > li.cached")  # the shared prefix is marked
    assert await _texts(browser, "#request-diff .diff-added")
    await _in_thread(browser.screenshot, shots / "request.png")
    # a request of an event-driven turn shows the manifest recorded with it
    turn = next(r for r in timeline.requests if r.manifest is not None)
    await _open(browser, f"{base}&view=request&offset={turn.offset}")
    [manifest] = await _texts(browser, "#request-manifest")
    assert json.loads(manifest) == turn.manifest and turn.manifest["hash"]

    # -- the context as of the first request
    first = timeline.requests[0].offset
    state = await rebuild_state(journal, DEMO, first)
    await _open(browser, f"{base}&view=context&at={first}")
    items = await _data(browser, "li.item", "offset")
    assert items == [str(i.offset) for i in (*state.system, *state.history)]
    await _in_thread(browser.screenshot, shots / "context.png")

    # -- event search: every tool result, and nothing else
    await _open(browser, f"{base}&view=events&type=tool-call-result")
    await _in_thread(browser.wait_for, "document.querySelector('#results li') !== null")
    found = await _data(browser, "#results li", "type")
    assert len(found) == len(calls) and {t.rsplit("/", 1)[1] for t in found} == {"tool-call-result"}
    await _in_thread(browser.screenshot, shots / "events.png")

    # -- the transcript the demo wrote, every message of its session
    [info] = [s for s in await transcript.sessions() if s.id.startswith(DEMO)]
    rows = await transcript.page_messages(info.id, limit=500)
    await _open(browser, f"{base}&view=transcript&session={info.id}")
    while not await _in_thread(browser.evaluate, "document.getElementById('messages-more').hidden"):
        await _in_thread(browser.evaluate, "document.getElementById('messages-more').click()")
        await asyncio.sleep(0.1)
    await _in_thread(
        browser.wait_for,
        f"document.querySelectorAll('#messages > li').length === {len(rows.messages)}",
    )
    ids = await _in_thread(
        browser.evaluate, "[...document.querySelectorAll('#messages > li')].map(n => n.id)"
    )
    assert ids == [f"message-{m.id}" for m in rows.messages]
    await _in_thread(browser.screenshot, shots / "transcript.png")


async def _check_live(
    browser: Browser,
    server: Running,
    journal: cf.Journal,
    transcript: Any,
    bus: TranscriptBus,
    shots: Path,
) -> None:
    """A question appended while the trace is open shows up as a new turn; the answer's
    deltas show up in the transcript as they stream."""
    base = f"{server.url}/?stream={DEMO}"
    await _open(browser, base)
    await _in_thread(
        browser.wait_for, "document.getElementById('live-status').dataset.status === 'live'"
    )
    turns = len(await _data(browser, "li.turn", "index"))
    session = f"{DEMO}/live"
    model = GatedModel()
    rows = TranscriptObserver(
        TranscriptWriter(transcript, bus), session, clock=lambda: journal.clock().isoformat()
    )
    agent = cf.Agent(journal, DEMO, model, observer=rows, max_tokens=512)
    question = cf.ContextAdded(role="user", actor=cf.Actor(type="user"), content="Live <b>now</b>?")
    asked = await journal.append(DEMO, question, actor="user")
    run = asyncio.create_task(agent.run_until_idle())
    try:
        await asyncio.wait_for(model.called.wait(), 20)
        await _in_thread(
            browser.wait_for, f"document.querySelectorAll('li.turn').length === {turns + 1}"
        )
        trigger = f"li.turn:last-child li.span-trigger[data-position='{asked.first_position}']"
        [text] = await _texts(browser, f"{trigger} pre")
        assert text == "Live <b>now</b>?"  # shown as text, no element made
        assert await _in_thread(browser.evaluate, "document.querySelectorAll('b').length") == 0
        assert await _texts(browser, "li.turn:last-child li.span-request")
        await _in_thread(browser.screenshot, shots / "trace-live.png")

        await _open(browser, f"{base}&view=transcript&session={session}")
        await _in_thread(browser.wait_for, "document.body.dataset.transcriptLive === 'open'")
        model.stream.set()
        await _in_thread(
            browser.wait_for,
            "[...document.querySelectorAll('.part-text')]"
            ".some(n => n.textContent === 'Streaming part one')",
        )
        assert await _texts(browser, ".badge.pending")  # still streaming
        await _in_thread(browser.screenshot, shots / "transcript-live.png")
        model.finish.set()
        report = await asyncio.wait_for(run, 20)
        assert report.status == "idle"
        await _in_thread(
            browser.wait_for,
            "[...document.querySelectorAll('.part-text')]"
            ".some(n => n.textContent === 'Streaming part one, and done.')"
            " && document.querySelectorAll('#messages .badge.pending').length === 0",
        )
    finally:
        model.stream.set()
        model.finish.set()
        if not run.done():
            run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def test_inspector_in_headless_chromium(
    server: Running, journal: cf.Journal, chromium_path: str, tmp_path: Path
) -> None:
    stream = "agents/alpha"
    await journal.append(
        stream,
        [
            cf.ContextAdded(role="system", content="Be careful.", key=cf.SYSTEM_PROMPT_KEY),
            cf.ContextAdded(role="developer", content="Repo is main.", key="repo"),
            cf.LlmRequestRequested(header=cf.RequestHeader(transport="openai-chat", model="m")),
        ],
    )
    posted = await server.client.post(
        f"/v1/streams/{stream}/events",
        json={
            "events": [
                raw(
                    cf.ContextAdded(
                        role="developer",
                        content=HOSTILE,
                        actor=cf.Actor(type="webhook", id="hook-1"),
                    )
                )
            ]
        },
    )
    assert posted.status_code == 201
    await journal.append("other-stream", cf.RawEvent("note", {"text": "x"}))

    browser = await asyncio.to_thread(
        Browser, tmp_path / "profile", tmp_path / "chromium.log", binary=chromium_path
    )
    try:
        await _open(browser, f"{server.url}/?stream={stream}&view=context")
        await _in_thread(browser.wait_for, "document.querySelectorAll('#events li').length >= 4")
        dom = await _in_thread(browser.dump_dom)

        # streams listed, the current one marked
        assert "agents/alpha" in dom and "other-stream" in dom
        # both lanes, with @N headers
        assert '@1 key="agent/system-prompt"' in _unescape_quotes(dom)
        assert '@2 key="repo"' in _unescape_quotes(dom)
        items = await _in_thread(
            browser.evaluate,
            "JSON.stringify([...document.querySelectorAll('li.item')].map(li => ["
            "li.dataset.offset, li.dataset.external, li.dataset.wireRole, "
            "li.querySelector('.item-content').textContent]))",
        )
        assert json.loads(items) == [
            ["1", "false", "system", "Be careful."],
            ["2", "false", "developer", "Repo is main."],
            ["4", "true", "user", HOSTILE],
        ]
        # the external item is marked, and its markup is text: escaped, no element made
        external = re.search(r'<li class="item[^"]*external[^"]*"[^>]*data-offset="4"', dom)
        assert external is not None, dom
        assert "external actor: webhook hook-1" in dom
        assert "&lt;img src=x onerror=alert(1)&gt;" in dom
        assert "<img" not in dom
        assert await _in_thread(browser.evaluate, "document.images.length") == 0

        # live: an event appended now shows up in the tail and in the lanes
        await _in_thread(
            browser.wait_for, "document.getElementById('live-status').dataset.status === 'live'"
        )
        late = cf.ContextAdded(role="user", content="late <b>news</b>", actor=cf.Actor(type="user"))
        await journal.append(stream, late)
        await _in_thread(
            browser.wait_for, "document.querySelector('li.item[data-offset=\"5\"]') !== null"
        )
        newest = await _in_thread(
            browser.evaluate, "document.querySelector('#events li').dataset.position"
        )
        assert newest == "5"
        dom = await _in_thread(browser.dump_dom)
        assert "late &lt;b&gt;news&lt;/b&gt;" in dom and "<b>news" not in dom

        # the trace of a stream whose only request has no answer yet: a waiting request
        await _open(browser, f"{server.url}/?stream={stream}")
        assert await _data(browser, "li.span-request", "offset") == ["3"]
        assert await _data(browser, "li.span-request", "verify") == ["unsent"]
        # an unknown view says so instead of showing nothing
        await _in_thread(browser.navigate, f"{server.url}/?stream={stream}&view=nope")
        await _in_thread(
            browser.wait_for, "document.body !== null && document.body.dataset.state === 'error'"
        )
        [error] = await _texts(browser, "#error")
        assert "unknown view" in error
        assert not browser.errors(), browser.errors()
    finally:
        await _in_thread(browser.close)


async def test_the_stream_list_pages_and_filters_by_name_prefix(
    server: Running, journal: cf.Journal, chromium_path: str, tmp_path: Path
) -> None:
    """Past a page of streams the sidebar offers more, and a prefix typed above it lists
    the streams whose name starts with it, asked of the server (not only those shown)."""
    names = [f"load/{n:03}" for n in range(130)]
    for name in [*names, "zeta/1"]:
        await journal.append(name, cf.RawEvent("note", {}))
    browser = await asyncio.to_thread(
        Browser, tmp_path / "profile", tmp_path / "chromium.log", binary=chromium_path
    )
    more_hidden = "document.getElementById('streams-more').hidden"
    shown = "document.querySelectorAll('#streams li a').length"
    try:
        await _open(browser, f"{server.url}/?stream=load/000")
        assert await _texts(browser, "#streams li a") == names[:100]
        assert await _in_thread(browser.evaluate, more_hidden) is False
        await _in_thread(browser.evaluate, "document.getElementById('streams-more').click()")
        await _in_thread(browser.wait_for, f"{shown} === 131")
        assert await _texts(browser, "#streams li a") == [*names, "zeta/1"]
        assert await _in_thread(browser.evaluate, more_hidden) is True

        # typing a prefix lists the streams named so, from the server's listing
        typed = "f.value = 'zet'; f.dispatchEvent(new Event('input'))"
        await _in_thread(
            browser.evaluate,
            f"(() => {{ const f = document.getElementById('streams-filter'); {typed} }})()",
        )
        await _in_thread(browser.wait_for, f"{shown} === 1")
        assert await _texts(browser, "#streams li a") == ["zeta/1"]
        [href] = await _in_thread(
            browser.evaluate, "[...document.querySelectorAll('#streams li a')].map(a => a.href)"
        )
        assert "filter=zet" in href  # the stream's page keeps the filter
        submitted = "f.value = 'nope'; f.form.requestSubmit()"
        await _in_thread(
            browser.evaluate,
            f"(() => {{ const f = document.getElementById('streams-filter'); {submitted} }})()",
        )
        await _in_thread(browser.wait_for, f"{shown} === 0")
        assert await _texts(browser, "#streams li") == ['no stream starts with "nope"']
        assert await _in_thread(browser.evaluate, more_hidden) is True

        # a page opened with a filter lists by it from the start
        await _open(browser, f"{server.url}/?stream=zeta/1&filter=load/12")
        assert await _texts(browser, "#streams li a") == names[120:]
        assert not browser.errors(), browser.errors()
    finally:
        await _in_thread(browser.close)


def _unescape_quotes(html: str) -> str:
    return html.replace("&quot;", '"')
