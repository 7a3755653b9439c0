"""Benchmark: one long tool-heavy create_agent session, compacted by LangChain's
``SummarizationMiddleware`` and by contextfold's ``ContextMiddleware``, side by side.

A scripted instant model works through ``--turns`` user messages, each with ``--calls``
read_file calls (one per model call, each returning ``--output`` characters) and an answer;
a summary prompt (either side's) gets a deterministic summary from the same model. Both
sides count tokens with LangChain's ``count_tokens_approximately`` and compact at the same
trigger, keeping the same tokens:

- LangChain: ``SummarizationMiddleware(model, trigger=("tokens", T), keep=("tokens", K))``,
  which rewrites the graph state (``RemoveMessage`` of everything, the summary, the kept
  messages), on LangGraph's ``InMemorySaver``;
- contextfold: ``ContextMiddleware(trigger=("tokens", T), keep=("tokens", K), journal=...)``
  on a SQLite journal, with ``JournalSaver`` as the checkpointer: the summary is a
  ``CallCompacted`` on the thread's stream, the graph state is not rewritten, and every
  request is recorded.

Every request the model receives is kept (its message list, serialized as LangChain's JSON):

  langchain_pairs_split                    tool calls without their result (or results
                                           without their call) over all requests (== 0;
                                           LangChain's count is printed)
  langchain_cache_share_vs_summarization   per request, the share of its serialization that
                                           is an exact prefix of the previous request's,
                                           averaged; contextfold / LangChain (>= 1.0)
  langchain_originals_recoverable          of every message the session produced, the share
                                           readable after compaction exactly as it was: from
                                           the journal for contextfold (== 1.0); LangChain's
                                           share still in the final graph state is printed

Run: .venv/bin/python benchmarks/langchain_side_by_side.py [--turns N] [--calls N]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

import contextfold as cf
from contextfold.context.call_records import read_calls, verify_calls
from contextfold.integrations.langchain import ContextMiddleware
from contextfold.integrations.langgraph import JournalSaver

SUMMARY_PROMPTS = ("Write a dense summary", "<role>\nContext Extraction Assistant")
SYSTEM = "You read the files the user names and report what they hold."
OUTPUT = 3_000


@tool
def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return f"{path}: " + "".join(f"line {n} of {path}\n" for n in range(OUTPUT))[:OUTPUT]


class Scripted(BaseChatModel):
    """Per user message, ``calls`` read_file calls one per model call, then an answer; a
    summary prompt gets a summary naming how many tool results it covered."""

    calls: int = 3
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    summaries: int = 0
    remaining: int = 0
    made: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Scripted:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        first = str(messages[0].content)
        if len(messages) == 1 and first.startswith(SUMMARY_PROMPTS):
            self.summaries += 1
            covered = first.count(": line 0 of ")
            message = AIMessage(f"Summary {self.summaries}: {covered} files read so far.")
        else:
            self.seen.append(list(messages))
            if isinstance(messages[-1], HumanMessage):
                self.remaining = self.calls
            if self.remaining:
                self.remaining -= 1
                self.made += 1
                call = {"name": "read_file", "args": {"path": f"f{self.made}.py"}}
                message = AIMessage("", tool_calls=[{**call, "id": f"call{self.made}"}])
            else:
                message = AIMessage(f"Read {self.calls} files.")
        return ChatResult(generations=[ChatGeneration(message=message)])


def _json(message: BaseMessage) -> Any:
    return {"type": message.type, "data": message.model_dump(mode="json")}


def _bytes(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def count(message: BaseMessage) -> float:
    return float(count_tokens_approximately([message]))


def split_pairs(messages: Sequence[BaseMessage]) -> int:
    """Tool results before or without their call, and calls without a result."""
    made: set[str] = set()
    answered: set[str] = set()
    orphans = 0
    for message in messages:
        if isinstance(message, ToolMessage):
            if message.tool_call_id in made:
                answered.add(message.tool_call_id)
            else:
                orphans += 1
        if isinstance(message, AIMessage):
            made.update(str(call["id"]) for call in message.tool_calls)
    return orphans + len(made - answered)


def shared_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    low, high = 0, n  # the longest common prefix, by bisection on slices (compared in C)
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def cache_share(requests: Sequence[Sequence[BaseMessage]]) -> float:
    """Per request after the first, the share of its serialization that repeats the previous
    request's prefix exactly, averaged."""
    bodies = [_bytes([_json(m) for m in request]) for request in requests]
    shares = [shared_prefix(a, b) / len(b) for a, b in itertools.pairwise(bodies)]
    return statistics.fmean(shares) if shares else 0.0


def run(agent: Any, turns: int, config: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The session: the final state and every message the graph state ever held (as JSON,
    each once, as it first appeared; summaries excluded)."""
    originals: dict[str, Any] = {}
    state: dict[str, Any] = {}
    for n in range(turns):
        question = {"messages": [("user", f"Read the next files, part {n}.")]}
        for state in agent.stream(question, config, stream_mode="values"):
            for message in state["messages"]:
                summary = message.additional_kwargs.get("lc_source") == "summarization"
                if message.id not in originals and not summary:
                    originals[str(message.id)] = _json(message)
    return state, list(originals.values())


def recoverable(originals: Sequence[Any], found: Sequence[Any]) -> float:
    """The share of ``originals`` among ``found``, exactly (as a multiset)."""
    left = Counter(_bytes(item) for item in found)
    hits = 0
    for item in originals:
        key = _bytes(item)
        if left[key]:
            left[key] -= 1
            hits += 1
    return hits / max(len(originals), 1)


def langchain_side(turns: int, calls: int, trigger: int, keep: int) -> dict[str, Any]:
    model = Scripted(calls=calls)
    summarizing = SummarizationMiddleware(
        model, trigger=("tokens", trigger), keep=("tokens", keep), token_counter=_counter
    )
    agent: Any = create_agent(
        model,
        tools=[read_file],
        system_prompt=SYSTEM,
        middleware=[summarizing],
        checkpointer=InMemorySaver(),
    )
    state, originals = run(agent, turns, {"configurable": {"thread_id": "long"}})
    final = [_json(m) for m in state["messages"]]
    return {
        "requests": model.seen,
        "compactions": model.summaries,
        "recoverable": recoverable(originals, final),
        "originals": len(originals),
    }


def _counter(messages: Any) -> int:
    return count_tokens_approximately(messages)


def contextfold_side(
    turns: int, calls: int, trigger: int, keep: int, directory: Path
) -> dict[str, Any]:
    model = Scripted(calls=calls)
    with cf.open_journal_sync(f"sqlite:///{directory / 'session.db'}") as journal:
        middleware = ContextMiddleware(
            trigger=("tokens", trigger), keep=("tokens", keep), count_tokens=count, journal=journal
        )
        agent: Any = create_agent(
            model,
            tools=[read_file],
            system_prompt=SYSTEM,
            middleware=[middleware],
            checkpointer=JournalSaver(journal),
        )
        _, originals = run(agent, turns, {"configurable": {"thread_id": "long"}})
        calls_read = journal.run(read_calls, "langgraph/long")
    problems = verify_calls(calls_read)
    assert not problems, problems[:3]
    recorded = [message.message for _, message in calls_read.messages.values()]
    return {
        "requests": model.seen,
        "compactions": len(calls_read.compactions),
        "recoverable": recoverable(originals, recorded),
        "originals": len(originals),
    }


def main(turns: int, calls: int, trigger: int, keep: int) -> int:
    theirs = langchain_side(turns, calls, trigger, keep)
    with tempfile.TemporaryDirectory() as tmp:
        ours = contextfold_side(turns, calls, trigger, keep, Path(tmp))
    sides = (("contextfold", ours), ("LangChain", theirs))
    print(
        f"{turns} user turns x {calls} tool calls ({OUTPUT:,}-character outputs), compaction "
        f"over {trigger:,} tokens keeping {keep:,}: "
        + ", ".join(f"{name} {side['compactions']} compactions" for name, side in sides)
    )
    for name, side in sides:
        sent = [sum(map(count, request)) for request in side["requests"]]
        print(
            f"  {name}: {len(sent)} requests, {statistics.fmean(sent):,.0f} tokens per "
            f"request on average, {max(sent):,.0f} at most"
        )
    split = {name: sum(map(split_pairs, side["requests"])) for name, side in sides}
    ours_split, theirs_split = split["contextfold"], split["LangChain"]
    print(f"  pairs split in requests: contextfold {ours_split}, LangChain {theirs_split}")
    print(f"RATIO langchain_pairs_split {split['contextfold']} target == 0")
    share = {name: cache_share(side["requests"]) for name, side in sides}
    print(
        f"  prompt-cache share: contextfold {share['contextfold']:.4f}, "
        f"LangChain {share['LangChain']:.4f}"
    )
    vs = share["contextfold"] / share["LangChain"] if share["LangChain"] else float("inf")
    print(f"RATIO langchain_cache_share_vs_summarization {vs:.4f} target >= 1.0")
    print(
        f"  originals recoverable after compaction: contextfold {ours['recoverable']:.3f} of "
        f"{ours['originals']} (the journal), LangChain {theirs['recoverable']:.3f} of "
        f"{theirs['originals']} (the final graph state)"
    )
    print(f"RATIO langchain_originals_recoverable {ours['recoverable']:.2f} target == 1.0")
    held = split["contextfold"] == 0 and vs >= 1.0 and ours["recoverable"] == 1.0
    return 0 if held else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--trigger", type=int, default=12_000)
    parser.add_argument("--keep", type=int, default=4_000)
    args = parser.parse_args()
    sys.exit(main(args.turns, args.calls, args.trigger, args.keep))
