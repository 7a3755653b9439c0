"""Screenshots of the web inspector for the documentation, taken from the demo journal in
headless Chromium, so the pictures in the docs always show the current UI.

Run from the project root (``make docs`` does): ``python -m docs._hooks.screenshots OUT``.
It runs the demo into a temporary SQLite journal, serves it with ``create_app``, and writes
``trace.png``, ``request-diff.png`` and ``verify.png`` into ``OUT``. The browser is driven
over the DevTools protocol by the same helper the inspector's tests use.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

import contextfold as cf
from contextfold.demo import run_demo
from contextfold.server import create_app
from contextfold.timeline.build import build_timeline
from contextfold.transcript.store.factory import open_transcript_store
from tests.server.helpers import CHROMIUM, Chromium, running

__all__ = ["SHOTS", "take_screenshots"]

DEMO = "demo/coding-session"
WIDTH = 1200
SHOTS = ("trace.png", "request-diff.png", "verify.png")
"""The files :func:`take_screenshots` writes, which the docs' pages show."""


class _Page:
    """One headless Chromium page at a fixed width, its calls run off the event loop."""

    def __init__(self, browser: Chromium) -> None:
        self.browser = browser

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        session = self.browser.session
        return await asyncio.to_thread(self.browser.call, method, params, session=session)

    async def evaluate(self, expression: str) -> Any:
        return await asyncio.to_thread(self.browser.evaluate, expression)

    async def open(self, url: str) -> None:
        """Navigate and wait until the inspector has loaded its data (else say why)."""
        await asyncio.to_thread(self.browser.navigate, url)
        state = await asyncio.to_thread(
            self.browser.wait_for,
            f"location.href === {json.dumps(url)} && document.body !== null"
            " && document.body.dataset.state !== 'loading' && document.body.dataset.state",
        )
        if state != "ready":
            raise RuntimeError(f"the inspector did not load {url}: state {state!r}")

    async def shoot(
        self, path: Path, *, top: str, bottom: str | None = None, left: str | None = None
    ) -> None:
        """A PNG of the page from the top of the element ``top`` to the bottom of ``bottom``
        (``top`` itself when None), from the left edge of ``left`` (the page's when None)."""

        def edge(selector: str, side: str) -> str:
            return f"document.querySelector({json.dumps(selector)}).getBoundingClientRect().{side}"

        x = 0 if left is None else await self.evaluate(edge(left, "left"))
        start = await self.evaluate(f"{edge(top, 'top')} + window.scrollY") - 12
        end = await self.evaluate(f"{edge(bottom or top, 'bottom')} + window.scrollY") + 12
        clip = {
            "x": x,
            "y": max(start, 0),
            "width": WIDTH - x,
            "height": end - max(start, 0),
            "scale": 1,
        }
        shot = await self.call(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        path.write_bytes(base64.b64decode(shot["data"]))


async def take_screenshots(out: Path, *, binary: str = CHROMIUM) -> list[Path]:
    """Run the demo, serve it, and write :data:`SHOTS` into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="contextfold-docs-") as scratch:
        db = Path(scratch) / "demo" / "journal.db"
        if not await run_demo(db, console=Console(file=io.StringIO())):
            raise RuntimeError("the demo's requests did not rebuild byte for byte")
        url = f"sqlite:///{db}"
        async with cf.open_journal(url) as journal, open_transcript_store(url) as transcript:
            timeline = await build_timeline(journal, DEMO)
            async with running(create_app(journal, transcript=transcript)) as server:
                browser = await asyncio.to_thread(
                    Chromium,
                    Path(scratch) / "profile",
                    Path(scratch) / "chromium.log",
                    binary=binary,
                )
                try:
                    page = _Page(browser)
                    await page.call(
                        "Emulation.setDeviceMetricsOverride",
                        {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                    )
                    base = f"{server.url}/?stream={DEMO}"
                    await page.open(base)
                    await page.shoot(out / "trace.png", top="header.top", bottom="#turns > li")
                    await page.shoot(out / "verify.png", top="#stats", left="main")
                    second = timeline.requests[1].offset
                    await page.open(f"{base}&view=request&offset={second}")
                    await page.shoot(
                        out / "request-diff.png",
                        top="#request-facts",
                        bottom="#request-diff",
                        left="main",
                    )
                finally:
                    await asyncio.to_thread(browser.close)
    return [out / name for name in SHOTS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder the PNG files go to")
    parser.add_argument("--chromium", default=CHROMIUM, help="the Chromium binary")
    args = parser.parse_args()
    if not Path(args.chromium).exists():
        parser.exit(1, f"screenshots: no Chromium at {args.chromium} (Debian: chromium)\n")
    # The demo starts before its system prompt on purpose (distributed birth): not news here.
    logging.getLogger("contextfold").setLevel(logging.ERROR)
    for path in asyncio.run(take_screenshots(args.out, binary=args.chromium)):
        print(path)


if __name__ == "__main__":
    main()
