"""contextfold under LangGraph: a checkpoint saver on the journal, and a messages component.

- :class:`JournalSaver`: ``graph.compile(checkpointer=JournalSaver(journal))`` stores every
  thread as one journal stream, growing with what changed (a message list is written as
  the messages it gained), with forks, namespaces and pending writes, sync and async.
- :func:`budgeted_messages`: a ``pre_model_hook`` (or node) handing the model a budgeted,
  pair-safe view of the messages; :func:`budget_messages` is the pure function under it;
  :func:`untrusted` marks external content, which never reaches the model as a system
  message.

Needs the ``langgraph`` extra; without it, importing this module raises ImportError
naming it.
"""

from __future__ import annotations

try:
    import langchain_core.messages  # noqa: F401
    import langgraph.checkpoint.base  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "contextfold.integrations.langgraph needs LangGraph: pip install 'contextfold[langgraph]'"
    ) from exc

from ._langgraph_messages import (
    ACTOR_KEY,
    MessagesView,
    actor_of,
    budget_messages,
    budgeted_messages,
    untrusted,
)
from ._langgraph_saver import JournalSaver

__all__ = [
    "ACTOR_KEY",
    "JournalSaver",
    "MessagesView",
    "actor_of",
    "budget_messages",
    "budgeted_messages",
    "untrusted",
]
