"""contextfold under pydantic-ai: a journal-backed message history, a budgeted history
processor, the untrusted-content helpers, and a model wrapper recording what is sent.

- :class:`JournalHistory`: ``await history.load(budget=None)`` is the ``message_history`` of
  the next run, ``await history.save(result)`` appends the run's ``new_messages()`` once, each
  message stored as pydantic-ai's own JSON.
- :func:`budgeted`: a history processor (``ProcessHistory(budgeted(30_000))``) trimming the
  history pair-safe to a token budget, keeping the system prompt and sending untrusted
  system prompts as user prompts; :func:`budget_history` is the pure function under it.
- :func:`untrusted_prompt` and :func:`untrusted`: external content as a user prompt that names
  its actor, and a system prompt part marked as untrusted.
- :class:`ContextModel`: wraps any model with contextfold's context engine: each call's
  history trimmed pair-safe to a budget, compacted by summary (recorded as a
  ``CallCompacted``, the originals kept), every request and answer recorded as
  framework-neutral call records (``read_calls``, ``verify_calls``).
- :class:`RecordingModel`: wraps any model and records each request (messages, settings and
  parameters as JSON, with SHA-256 digests) on a stream; :func:`recorded_requests`,
  :func:`verify_recorded` and :func:`messages_digest` check the record.

Needs the ``pydantic-ai`` extra; without it, importing this module raises ImportError naming it.
"""

from __future__ import annotations

try:
    import pydantic_ai.messages
    import pydantic_ai.models.wrapper  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "contextfold.integrations.pydantic_ai needs pydantic-ai: "
        "pip install 'contextfold[pydantic-ai]'"
    ) from exc

from ._pydantic_ai_history import JournalHistory, PydanticAiMessage
from ._pydantic_ai_model import ContextModel
from ._pydantic_ai_recording import (
    PydanticAiRequestSent,
    PydanticAiSentMessage,
    RecordedRequest,
    RecordingModel,
    messages_digest,
    recorded_requests,
    request_digest,
    verify_recorded,
)
from ._pydantic_ai_window import (
    ACTOR_KEY,
    HistoryView,
    actor_of,
    approx_message_tokens,
    budget_history,
    budgeted,
    untrusted,
    untrusted_prompt,
)

__all__ = [
    "ACTOR_KEY",
    "ContextModel",
    "HistoryView",
    "JournalHistory",
    "PydanticAiMessage",
    "PydanticAiRequestSent",
    "PydanticAiSentMessage",
    "RecordedRequest",
    "RecordingModel",
    "actor_of",
    "approx_message_tokens",
    "budget_history",
    "budgeted",
    "messages_digest",
    "recorded_requests",
    "request_digest",
    "untrusted",
    "untrusted_prompt",
    "verify_recorded",
]
