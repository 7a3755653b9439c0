"""The web inspector: served safely, and in a real headless Chromium it lists streams,
shows the context lanes with external items marked, escapes content and tails live."""

from __future__ import annotations

import asyncio
import json
import os
import re
from importlib import resources
from pathlib import Path

import pytest
from server_cdp import CHROMIUM, Chromium
from server_helpers import Running, raw

import contextfold as cf
from contextfold.server.app import INSPECTOR_CSP

HOSTILE = "<img src=x onerror=alert(1)>"


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
    script = (await server.client.get("/inspector.js")).text
    assert script.startswith("// contextfold inspector")
    # data reaches the DOM through textContent only
    assert ".innerHTML" not in script and ".outerHTML" not in script
    assert "insertAdjacentHTML" not in script
    assert "document.write" not in script


def test_inspector_files_ship_in_the_package() -> None:
    folder = resources.files("contextfold.server") / "inspector"
    assert {p.name for p in folder.iterdir()} >= {"index.html", "inspector.js", "inspector.css"}


@pytest.fixture
def chromium_path() -> str:
    if not os.path.exists(CHROMIUM):
        if _in_ci():
            pytest.fail(f"{CHROMIUM} is missing (CI is set, so this is an error, not a skip)")
        pytest.skip(f"headless Chromium is not installed at {CHROMIUM}; CI is not set")
    return CHROMIUM


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
        Chromium, tmp_path / "profile", tmp_path / "chromium.log", binary=chromium_path
    )
    try:
        url = f"{server.url}/?stream={stream}"
        await asyncio.to_thread(browser.navigate, url)
        state = await asyncio.to_thread(
            browser.wait_for,
            f"location.href === {json.dumps(url)} && document.body !== null"
            " && document.body.dataset.state !== 'loading' && document.body.dataset.state",
        )
        assert state == "ready", await asyncio.to_thread(browser.dump_dom)
        await asyncio.to_thread(
            browser.wait_for, "document.querySelectorAll('#events li').length >= 4"
        )
        dom = await asyncio.to_thread(browser.dump_dom)

        # streams listed, the current one marked
        assert "agents/alpha" in dom and "other-stream" in dom
        # both lanes, with @N headers
        assert '@1 key="agent/system-prompt"' in _unescape_quotes(dom)
        assert '@2 key="repo"' in _unescape_quotes(dom)
        items = await asyncio.to_thread(
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
        assert await asyncio.to_thread(browser.evaluate, "document.images.length") == 0

        # live: an event appended now shows up in the tail and in the lanes
        await asyncio.to_thread(
            browser.wait_for, "document.getElementById('live-status').dataset.status === 'live'"
        )
        late = cf.ContextAdded(role="user", content="late <b>news</b>", actor=cf.Actor(type="user"))
        await journal.append(stream, late)
        await asyncio.to_thread(
            browser.wait_for, "document.querySelector('li.item[data-offset=\"5\"]') !== null"
        )
        newest = await asyncio.to_thread(
            browser.evaluate, "document.querySelector('#events li').dataset.position"
        )
        assert newest == "5"
        dom = await asyncio.to_thread(browser.dump_dom)
        assert "late &lt;b&gt;news&lt;/b&gt;" in dom and "<b>news" not in dom
        assert not [c for c in browser.console if c.get("type") == "error"]
    finally:
        await asyncio.to_thread(browser.close)


def _unescape_quotes(html: str) -> str:
    return html.replace("&quot;", '"')
