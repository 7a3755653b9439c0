"""The JSON shapes of timelines and request details (the inspector's data): pure functions
from the library's values to JSON-ready dicts."""

from __future__ import annotations

from typing import Any

from ..canonical import sha256_hex
from ..context.call_records import Calls, call_body
from ..errors import InvalidInputError
from ..prices import Pricing
from ..wire import Usage
from .detail import BodyDiff, RequestBodies, body_diff
from .stats import stats_json, stats_of
from .traces import RequestTrace, Timeline, ToolTrace, TraceItem, TurnTrace

__all__ = [
    "DIFF_CHARS",
    "bodies_json",
    "framework_page_json",
    "request_json",
    "timeline_json",
    "turn_json",
    "usage_json",
]

DIFF_CHARS = 200_000
"""Most characters of each side of a body diff sent to the page (the rest is cut)."""


def usage_json(usage: Usage | None) -> dict[str, Any] | None:
    return None if usage is None else usage.model_dump(mode="json")


def _tool_json(call: ToolTrace) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "started_at": call.started_at,
        "started_position": call.started_position,
        "finished_at": call.finished_at,
        "result_position": call.result_position,
        "latency_ms": call.latency_ms,
        "is_error": call.is_error,
        "output": call.output,
        "output_chars": call.output_chars,
        "not_rerun": call.not_rerun,
    }


def request_json(request: RequestTrace, prices: Pricing | None = None) -> dict[str, Any]:
    """One request of a timeline: times, tokens, cost, verify status, prefix share, calls."""
    model = request.response_model or request.model
    return {
        "offset": request.offset,
        "requested_at": request.requested_at,
        "sent_at": request.sent_at,
        "answered_at": request.answered_at,
        "latency_ms": request.latency_ms,
        "reason": request.reason,
        "model": model,
        "transport": request.transport,
        "framework": request.framework,
        "streamed": request.streamed,
        "sends": request.sends,
        "verify": request.verify,
        "recorded_sha256": list(request.recorded_sha256),
        "rebuilt_sha256": request.rebuilt_sha256,
        "rebuild_error": request.rebuild_error,
        "size": request.size,
        "previous_offset": request.previous_offset,
        "prefix_bytes": request.prefix_bytes,
        "prefix_share": request.prefix_share,
        "usage": usage_json(request.usage),
        "cost": prices.cost(model, request.usage) if prices is not None else None,
        "finish_reason": request.finish_reason,
        "text": request.text,
        "text_chars": request.text_chars,
        "response_position": request.response_position,
        "interrupted": request.interrupted,
        "manifest": request.manifest,
        "tool_calls": [_tool_json(call) for call in request.tool_calls],
    }


def _item_json(item: TraceItem) -> dict[str, Any]:
    return {
        "kind": item.kind,
        "position": item.position,
        "time": item.time,
        "role": item.role,
        "actor": item.actor,
        "text": item.text,
        "chars": item.chars,
        "through": item.through,
        "summarized": item.summarized,
        "usage": usage_json(item.usage),
        "model": item.model,
    }


def turn_json(turn: TurnTrace, prices: Pricing | None = None) -> dict[str, Any]:
    requests = [request_json(r, prices) for r in turn.requests]
    costs = [r["cost"] for r in requests if r["cost"] is not None]
    return {
        "index": turn.index,
        "start_time": turn.start_time,
        "end_time": turn.end_time,
        "duration_ms": turn.duration_ms,
        "items": [_item_json(item) for item in turn.items],
        "requests": requests,
        "cost": sum(costs) if costs else None,
    }


def timeline_json(
    timeline: Timeline, *, start: int, limit: int, prices: Pricing | None = None
) -> dict[str, Any]:
    """Turns ``start`` to ``start + limit`` of the timeline, with the whole stream's stats."""
    turns = timeline.turns[start : start + limit]
    return {
        "stream": timeline.stream,
        "version": timeline.version,
        "total_turns": len(timeline.turns),
        "start": start,
        "turns": [turn_json(turn, prices) for turn in turns],
        "stats": stats_json(stats_of(timeline, prices)),
        "priced": prices is not None,
        "skipped": timeline.skipped,
    }


def _cut(data: bytes) -> tuple[str, bool]:
    text = data.decode("utf-8", errors="replace")
    return (text[:DIFF_CHARS], True) if len(text) > DIFF_CHARS else (text, False)


def _diff_json(previous_offset: int | None, diff: BodyDiff | None) -> dict[str, Any] | None:
    if diff is None:
        return None
    removed, removed_cut = _cut(diff.removed)
    added, added_cut = _cut(diff.added)
    return {
        "previous_offset": previous_offset,
        "prefix_bytes": diff.prefix,
        "suffix_bytes": diff.suffix,
        "share": diff.share,
        "removed": removed,
        "added": added,
        "cut": removed_cut or added_cut,
    }


def bodies_json(
    stream: str, bodies: RequestBodies, trace: RequestTrace | None, prices: Pricing | None
) -> dict[str, Any]:
    """The request page: exact body, header snapshot, session prefix, verify status, and
    the diff against the previous request."""
    header = bodies.header
    return {
        "stream": stream,
        "offset": bodies.offset,
        "transport": bodies.rendered.transport,
        "sha256": bodies.rendered.sha256,
        "size": len(bodies.rendered.body),
        "body": bodies.rendered.body.decode("utf-8", errors="replace"),
        "previous_body": (
            bodies.previous.body.decode("utf-8", errors="replace") if bodies.previous else None
        ),
        "header": header.model_dump(mode="json"),
        "session_prefix": [m.model_dump(mode="json") for m in header.session_prefix],
        "diff": _diff_json(bodies.previous_offset, bodies.diff),
        "trace": request_json(trace, prices) if trace is not None else None,
    }


def framework_page_json(
    stream: str, calls: Calls, trace: RequestTrace, prices: Pricing | None
) -> dict[str, Any]:
    """The request page of a framework's request (a call record): the shape of
    :func:`bodies_json`, its body rebuilt from the records (the JSON its digest covers),
    its header the model, framework, options and view, and ``messages`` each message sent
    in its readable form with its digest (``previous_messages``: the digests the previous
    request sent). Raises InvalidInputError when the body cannot be rebuilt."""
    sent = calls.requests[trace.offset]
    body = call_body(calls, trace.offset)
    previous: bytes | None = None
    before = calls.requests.get(trace.previous_offset or 0)
    if trace.previous_offset is not None and before is not None:
        try:
            previous = call_body(calls, trace.previous_offset)
        except InvalidInputError:  # not comparable: shown as the first request is
            previous = None
    diff = body_diff(previous, body) if previous is not None else None
    messages = []
    for digest in sent.messages:
        readable = calls.readable(digest)
        shown = readable.model_dump(mode="json", exclude_none=True) if readable else {}
        messages.append({**shown, "sha256": digest})
    view = sent.view.model_dump(mode="json") if sent.view is not None else None
    return {
        "stream": stream,
        "offset": trace.offset,
        "transport": sent.framework,
        "framework": sent.framework,
        "sha256": sha256_hex(body),
        "size": len(body),
        "body": body.decode("utf-8", errors="replace"),
        "previous_body": previous.decode("utf-8", errors="replace") if previous else None,
        "header": {
            "model": sent.model,
            "framework": sent.framework,
            "options": sent.options,
            "view": view,
        },
        "session_prefix": [],
        "diff": _diff_json(trace.previous_offset if diff else None, diff),
        "messages": messages,
        "previous_messages": list(before.messages) if before is not None and diff else [],
        "trace": request_json(trace, prices),
    }
