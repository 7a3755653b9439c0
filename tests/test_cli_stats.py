"""``contextfold stats STREAM``: requests, tokens per lane, the prompt cache's share (bytes
repeated from the previous request, and cached tokens reported), compactions and cost,
as text and as JSON; each mistake is one error line, exit status 1, nothing created."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import contextfold as cf
from contextfold.cli import URL_ENV, app
from contextfold.telemetry import shared_prefix
from contextfold.timeline import PriceTable
from contextfold.timeline.build import Timeline, build_timeline
from contextfold.timeline.stats import stats_of, stats_text
from contextfold.wire import ModelOutput, NeutralRequest, Usage

runner = CliRunner()
STREAM = "chat"


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(
        app, list(args), env={URL_ENV: "", "CONTEXTFOLD_PRICES": "", **(env or {})}
    )


def _model(request: NeutralRequest) -> ModelOutput:
    # the questions asked so far ("@N\nq0", ...): the tail message is a user one too
    turn = sum(1 for m in request.messages if m.role == "user" and "\nq" in m.content)
    usage = Usage(input_tokens=1000 * turn, output_tokens=50, cached_input_tokens=600 * (turn - 1))
    return ModelOutput(text=f"answer {turn}", usage=usage)


@pytest.fixture
def journal_url(tmp_path: Path) -> tuple[str, list[bytes]]:
    """A SQLite journal with three answered questions; its URL and the request bodies."""
    url = f"sqlite:///{tmp_path / 'journal.db'}"

    async def run() -> list[bytes]:
        async with cf.open_journal(url) as journal:
            agent = cf.Agent(journal, STREAM, cf.FunctionModel(_model, model="gpt-4.1"))
            await journal.append(STREAM, cf.system_prompt("Be brief."))
            offsets: list[int] = []
            for n in range(3):
                await journal.append(STREAM, cf.ContextAdded(role="user", content=f"q{n}"))
                offsets += (await agent.run_until_idle()).requests
            return [(await cf.rebuild_request(journal, STREAM, n)).body for n in offsets]

    return url, asyncio.run(run())


def _one_error(result: Result) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_stats_as_json(journal_url: tuple[str, list[bytes]], tmp_path: Path) -> None:
    url, bodies = journal_url
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"gpt-4.1": {"input": 2, "cached_input": 0.5, "output": 8}}))
    result = invoke("stats", STREAM, "--url", url, "--json", "--prices", str(prices))
    assert result.exit_code == 0, result.stderr
    stats = json.loads(result.stdout)
    assert (stats["requests"], stats["answered"], stats["turns"]) == (3, 3, 3)
    assert stats["tokens"]["input"] == 1000 + 2000 + 3000
    assert stats["tokens"]["cached_input"] == 0 + 600 + 1200
    assert stats["cache"]["cached_share"] == pytest.approx(1800 / 6000)
    shared = sum(shared_prefix(a, b) for a, b in itertools.pairwise(bodies))
    assert stats["cache"]["prefix_share"] == pytest.approx(shared / sum(map(len, bodies[1:])))
    fresh = 6000 - 1800
    assert stats["cost"] == pytest.approx((fresh * 2 + 1800 * 0.5 + 150 * 8) / 1e6)
    assert stats["compactions"] == 0 and stats["verify"]["ok"] == 3
    lanes = {lane["lane"]: lane for lane in stats["lanes"]}
    assert lanes["system"]["items"] == 1 and lanes["history"]["items"] == 6


def test_stats_as_text_one_line_per_subject(journal_url: tuple[str, list[bytes]]) -> None:
    url, _ = journal_url
    result = invoke("stats", STREAM, "--url", url)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"stream {STREAM}: ")
    assert "requests 3 (3 answered, 3 sent)" in lines[1]
    assert "cached 1800" in lines[2]
    assert "of input tokens cached" in lines[3] and "30.0%" in lines[3]
    # genai-prices' catalogue knows gpt-4.1: the cost is priced without a table.
    assert lines[4].startswith("cost $") and "unknown" not in lines[4]
    assert lines[5] == "verify: 3 ok"
    assert lines[6].split("\t") == ["lane", "items", "tokens", "of window"]
    assert [line.split("\t")[0] for line in lines[7:]] == ["system", "session prefix", "history"]


def test_the_price_table_may_come_from_the_environment(
    journal_url: tuple[str, list[bytes]], tmp_path: Path
) -> None:
    url, _ = journal_url
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"gpt-4": {"input": 10, "output": 10}}))
    result = invoke("stats", STREAM, "--url", url, env={"CONTEXTFOLD_PRICES": str(prices)})
    assert result.exit_code == 0, result.stderr
    assert "cost $0.0615\n" in result.stdout  # 6000 in + 150 out at $10 per million


def test_stats_mistakes_are_one_line_and_create_nothing(
    journal_url: tuple[str, list[bytes]], tmp_path: Path
) -> None:
    url, _ = journal_url
    assert "did you mean 'chat'" in _one_error(invoke("stats", "chta", "--url", url))
    missing = tmp_path / "nope" / "journal.db"
    assert "does not exist" in _one_error(invoke("stats", STREAM, "--url", f"sqlite:///{missing}"))
    assert not missing.parent.exists()
    bad = tmp_path / "prices.json"
    bad.write_text(json.dumps({"gpt-4.1": {"input": "cheap", "output": 1}}))
    line = _one_error(invoke("stats", STREAM, "--url", url, "--prices", str(bad)))
    assert "gpt-4.1.input" in line


@pytest.fixture
def sparse_url(tmp_path: Path) -> str:
    """A journal whose one answered request reported no cache count (and has no previous
    request to compare bytes with), and a question the agent has not been asked yet."""
    url = f"sqlite:///{tmp_path / 'sparse.db'}"

    async def run() -> None:
        async with cf.open_journal(url) as journal:
            usage = Usage(input_tokens=40, output_tokens=3)
            model = cf.FunctionModel(lambda _: ModelOutput(text="hi", usage=usage), model="m-1")
            await journal.append(STREAM, cf.system_prompt("Be brief."))
            await journal.append(STREAM, cf.ContextAdded(role="user", content="q"))
            await cf.Agent(journal, STREAM, model).run_until_idle()
            await journal.append("quiet", cf.ContextAdded(role="user", content="anyone?"))

    asyncio.run(run())
    return url


def _broken(lines: list[str]) -> list[str]:
    return [line for line in lines if "not reported" in line or "None" in line or "?" in line]


def test_stats_text_reads_as_sentences_when_values_are_missing(
    sparse_url: str, tmp_path: Path
) -> None:
    result = invoke("stats", STREAM, "--url", sparse_url)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert _broken(lines) == []
    assert lines[3] == (
        "cache: no request has a previous one to compare its bytes with; "
        "the provider did not report how many input tokens were cached"
    )

    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"other-model": {"input": 1, "output": 1}}))
    priced = invoke("stats", STREAM, "--url", sparse_url, "--prices", str(prices))
    assert priced.exit_code == 0, priced.stderr
    assert priced.stdout.splitlines()[4] == "cost: unknown (no price known for m-1)"

    quiet = invoke("stats", "quiet", "--url", sparse_url, "--prices", str(prices))
    assert quiet.exit_code == 0, quiet.stderr
    lines = quiet.stdout.splitlines()
    assert _broken(lines) == []
    assert lines[0] == "stream quiet: 1 event, no model recorded"
    assert lines[4] == "cost: no answered request to price"
    assert lines[5] == "verify: no requests"


def test_stats_text_names_an_unknown_window_and_a_model_without_a_name(sparse_url: str) -> None:
    async def build() -> Timeline:
        async with cf.open_journal(sparse_url) as journal:
            return await build_timeline(journal, STREAM)

    stats = stats_of(asyncio.run(build()), PriceTable())
    assert stats.unpriced_models == ("m-1",)
    odd = replace(stats, context_window=None, unpriced_models=("?", "m-1"))
    lines = list(stats_text(odd))
    assert _broken(lines) == []
    assert lines[0].endswith("model m-1, window unknown")
    assert lines[4] == ("cost: unknown (no price known for m-1, a request without a model name)")
