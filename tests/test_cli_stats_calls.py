"""``contextfold stats`` on a framework's call records: requests, tokens per lane of its
newest request, the cache share, compactions and cost from a price table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner, Result

import contextfold as cf
from contextfold.cli import URL_ENV, app
from contextfold.prices import CataloguePrices
from tests.call_streams import MODEL, USAGES, record_session

STREAM = "framework"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={URL_ENV: "", "CONTEXTFOLD_PRICES": ""})


def test_stats_of_a_framework_stream(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"

    async def record() -> None:
        async with cf.open_journal(url) as journal:
            await record_session(journal, STREAM, "openai-agents", compact_at=80)

    asyncio.run(record())
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({MODEL: {"input": 2.0, "output": 8.0, "cached_input": 0.5}}))
    shown = _invoke("stats", STREAM, "--url", url, "--prices", str(prices))
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"stream {STREAM}: 19 events, recorded by openai-agents, model")
    assert lines[1] == (
        "requests 4 (4 answered, 4 sent), turns 2, tool calls 2 (0 failed), compactions 1"
    )
    assert lines[2].startswith(f"tokens input {sum(u.input_tokens for u in USAGES)} (cached ")
    assert lines[3].startswith("cache: ") and "% of request bytes repeat" in lines[3]
    assert lines[4].startswith("cost $") and lines[5] == "verify: 4 ok"
    assert [line.split("\t")[0] for line in lines[6:]] == [
        "lane",
        "system",
        "summary",
        "history",
        "request options",
    ]
    report = json.loads(_invoke("stats", STREAM, "--url", url, "--json").stdout)
    assert report["frameworks"] == ["openai-agents"] and report["model"] == MODEL
    # Without --prices, genai-prices' catalogue prices the model (an own table overrides it).
    assert report["compactions"] == 1 and report["cost"] is not None and report["cost"] > 0
    catalogue = sum(CataloguePrices().cost(MODEL, u) or 0.0 for u in USAGES)
    assert report["cost"] >= catalogue
