"""The demo session behind ``contextfold demo``: a real agent on an embedded SQLite journal.

A coding assistant answers questions about a small sample workspace with two tools, while
a simulated CI webhook (an external actor) posts keyed status updates. The session has a
session prefix, crosses the compaction threshold once, and ends by rebuilding every
recorded request from the journal and checking the bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, assert_never

from rich.console import Console
from rich.table import Table

from .context.events import Actor, ContextAdded, LlmRequestPolicy
from .context.projection import AgentContext
from .context.rebuild import rebuild_manifest, verify_requests
from .errors import InvalidInputError
from .journal import open_journal
from .render.envelope import ChannelInfo, Layer, TurnContext, TurnEvent
from .render.prefix import SessionPrefix
from .runtime.clients import AnthropicModel, ModelClient, OpenAIChatModel
from .runtime.dispatch import TurnDispatcher
from .runtime.events import (
    CompactionFinished,
    CompactionStarted,
    DeltaReceived,
    LoopCancelled,
    LoopEvent,
    LoopHalted,
    Observers,
    RequestFailed,
    RequestInterrupted,
    RequestRetried,
    RequestSent,
    ResponseRecorded,
    ToolFinished,
    ToolStarted,
)
from .runtime.local import LocalModel
from .runtime.loop import Agent, system_prompt
from .runtime.transcript import TranscriptObserver
from .transcript import (
    TranscriptBus,
    TranscriptWriter,
    filter_compacted,
    open_transcript_store,
    read_history,
)
from .views.tokens import approx_tokens
from .wire import NeutralMessage

__all__ = ["SAMPLE_WORKSPACE", "pick_model", "run_demo"]

SAMPLE_WORKSPACE: dict[str, str] = {
    "README.md": "# billing-service\nA small service that turns usage records into invoices.\n"
    "Entry point: src/app.py. Rates live in src/rates.py.\n",
    "src/app.py": "from rates import price_for\n\n\ndef invoice(records):\n"
    '    """Sum the price of every usage record into one invoice total."""\n'
    "    total = 0\n    for record in records:\n"
    "        total += price_for(record['plan'], record['units'])\n"
    "    return round(total, 2)\n",
    "src/rates.py": "RATES = {'free': 0.0, 'pro': 0.12, 'team': 0.09}\n\n\n"
    "def price_for(plan, units):\n"
    '    """Price of `units` on `plan`; unknown plans raise KeyError."""\n'
    "    return RATES[plan] * units\n",
    "tests/test_app.py": "from app import invoice\n\n\ndef test_invoice():\n"
    "    assert invoice([{'plan': 'pro', 'units': 10}]) == 1.2\n",
    "docs/deploy.md": "".join(
        f"Step {n}: deploys run from CI on every merge to main; a failing test blocks the deploy "
        f"and the on-call engineer is paged (runbook section {n}).\n"
        for n in range(1, 40)
    ),
}

SYSTEM_PROMPT = "You are a careful coding assistant. Use the tools; cite files."

CHAT_CONTEXT = TurnContext(
    standing=(Layer.canonical("persona_and_team_guidance", SYSTEM_PROMPT),),
    channel=ChannelInfo("billing-eng", "Deploys and incidents of billing-service"),
    delivery=(("channel_id", "billing-eng"), ("scope", "thread"), ("reply_to", "chat-1")),
)
CHAT = tuple(
    TurnEvent(
        kind="mention",
        author="Morgan",
        actor="npub-morgan",
        event_id=f"chat-{n}",
        thread_root=None if n == 1 else "chat-1",
        content=text,
    )
    for n, text in enumerate(
        (
            "The deploy of main is blocked.",
            "What blocks a deploy?",
            "Which step pages the on-call engineer?",
        ),
        start=1,
    )
)

QUESTIONS = (
    "Where are the rates defined?",
    "How is an invoice total computed?",
    "What happens with an unknown plan?",
    "How do deploys work?",
)


def make_workspace(root: Path) -> Path:
    for name, text in SAMPLE_WORKSPACE.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def workspace_tools(root: Path) -> list[Any]:
    def search_files(query: str) -> str:
        """Search the workspace for a word; returns path:line: text for each match."""
        hits = []
        for path in sorted(root.rglob("*")):
            if path.is_file():
                for number, line in enumerate(path.read_text().splitlines(), start=1):
                    if query.lower() in line.lower():
                        hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
        return "\n".join(hits[:20]) or f"no match for {query!r}"

    def read_file(path: str) -> str:
        """Read a file of the workspace (relative path)."""
        target = (root / path).resolve()
        if root.resolve() not in target.parents:
            raise InvalidInputError(f"{path!r} is outside the workspace")
        return target.read_text()

    return [search_files, read_file]


def pick_model(context_window: int | None = None) -> tuple[ModelClient, str]:
    """The provider from the environment, or the local deterministic model. A
    ``context_window`` (tokens) is the model's input limit, for a model contextfold's table
    does not know and whose server does not report one."""
    # A base URL alone is an OpenAI-compatible local server (vLLM, Ollama): no key needed.
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        name = os.environ.get("CONTEXTFOLD_OPENAI_MODEL", "gpt-5.4-mini")
        base_url = os.environ.get("OPENAI_BASE_URL")
        model = OpenAIChatModel(name, base_url=base_url, context_window=context_window)
        return (
            model,
            f"OpenAI-compatible ({name} at {base_url})" if base_url else f"OpenAI ({name})",
        )
    if os.environ.get("ANTHROPIC_API_KEY"):
        name = os.environ.get("CONTEXTFOLD_ANTHROPIC_MODEL", "claude-haiku-4-5")
        return AnthropicModel(name, context_window=context_window), f"Anthropic ({name})"
    return (
        LocalModel(),
        "the local deterministic model (no OPENAI_API_KEY, OPENAI_BASE_URL or "
        "ANTHROPIC_API_KEY is set)",
    )


class _Printer:
    """Prints the loop's steps and plays the CI webhook while tools run."""

    def __init__(self, console: Console, journal: Any, stream: str) -> None:
        self.console, self.journal, self.stream = console, journal, stream
        self.build = 0
        self.previous = b""
        self.steer: tuple[TurnDispatcher, TurnEvent] | None = None
        """A chat message to deliver while a tool runs: steered into the running turn."""

    async def on_event(self, event: LoopEvent) -> None:
        out = self.console
        match event:
            case RequestSent(offset=offset, rendered=rendered):
                body = rendered.body
                reuse = ""
                if self.previous:
                    shared = len(os.path.commonprefix([self.previous, body]))  # noqa: RUF071 - bytes, not paths
                    reuse = f", starts with {shared / len(self.previous):.0%} of the previous body"
                self.previous = body
                out.print(
                    f"  [cyan]→ request @{offset}[/] {rendered.transport}, "
                    f"{len(body)} bytes, sha256 {rendered.sha256[:12]}…{reuse}"
                )
            case ResponseRecorded(output=output):
                calls = ", ".join(f"{c.name}({c.arguments})" for c in output.tool_calls)
                text = " / ".join(line.strip() for line in output.text.splitlines()[:2])
                out.print(
                    f"  [green]← answer[/] {text[:110]}"
                    + (f"  [yellow]calls[/] {calls}" if calls else "")
                )
            case ToolStarted():
                # The CI webhook posts while the model works: a keyed status slot, external actor.
                self.build += 1
                await self.journal.append(
                    self.stream,
                    ContextAdded(
                        role="developer",
                        actor=Actor(type="webhook", id="ci"),
                        key="ci/status",
                        content=f"CI build #{self.build}: "
                        + ("passed" if self.build % 3 else "failed: tests/test_app.py"),
                        llm_request_policy=LlmRequestPolicy(behaviour="none"),
                    ),
                    actor="webhook",
                )
                out.print(f"  [magenta]webhook[/] ci/status ← build #{self.build}")
                if self.steer is not None:
                    (dispatcher, message), self.steer = self.steer, None
                    receipt = await dispatcher.receive(message)
                    out.print(
                        f"  [magenta]chat[/] {message.author}: {message.content} "
                        f"→ {receipt.status} (in the journal @{receipt.position})"
                    )
            case ToolFinished(outcome=outcome):
                out.print(
                    f"  [yellow]tool[/] {outcome.name}: {len(outcome.output)} chars"
                    + (" (error)" if outcome.is_error else "")
                )
            case CompactionFinished(offset=offset):
                out.print(f"  [bold red]compaction[/] summary replaces history through @{offset}")
            case RequestInterrupted(offset=offset, by=by):
                out.print(f"  [red]interrupted[/] request @{offset} by @{by}")
            case (
                RequestRetried()
                | DeltaReceived()
                | RequestFailed()
                | CompactionStarted()
                | LoopHalted()
                | LoopCancelled()
            ):
                pass
            case _:
                assert_never(event)


async def run_demo(
    db: Path,
    *,
    fresh: bool = True,
    console: Console | None = None,
    context_window: int | None = None,
) -> bool:
    """Run the demo session in ``db``; returns True when every request rebuilt byte for byte.
    ``context_window``: the model's input limit in tokens (see :func:`pick_model`)."""
    out = console or Console()
    db.parent.mkdir(parents=True, exist_ok=True)
    root = make_workspace(db.parent / "workspace")
    model, described = pick_model(context_window)
    stream = "demo/coding-session"
    async with open_journal(f"sqlite:///{db}") as journal:
        if fresh:
            await journal.delete_stream(stream)
        out.print(f"[bold]contextfold demo[/]  journal: [cyan]{db.resolve()}[/]  stream: {stream}")
        out.print(f"model: {described}")
        prefix = SessionPrefix()

        @prefix.contributor
        async def workspace_digest(next_: Any) -> tuple[NeutralMessage, ...]:
            files = ", ".join(sorted(SAMPLE_WORKSPACE))
            return (
                NeutralMessage(role="user", content=f"<workspace-files>{files}</workspace-files>"),
                *await next_(),
            )

        printer = _Printer(out, journal, stream)
        transcript = open_transcript_store(f"sqlite:///{db}")
        await transcript.open()
        try:
            session = f"{stream}/{journal.ids()[:8]}"  # one transcript session per demo run
            rows = TranscriptObserver(
                TranscriptWriter(transcript, TranscriptBus()),
                session,
                clock=lambda: journal.clock().isoformat(),
                journal=journal,
                stream=stream,
            )
            agent = Agent(
                journal,
                stream,
                model,
                tools=workspace_tools(root),
                prefix=prefix,
                max_tokens=512,
                observer=Observers(printer, rows),
                compaction_threshold=0.4,
            )

            # Distributed birth: the first question arrives before the system prompt.
            await journal.append(
                stream,
                ContextAdded(role="user", actor=Actor(type="user"), content=QUESTIONS[0]),
                actor="user",
            )
            report = await agent.run_until_idle()
            out.print(
                f"before the system prompt: status [bold]{report.status}[/] ({report.reason})"
            )
            await journal.append(stream, system_prompt(SYSTEM_PROMPT), actor="agent")
            for index, question in enumerate(QUESTIONS):
                if index:
                    await journal.append(
                        stream,
                        ContextAdded(role="user", actor=Actor(type="user"), content=question),
                        actor="user",
                    )
                out.print(f"[bold]user[/] {question}")
                report = await agent.run_until_idle()

            # Event-driven turns: chat events coalesce by actor and thread into one turn,
            # compiled into one envelope; a message arriving mid-turn is steered into it.
            dispatcher = TurnDispatcher(journal, stream, context=CHAT_CONTEXT)
            for message in CHAT[:2]:
                await dispatcher.receive(message)
            printer.steer = (dispatcher, CHAT[2])
            out.print("[bold]chat[/] Morgan, two messages in one thread: one turn")
            await dispatcher.run(agent)

            state = await journal.fold(AgentContext, stream)
            drifts = await verify_requests(journal, stream)
            requests = len(state.request_offsets)
            table = Table(title="tokens per lane (approximate: JSON length / 4)")
            table.add_column("lane")
            table.add_column("items", justify="right")
            table.add_column("tokens", justify="right")
            prefix_messages = state.header.session_prefix if state.header else ()
            for lane, items in (
                ("system", state.system),
                ("session prefix", prefix_messages),
                ("history", state.history),
            ):
                table.add_row(
                    lane, str(len(items)), str(sum(approx_tokens(i.content) for i in items))
                )
            out.print(table)
            for offset in state.request_offsets:
                manifest = await rebuild_manifest(journal, stream, offset)
                if manifest is not None:  # a request of an event-driven turn
                    layers = " ".join(f"{x.order}:{x.layer}" for x in manifest.layers)
                    out.print(f"request @{offset} manifest [bold]{manifest.hash}[/]\n  {layers}")
            out.print(
                "compactions: "
                + (
                    f"history compacted through @{state.compacted_through}"
                    if state.compacted_through
                    else "none"
                )
            )
            if drifts:
                out.print(
                    f"[bold red]{len(drifts)} of {requests} requests did NOT rebuild "
                    f"byte for byte:[/] {drifts}"
                )
            else:
                out.print(
                    f"[bold green]all {requests} recorded requests rebuild byte for byte "
                    "from the journal[/]"
                )
            history = await read_history(transcript, session)
            view = filter_compacted(history)
            out.print(
                f"transcript: {len(history)} messages stored for the UI, "
                f"{len(view)} after filter_compacted"
            )
            out.print(f"journal file: [cyan]{db.resolve()}[/]")
            return not drifts
        finally:
            await transcript.close()  # on a provider error too
