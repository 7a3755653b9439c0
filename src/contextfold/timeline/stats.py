"""What a stream's session amounted to: requests, tokens (per lane and as reported),
the prompt cache's share, compactions and cost; the numbers ``contextfold stats`` prints
and the inspector's summary shows. Pure functions of a :class:`~.traces.Timeline`.

A framework's stream (call records, no agent header) has its model and lanes from its
newest request: its system messages, the summary standing in for older messages, the
other messages, and the request's options (system prompt, tools, settings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..context.compaction import context_window
from ..context.state import AgentContextState
from ..prices import Pricing
from ..views.tokens import approx_tokens
from .traces import LaneTokens, Timeline

__all__ = ["LaneTokens", "Stats", "lanes_of", "stats_json", "stats_of", "stats_text"]


def lanes_of(state: AgentContextState) -> tuple[LaneTokens, ...]:
    """The system lane, the session prefix (logged in the request header) and history."""
    prefix = state.header.session_prefix if state.header is not None else ()
    return (
        LaneTokens(
            "system", len(state.system), sum(approx_tokens(i.content) for i in state.system)
        ),
        LaneTokens("session prefix", len(prefix), sum(approx_tokens(m.content) for m in prefix)),
        LaneTokens(
            "history", len(state.history), sum(approx_tokens(i.content) for i in state.history)
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    """The totals of one stream (see the module docstring).

    ``cached_share`` is the cached input tokens over the input tokens of the requests
    whose provider reported a cache count; ``prefix_share`` the bytes of every body that
    are an exact prefix of the previous request's body, over those bodies' bytes (the
    first request has no previous one). ``cost`` is None without a price for any request.
    """

    stream: str
    version: int
    turns: int
    requests: int
    answered: int
    sends: int
    tool_calls: int
    tool_errors: int
    compactions: int
    input_tokens: int
    cached_input_tokens: int
    cache_write_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_share: float | None
    prefix_share: float | None
    cost: float | None
    unpriced_models: tuple[str, ...]
    verify: dict[str, int]
    model: str | None
    context_window: int | None
    lanes: tuple[LaneTokens, ...]
    latest_input_tokens: int | None
    """The input tokens the provider reported for the latest answered request."""
    priced: bool = False
    """Whether prices were given (``cost`` may still be None: no model they know)."""
    frameworks: tuple[str, ...] = ()
    """The frameworks whose call records the stream holds."""


def stats_of(timeline: Timeline, prices: Pricing | None = None) -> Stats:
    """The stats of ``timeline``, with costs from ``prices`` when given (see
    :func:`~contextfold.prices.default_prices`)."""
    requests = timeline.requests
    answered = [r for r in requests if r.usage is not None]
    reported = [r for r in answered if r.usage and r.usage.cached_input_tokens is not None]
    reported_input = sum(r.usage.input_tokens for r in reported if r.usage)
    compared = [r for r in requests if r.prefix_bytes is not None and r.size]
    compared_bytes = sum(r.size or 0 for r in compared)
    calls = [c for r in requests for c in r.tool_calls]
    compactions = [i for t in timeline.turns for i in t.items if i.kind == "compaction"]
    cost: float | None = None
    unpriced: set[str] = set()
    if prices is not None:
        for request in answered:
            model = request.response_model or request.model
            spent = prices.cost(model, request.usage)
            if spent is None:
                unpriced.add(model or "?")
            else:
                cost = (cost or 0.0) + spent
        for item in compactions:
            agent = timeline.state.header.model if timeline.state.header else None
            spent = prices.cost(item.model or agent, item.usage)
            if spent is not None:
                cost = (cost or 0.0) + spent
    verify = {"ok": 0, "drift": 0, "error": 0, "unsent": 0}
    for request in requests:
        verify[request.verify] += 1
    header = timeline.state.header
    framework = timeline.framework
    model = header.model if header is not None else None
    lanes = lanes_of(timeline.state)
    if header is None and framework is not None:
        model, lanes = framework.model, framework.lanes
    return Stats(
        stream=timeline.stream,
        version=timeline.version,
        turns=len(timeline.turns),
        requests=len(requests),
        answered=len(answered),
        sends=sum(r.sends for r in requests),
        tool_calls=len(calls),
        tool_errors=sum(1 for c in calls if c.is_error),
        compactions=len(compactions),
        input_tokens=sum(r.usage.input_tokens for r in answered if r.usage),
        cached_input_tokens=sum(r.usage.cached_input_tokens or 0 for r in answered if r.usage),
        cache_write_tokens=sum(r.usage.cache_write_tokens or 0 for r in answered if r.usage),
        output_tokens=sum(r.usage.output_tokens for r in answered if r.usage),
        reasoning_tokens=sum(r.usage.reasoning_tokens or 0 for r in answered if r.usage),
        cached_share=(
            sum(r.usage.cached_input_tokens or 0 for r in reported if r.usage) / reported_input
            if reported_input
            else None
        ),
        prefix_share=(
            sum(r.prefix_bytes or 0 for r in compared) / compared_bytes if compared_bytes else None
        ),
        cost=cost,
        unpriced_models=tuple(sorted(unpriced)),
        verify=verify,
        model=model,
        context_window=context_window(model) if model is not None else None,
        lanes=lanes,
        latest_input_tokens=answered[-1].usage.input_tokens
        if answered and answered[-1].usage
        else None,
        priced=prices is not None,
        frameworks=framework.frameworks if framework is not None else (),
    )


def stats_json(stats: Stats) -> dict[str, Any]:
    """The stats as JSON (the shape of ``contextfold stats --json`` and the HTTP API)."""
    return {
        "stream": stats.stream,
        "version": stats.version,
        "turns": stats.turns,
        "requests": stats.requests,
        "answered": stats.answered,
        "sends": stats.sends,
        "tool_calls": stats.tool_calls,
        "tool_errors": stats.tool_errors,
        "compactions": stats.compactions,
        "tokens": {
            "input": stats.input_tokens,
            "cached_input": stats.cached_input_tokens,
            "cache_write": stats.cache_write_tokens,
            "output": stats.output_tokens,
            "reasoning": stats.reasoning_tokens,
        },
        "cache": {"cached_share": stats.cached_share, "prefix_share": stats.prefix_share},
        "cost": stats.cost,
        "unpriced_models": list(stats.unpriced_models),
        "verify": dict(stats.verify),
        "model": stats.model,
        "frameworks": list(stats.frameworks),
        "context_window": stats.context_window,
        "latest_input_tokens": stats.latest_input_tokens,
        "lanes": [
            {"lane": lane.lane, "items": lane.items, "tokens": lane.tokens} for lane in stats.lanes
        ],
    }


def _cache_text(stats: Stats) -> str:
    if stats.prefix_share is None:
        repeated = "no request has a previous one to compare its bytes with"
    else:
        repeated = f"{stats.prefix_share:.1%} of request bytes repeat the previous request exactly"
    if stats.cached_share is None:
        cached = "the provider did not report how many input tokens were cached"
    else:
        cached = f"the provider reported {stats.cached_share:.1%} of input tokens cached"
    return f"cache: {repeated}; {cached}"


def _cost_text(stats: Stats) -> str:
    # "?" stands for an answered request that recorded no model name (see stats_of).
    names = [name for name in stats.unpriced_models if name != "?"]
    if "?" in stats.unpriced_models:
        names.append("a request without a model name")
    missing = ", ".join(names)
    if stats.cost is not None:
        return f"cost ${stats.cost:.4f}" + (f" (no price known for {missing})" if missing else "")
    if not stats.priced:
        return "cost: unknown (no prices given)"
    if missing:
        return f"cost: unknown (no price known for {missing})"
    return "cost: no answered request to price"


def stats_text(stats: Stats) -> tuple[str, ...]:
    """The stats as lines of text, one subject each (``contextfold stats``); the lanes as
    tab-separated rows under a header row. Each line reads as a sentence when a value is
    missing (no model recorded, no window, nothing the provider reported, nothing priced)."""
    window = stats.context_window
    if stats.model is None:
        model = "no model recorded"
    else:
        limit = f"{window} tokens" if window else "unknown"
        model = f"model {stats.model}, window {limit}"
    verify = ", ".join(f"{count} {name}" for name, count in stats.verify.items() if count)
    events = f"{stats.version} event" + ("" if stats.version == 1 else "s")
    if stats.frameworks:
        events += f", recorded by {', '.join(stats.frameworks)}"
    return (
        f"stream {stats.stream}: {events}, {model}",
        f"requests {stats.requests} ({stats.answered} answered, {stats.sends} sent), "
        f"turns {stats.turns}, tool calls {stats.tool_calls} ({stats.tool_errors} failed), "
        f"compactions {stats.compactions}",
        f"tokens input {stats.input_tokens} (cached {stats.cached_input_tokens}, cache writes "
        f"{stats.cache_write_tokens}), output {stats.output_tokens} (reasoning "
        f"{stats.reasoning_tokens})",
        _cache_text(stats),
        _cost_text(stats),
        f"verify: {verify or 'no requests'}",
        "lane\titems\ttokens\tof window",
        *(
            f"{lane.lane}\t{lane.items}\t{lane.tokens}\t"
            + (f"{lane.tokens / window:.1%}" if window else "-")
            for lane in stats.lanes
        ),
    )
