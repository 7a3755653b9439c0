"""Prompt-cache economics on a real model: the same scripted conversation through cf.Agent and
through the peers' own context management, on one llama.cpp server, in one run.

The server (``tests/llamaserver.py``, built by ``make local-model``) runs SmolLM2-135M-Instruct
with one slot and a 4,096-token context; it is restarted for every system, so none reads the
cache another left. llama.cpp keeps in its slot the tokens of the last prompt AND of the answer
it generated: a request that repeats the previous one and its answer evaluates only what is
new. Its ``/metrics`` counters give, per system, the prompt tokens evaluated and those reused
from the cache (their sum: the prompt tokens sent) and the seconds spent on prompts.

Every system gets the same system prompt and the same ``--turns`` user messages, answers of at
most 48 tokens at temperature 0, and its context cut from about turn 15:

- ``contextfold``: cf.Agent (Chat Completions) on an in-memory journal, its window set so that
  compaction (a summary, an event) runs around turn 15;
- ``openai-agents-limit``: the OpenAI Agents SDK's Runner with its ``SQLiteSession`` and a
  session limit of 28 items (the newest 14 turns);
- ``langgraph-trim``: a LangGraph graph whose model node calls LangChain's ``ChatOpenAI`` on
  ``trim_messages`` of the history (the newest 28 messages, starting on a human message);
- ``langchain-summarization``: LangChain v1's ``create_agent`` with its
  ``SummarizationMiddleware`` (at 30 messages, keeping the newest 20).

The OpenAI Agents SDK's ``OpenAIResponsesCompactionSession`` needs OpenAI's
``/responses/compact`` endpoint, which no local server has: it is not run.

Answers that begin with an item header line (``@<digit>``) are counted for every system.

RATIO lines: contextfold's evaluated prompt tokens against the best peer's ``<= 0.3``; its
reused share ``>= 0.9``; header lines in its answers ``<= 0``. Usage::

    python benchmarks/real_cache.py [--turns 30]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.llamaserver import LlamaServer

SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly."
MAX_TOKENS = 48
KEEP_ITEMS = 28
"""The peers keep the newest 14 turns (28 messages): they start cutting at turn 15 (the SDK's
session limit, LangGraph's trim by message count, LangChain's summary at 30 messages keeping
20)."""
WINDOW = 1_600
"""contextfold's window: compaction at half of it, first at about turn 15 of this
conversation, as the peers start cutting (its first request is about 220 tokens, and each
turn adds about 40: the question, its header and the answer)."""
HEADER_LINE = re.compile(r"^\s*@[0-9]")
TOPICS = (
    "the moon",
    "rivers",
    "bread",
    "trains",
    "music",
    "volcanoes",
    "bees",
    "chess",
    "rain",
    "libraries",
)


def questions(turns: int) -> list[str]:
    """The scripted user turns: short questions about everyday topics, all distinct."""
    forms = (
        "Day {n}: tell me one fact about {topic}.",
        "Day {n}: why do people like {topic}?",
        "Day {n}: give a short tip about {topic}.",
    )
    return [
        forms[n % len(forms)].format(n=n + 1, topic=TOPICS[n % len(TOPICS)]) for n in range(turns)
    ]


@dataclass
class Result:
    name: str
    sent: int
    evaluated: int
    reused: int
    prompt_seconds: float
    answers: list[str]
    wall: float

    @property
    def reused_share(self) -> float:
        return self.reused / self.sent if self.sent else 0.0

    @property
    def header_answers(self) -> int:
        return sum(1 for answer in self.answers if HEADER_LINE.match(answer))


async def run_contextfold(server: LlamaServer, turns: list[str]) -> list[str]:
    import contextfold as cf
    from contextfold.context.events import LlmResponse

    model = cf.OpenAIChatModel(server.model, base_url=server.openai_url)
    stream = "bench/real-cache"
    async with cf.open_journal("memory://") as journal:
        agent = cf.Agent(
            journal, stream, model, max_tokens=MAX_TOKENS, temperature=0.0, context_window=WINDOW
        )
        await journal.append(stream, cf.system_prompt(SYSTEM_PROMPT))
        compacted_at = []
        for turn, text in enumerate(turns, 1):
            await journal.append(
                stream, cf.ContextAdded(role="user", actor=cf.Actor(type="user"), content=text)
            )
            report = await agent.run_until_idle()
            if report.status != "idle":
                raise RuntimeError(f"contextfold: {report.status} ({report.reason})")
            if report.compactions:
                compacted_at.append(turn)
        responses = [
            cast(LlmResponse, stored.decode(LlmResponse))
            async for stored in journal.read_all(stream, types=[LlmResponse])
        ]
        answers = [response.text for response in responses]
        print(f"  contextfold: {len(responses)} answers, compacted at turns {compacted_at}")
    await model.client.close()
    return answers


async def run_openai_agents(server: LlamaServer, turns: list[str]) -> list[str]:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        SQLiteSession,
        set_tracing_disabled,
    )
    from agents.memory import SessionSettings
    from agents.model_settings import ModelSettings
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=server.openai_url, api_key="no-key")
    agent = Agent(
        name="assistant",
        instructions=SYSTEM_PROMPT,
        model=OpenAIChatCompletionsModel(model=server.model, openai_client=client),
        model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0.0),
    )
    session = SQLiteSession("bench", session_settings=SessionSettings(limit=KEEP_ITEMS))
    answers = []
    for text in turns:
        result = await Runner.run(agent, text, session=session)
        answers.append(str(result.final_output))
    await client.close()
    return answers


def _chat_model(server: LlamaServer) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=server.model,
        base_url=server.openai_url,
        api_key="no-key",
        temperature=0.0,
        max_tokens=MAX_TOKENS,
    )


async def run_langgraph_trim(server: LlamaServer, turns: list[str]) -> list[str]:
    from langchain_core.messages import SystemMessage, trim_messages
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    model = _chat_model(server)

    async def call_model(state: MessagesState) -> dict[str, Any]:
        kept = trim_messages(
            state["messages"],
            max_tokens=KEEP_ITEMS,
            token_counter=len,  # counts messages
            strategy="last",
            start_on="human",
        )
        answer = await model.ainvoke([SystemMessage(SYSTEM_PROMPT), *kept])
        return {"messages": [answer]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_edge(START, "model")
    return await _converse(builder.compile(checkpointer=InMemorySaver()), turns)


async def run_langchain_summarization(server: LlamaServer, turns: list[str]) -> list[str]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langgraph.checkpoint.memory import InMemorySaver

    model = _chat_model(server)
    agent: Any = create_agent(
        model,
        tools=[],
        system_prompt=SYSTEM_PROMPT,
        middleware=[
            SummarizationMiddleware(
                model, trigger=("messages", KEEP_ITEMS + 2), keep=("messages", 20)
            )
        ],
        checkpointer=InMemorySaver(),
    )
    return await _converse(agent, turns)


async def _converse(graph: Any, turns: list[str]) -> list[str]:
    """Each of ``turns`` as a human message to a compiled LangGraph graph on one thread; the
    text of the last message after each (the answer)."""
    from langchain_core.messages import HumanMessage

    config: Any = {"configurable": {"thread_id": "bench"}}
    answers = []
    for text in turns:
        state = await graph.ainvoke({"messages": [HumanMessage(text)]}, config)
        answers.append(str(state["messages"][-1].content))
    return answers


SYSTEMS: dict[str, Callable[[LlamaServer, list[str]], Coroutine[Any, Any, list[str]]]] = {
    "contextfold": run_contextfold,
    "openai-agents-limit": run_openai_agents,
    "langgraph-trim": run_langgraph_trim,
    "langchain-summarization": run_langchain_summarization,
}


def measure(name: str, turns: list[str]) -> Result:
    """Run one system on a fresh server; its counters are the system's alone."""
    with LlamaServer(ctx_size=4096) as server:
        before = server.metrics()
        started = time.perf_counter()
        answers = asyncio.run(SYSTEMS[name](server, turns))
        wall = time.perf_counter() - started
        after = server.metrics()

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    evaluated = int(delta("prompt_tokens_total"))
    reused = int(delta("prompt_tokens_cached_total"))
    return Result(
        name,
        evaluated + reused,
        evaluated,
        reused,
        delta("prompt_seconds_total"),
        answers,
        wall,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated, from: " + ", ".join(SYSTEMS)
    )
    args = parser.parse_args()
    turns = questions(args.turns)
    chosen = args.systems.split(",")
    if unknown := set(chosen) - set(SYSTEMS):
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    results = []
    for name in chosen:
        print(f"running {name} ({len(turns)} turns)...", flush=True)
        results.append(measure(name, turns))
    print()
    print(
        f"{'system':<26}{'sent':>8}{'evaluated':>11}{'reused':>8}{'share':>8}"
        f"{'prompt s':>10}{'headers':>9}{'wall s':>8}"
    )
    for r in results:
        print(
            f"{r.name:<26}{r.sent:>8}{r.evaluated:>11}{r.reused:>8}{r.reused_share:>8.1%}"
            f"{r.prompt_seconds:>10.2f}{r.header_answers:>6}/{len(r.answers):<2}{r.wall:>8.1f}"
        )
    ours = next((r for r in results if r.name == "contextfold"), None)
    peers = [r for r in results if r.name != "contextfold"]
    if ours is None or not peers:
        return 0  # a subset: the table only
    best = min(peers, key=lambda r: r.evaluated)
    vs_best = ours.evaluated / best.evaluated
    print()
    print(f"best peer by evaluated tokens: {best.name}")
    print(f"RATIO real_cache_evaluated_vs_best_peer {vs_best:.3f} target <= 0.3")
    print(f"RATIO real_cache_reused_share {ours.reused_share:.3f} target >= 0.9")
    print(f"RATIO real_cache_header_answers {ours.header_answers} target <= 0")
    ok = vs_best <= 0.3 and ours.reused_share >= 0.9 and ours.header_answers <= 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
