"""contextfold under LangChain v1's ``create_agent``: a middleware around each model call.

``create_agent(model, tools, middleware=[ContextMiddleware(budget=...)])`` hands the model
a budgeted, pair-safe view of the agent's messages (:func:`~contextfold.integrations.
langgraph.budget_messages`): the trusted system messages and the newest turns that fit,
never a tool result without the call it answers nor a call without its result, and
external content marked with :func:`~contextfold.integrations.langgraph.untrusted` sent as
a user message. The agent's state is unchanged: what was left out of one call is still
there for the checkpointer and for later calls with more room.

With ``journal`` and ``stream`` each call first records the messages the stream has not
recorded yet as ``cf.ContextAdded`` items, so the journal holds the conversation (the
model's answer is recorded by the next call). Sync agents need a SyncJournal; async ones
take either.

Needs LangChain v1 (``pip install 'contextfold[langchain]'``); without it, importing this
module raises ImportError naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
except ImportError as exc:
    raise ImportError(
        "contextfold.integrations.langchain needs LangChain v1: "
        "pip install 'contextfold[langchain]'"
    ) from exc

from ..errors import InvalidInputError
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ._journal_bridge import JournalBridge
from ._langgraph_messages import (
    Counter,
    MessagesView,
    _checked_budget,
    _checked_counter,
    _record,
    budget_messages,
)

__all__ = ["ContextMiddleware"]


class ContextMiddleware(AgentMiddleware):
    """Budgets (and with a journal, records) the messages of each model call of a
    ``create_agent`` agent; see the module. Raises InvalidInputError for bad options.

    ``budget`` is in tokens as ``count_tokens`` counts one message (default: contextfold's
    ``approx_tokens``); ``keep_newest`` units (a message, or a call with its results) are
    kept whatever they cost. :attr:`last_view` is the view the latest call sent."""

    def __init__(
        self,
        *,
        budget: float,
        count_tokens: Counter | None = None,
        keep_newest: int = 1,
        journal: Journal | SyncJournal | None = None,
        stream: str | None = None,
    ) -> None:
        super().__init__()
        _checked_budget(budget, keep_newest)
        _checked_counter(count_tokens)
        if (journal is None) != (stream is None):
            raise InvalidInputError("ContextMiddleware takes journal= and stream= together")
        self._bridge = (
            JournalBridge(journal, what="ContextMiddleware") if journal is not None else None
        )
        self._stream = check_stream(stream) if stream is not None else ""
        self._view = functools.partial(
            budget_messages, budget=budget, count_tokens=count_tokens, keep_newest=keep_newest
        )
        self.last_view: MessagesView | None = None

    def _budgeted(self, request: ModelRequest) -> ModelRequest:
        view = self._view(request.messages)
        self.last_view = view
        return request.override(messages=list(view.messages))  # type: ignore[arg-type]

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> Any:
        if self._bridge is not None:
            record = functools.partial(
                _record, self._bridge.journal, self._stream, list(request.messages)
            )
            self._bridge.run(record)
        return handler(self._budgeted(request))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        if self._bridge is not None:
            record = functools.partial(
                _record, self._bridge.journal, self._stream, list(request.messages)
            )
            await self._bridge.arun(record)
        return await handler(self._budgeted(request))
