"""``python -m contextfold demo`` runs offline with the local deterministic model."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from contextfold import demo as demo_module
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import verify_requests
from contextfold.context.state import SYSTEM_PROMPT_KEY
from contextfold.journal import open_journal
from contextfold.render.envelope import TurnContext, compile_turn
from contextfold.runtime import dispatch as dispatch_module
from contextfold.timeline.build import build_timeline
from contextfold.timeline.stats import stats_of


def run_demo(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env["COLUMNS"] = "200"  # rich wraps at the terminal width; keep lines whole
    return subprocess.run(
        [sys.executable, "-m", "contextfold", "demo", "--db", str(db), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=db.parent,
        timeout=180,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    done = run_demo(db)
    assert done.returncode == 0, done.stdout + done.stderr
    return db, " ".join(done.stdout.split())


def test_demo_runs_offline_and_says_what_it_shows(demo: tuple[Path, str]) -> None:
    db, out = demo
    assert "local deterministic model" in out
    assert "before the system prompt: status queued" in out
    assert re.search(r"compaction summary replaces history through @\d+", out)
    assert "rebuild byte for byte" in out
    assert "did NOT rebuild" not in out
    assert str(db.resolve()) in out
    assert db.is_file()


def test_demo_answers_every_question_even_across_compaction(demo: tuple[Path, str]) -> None:
    _, out = demo
    for question in (
        "Where are the rates defined?",
        "How is an invoice total computed?",
        "What happens with an unknown plan?",
        "How do deploys work?",
    ):
        assert f'answer Answer to "{question}"' in out, question
    assert "I am ready" not in out


async def test_demo_journal_verifies(demo: tuple[Path, str]) -> None:
    db, _ = demo
    async with open_journal(f"sqlite:///{db}") as journal:
        streams = [info.stream for info in await journal.list_streams()]
        assert "demo/coding-session" in streams
        assert await verify_requests(journal, "demo/coding-session") == ()


def test_demo_again_on_the_same_file(demo: tuple[Path, str]) -> None:
    db, _ = demo
    again = run_demo(db, "--no-fresh")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "rebuild byte for byte" in " ".join(again.stdout.split())


async def test_demo_turn_envelope_carries_the_real_system_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    compiled: list[TurnContext] = []
    original = compile_turn  # what the dispatcher calls: it imports it from render.envelope

    def spy(batch: Any, context: TurnContext, *args: Any, **kwargs: Any) -> Any:
        compiled.append(context)
        return original(batch, context, *args, **kwargs)

    monkeypatch.setattr(dispatch_module, "compile_turn", spy)
    db = tmp_path / "demo.db"
    assert await demo_module.run_demo(db, console=Console(file=io.StringIO(), width=200))
    async with open_journal(f"sqlite:///{db}") as journal:
        state = await journal.fold(AgentContext, "demo/coding-session")
    [prompt] = [item.content for item in state.system if item.key == SYSTEM_PROMPT_KEY]
    [context] = compiled
    persona = [x.content for x in context.standing if x.layer == "persona_and_team_guidance"]
    assert persona == [prompt]


def test_demo_shows_the_manifest_of_each_event_driven_request(demo: tuple[Path, str]) -> None:
    _, out = demo
    manifests = re.findall(r"request @(\d+) manifest (sha256:[0-9a-f]{64})", out)
    assert len(manifests) >= 2  # the turn's requests, before and after the steer
    assert len({digest for _, digest in manifests}) >= 2
    assert "→ injected" in out


async def test_demo_trace_shows_every_turn_the_chat_turn_and_its_steer_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    db, printed = tmp_path / "demo.db", io.StringIO()
    assert await demo_module.run_demo(db, console=Console(file=printed, width=200))
    async with open_journal(f"sqlite:///{db}") as journal:
        timeline = await build_timeline(journal, "demo/coding-session")
    turns = len(demo_module.QUESTIONS) + 1  # the questions, then the chat turn
    assert len(timeline.turns) == stats_of(timeline).turns == turns
    chat = timeline.turns[-1]
    kinds = [(i.kind, i.actor) for i in chat.items if i.kind in ("trigger", "steer")]
    assert kinds == [("trigger", "user:npub-morgan"), ("steer", "user:npub-morgan")]
    manifests = re.findall(r"request @(\d+) manifest sha256:", printed.getvalue())
    assert [r.offset for r in chat.requests] == [int(n) for n in manifests]
    webhooks = [i for t in timeline.turns for i in t.items if i.actor == "webhook:ci"]
    assert webhooks and {i.role for i in webhooks} == {"user"}
