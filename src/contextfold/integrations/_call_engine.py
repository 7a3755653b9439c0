"""The context engine inside a framework's model call, framework-neutral: :class:`CallEngine`.

An integration hands over the framework's history for one call, each message as a
:class:`~contextfold.context.call_records.Message` (its JSON and readable form). The engine

1. finds the stream's newest compaction, when the history starts with the messages it
   summarized (another history, e.g. a branch, starts over);
2. compacts when the history behind that summary is over ``compact_at`` tokens: the
   summarizer gets the transcript from the summary on up to a pair-safe cut that keeps
   ``keep_tokens`` of the newest messages and the newest answer, and its summary is
   recorded as a ``CallCompacted`` with every message it replaces (they stay readable);
3. trims what is left to ``budget`` from the oldest whole unit (a tool call goes with its
   results), keeping the system messages and the prefix of earlier requests stable;
4. records the request with the view that chose it, so ``contextfold verify`` recomputes
   both the request's digest and the choice.

The summary goes out as a user message (a faithful summary may quote untrusted text)
right after the system messages. :meth:`CallEngine.prepare` returns which of the
framework's messages to send and in what order; the integration builds its own request
object from them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from ..context.call_records import CallRecorder, Compaction, Message, digest_of
from ..context.calls import (
    CallView,
    Starts,
    compaction_cut,
    summary_prompt,
    view_start,
)
from ..errors import InvalidInputError
from ..wire import Usage
from ._call_spans import CallSpan

__all__ = ["CallEngine", "Prepared", "Summarizer", "check_engine_options"]

Summarizer = Callable[[str], Awaitable[tuple[str, Usage | None]]]
"""Writes a summary for a prompt (:func:`~contextfold.context.calls.summary_prompt`):
the summary's text and the summarizer call's usage, if known."""


def check_engine_options(
    budget: float | None,
    keep: int,
    compact_at: float | None,
    keep_tokens: float,
    trim_to: float | None = None,
) -> None:
    """Raises InvalidInputError naming the first option out of range."""
    for name, value in (("budget", budget), ("compact_at", compact_at)):
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise InvalidInputError(f"{name} must be a number of tokens > 0, got {value!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise InvalidInputError(f"keep_newest must be an int >= 0, got {keep!r}")
    if isinstance(keep_tokens, bool) or not keep_tokens >= 0:
        raise InvalidInputError(f"keep_tokens must be a number of tokens >= 0, got {keep_tokens!r}")
    if trim_to is not None and (
        isinstance(trim_to, bool) or not isinstance(trim_to, (int, float)) or not 0 < trim_to <= 1
    ):
        raise InvalidInputError(f"trim_to must be a share of the budget in (0, 1], got {trim_to!r}")


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one call sends: ``order`` indexes the history (None: the summary message,
    ``summary``), and ``view`` records how they were chosen."""

    order: tuple[int | None, ...]
    summary: Message | None
    view: CallView
    messages: tuple[Message, ...]
    history: tuple[Message, ...]

    def pick(self, history: Sequence[Any], summary: Any = None) -> list[Any]:
        """The framework's own objects in the order sent (``summary``: the summary's)."""
        return [summary if index is None else history[index] for index in self.order]


class CallEngine:
    """Chooses and records each call's messages (see the module). ``count`` is a message's
    tokens; ``summary_message`` makes the framework's user message for a summary text;
    ``starts`` "user" starts a trimmed view only at a user message; with ``trim_to`` (a
    share of the budget) a view keeps the start of the ``previous`` call of its history
    while that fits the budget, and is trimmed to ``trim_to`` of the budget when it no
    longer does, so a budgeted conversation keeps its prompt-cache prefix between trims.
    ``span``: the call's span (``_call_spans``), beside which a compaction gets its own."""

    def __init__(
        self,
        recorder: CallRecorder | None,
        *,
        count: Callable[[Message], float],
        summary_message: Callable[[str], Message],
        budget: float | None = None,
        keep: int = 1,
        compact_at: float | None = None,
        keep_tokens: float = 0.0,
        summarize: Summarizer | None = None,
        starts: Starts = "any",
        trim_to: float | None = None,
        span: CallSpan | None = None,
    ) -> None:
        check_engine_options(budget, keep, compact_at, keep_tokens, trim_to)
        if compact_at is not None and (summarize is None or recorder is None):
            raise InvalidInputError(
                "compaction (compact_at=) needs a summarizer and a journal to record it on"
            )
        self.recorder = recorder
        self.count = count
        self.summary_message = summary_message
        self.budget = budget
        self.keep = keep
        self.compact_at = compact_at
        self.keep_tokens = keep_tokens
        self.summarize = summarize
        self.starts = starts
        self.trim_to = trim_to
        self.span = span

    async def _applying(self, digests: Sequence[str]) -> Compaction | None:
        if self.recorder is None:
            return None
        done = await self.recorder.compaction()
        if done is None or tuple(digests[: len(done.summarized)]) != done.summarized:
            return None
        return done

    async def prepare(
        self,
        history: Sequence[Message],
        *,
        base: float = 0.0,
        tokens: Sequence[float] | None = None,
        previous: Prepared | None = None,
    ) -> Prepared:
        """The messages of one call out of ``history`` (``base``: the tokens of what every
        request holds besides them, such as the system prompt and tools; ``tokens``: each
        history message's, when the integration counted them already, else ``count``'s;
        ``previous``: the last call prepared for this history, whose start a view with
        ``trim_to`` keeps while it fits)."""
        digests = [digest_of(m) for m in history]
        readable = [m.readable for m in history]
        if tokens is None:
            tokens = [float(self.count(m)) for m in history]
        elif len(tokens) != len(history):
            raise InvalidInputError(
                f"tokens= counts {len(tokens)} messages, the history has {len(history)}"
            )
        else:
            tokens = [float(t) for t in tokens]
        done = await self._applying(digests)
        lowest = 0 if done is None else len(done.summarized)
        summary = None if done is None else self.summary_message(done.summary)
        if self.compact_at is not None and self.summarize is not None:
            held = base + sum(tokens[lowest:]) + (self.count(summary) if summary else 0.0)
            cut = (
                compaction_cut(readable, tokens, lowest=lowest, keep_tokens=self.keep_tokens)
                if held > self.compact_at
                else None
            )
            if cut is not None and self.recorder is not None:
                prompt = summary_prompt(
                    readable[lowest:cut], None if done is None else done.summary
                )
                compaction = nullcontext(None) if self.span is None else self.span.compaction()
                with compaction as compacting:
                    text, usage = await self.summarize(prompt)
                    done = await self.recorder.compacted(text, history[:cut], usage=usage)
                    if compacting is not None:
                        compacting.done(done.position, usage)
                lowest, summary = cut, self.summary_message(text)
        extra = base + (self.count(summary) if summary is not None else 0.0)
        anchor = None
        if self.trim_to is not None and previous is not None:
            anchor = _anchor(previous.view, digests, None if done is None else done.position)
        start = view_start(
            readable,
            tokens,
            budget=self.budget,
            keep=self.keep,
            lowest=lowest,
            base=extra,
            starts=self.starts,
            anchor=anchor,
            trim_to=self.trim_to,
        )
        pinned = [i for i in range(start) if readable[i].role == "system"]
        order: list[int | None] = [
            *pinned,
            *([None] if summary else []),
            *range(start, len(history)),
        ]
        view = CallView(
            history=tuple(digests),
            tokens=tuple(tokens),
            budget=self.budget,
            keep=self.keep,
            compaction=None if done is None else done.position,
            summarized=lowest,
            summary=None if summary is None else digest_of(summary),
            base=extra,
            start=start,
            starts=self.starts,
            anchor=anchor,
            trim_to=self.trim_to,
        )
        sent = [history[i] if i is not None else summary for i in order]
        messages = tuple(m for m in sent if m is not None)
        return Prepared(tuple(order), summary, view, messages, tuple(history))

    async def record(
        self, prepared: Prepared, *, model: str, options: dict[str, Any]
    ) -> int | None:
        """Records the prepared request (None without a journal): its position."""
        if self.recorder is None:
            return None
        return await self.recorder.request(
            prepared.messages,
            model=model,
            options=options,
            view=prepared.view,
            history=prepared.history,
        )


def _anchor(previous: CallView, digests: Sequence[str], compaction: int | None) -> int | None:
    """The start of ``previous`` when this history extends its history behind the same
    compaction (else None: the previous start means nothing here)."""
    if previous.compaction != compaction or len(digests) < len(previous.history):
        return None
    if tuple(digests[: len(previous.history)]) != previous.history:
        return None
    return previous.start
