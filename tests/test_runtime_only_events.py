"""``runtime_only``: the declaration of events only the agent runtime writes."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import contextfold as cf
from contextfold.context.rebuild import RequestRecorded
from contextfold.errors import EventDefinitionError
from contextfold.events import (
    CLIENT_TYPES,
    RUNTIME_TYPE_PREFIXES,
    Event,
    is_runtime_type,
    registered_types,
    runtime_only_types,
)
from contextfold.runtime.scheduling import AgentHalted


class _Step(Event, type="test.runtime-only/step", runtime_only=True):
    n: int = 0


class _RuntimeBase(Event, runtime_only=True):
    """An abstract base: its subclasses inherit the declaration."""


class _Inherited(_RuntimeBase, type="test.runtime-only/inherited"):
    pass


class _Opened(_RuntimeBase, type="test.runtime-only/opened", runtime_only=False):
    pass


def test_declared_and_inherited_types_are_listed() -> None:
    listed = runtime_only_types()
    assert {_Step.event_type, _Inherited.event_type} <= listed
    assert _Opened.event_type not in listed
    assert _Step.runtime_only and not Event.runtime_only


def test_the_agent_runtime_events_are_declared() -> None:
    runtime = (
        cf.LlmRequestRequested,
        cf.LlmResponse,
        cf.LlmRequestInterrupted,
        cf.ToolCallResult,
        cf.ToolCallStarted,
        RequestRecorded,
        AgentHalted,
    )
    assert {cls.event_type for cls in runtime} <= runtime_only_types()
    assert cf.ContextAdded.event_type not in runtime_only_types()


def test_runtime_only_must_be_a_bool() -> None:
    with pytest.raises(EventDefinitionError, match="runtime_only"):

        class _Bad(Event, type="test.runtime-only/bad", runtime_only="yes"):
            pass


def _integration_classes() -> dict[str, type[Event]]:
    """Every event class the integrations define, each of their modules imported."""
    import contextfold.integrations

    for info in pkgutil.iter_modules(
        contextfold.integrations.__path__, "contextfold.integrations."
    ):
        importlib.import_module(info.name)
    return {
        name: cls
        for name, cls in registered_types().items()
        if cls.__module__.startswith("contextfold.integrations.")
    }


def test_every_integration_record_is_runtime_only_under_a_reserved_prefix() -> None:
    found = _integration_classes()
    # 5 openai-agents, 3 pydantic-ai, 4 adk and 5 langgraph records, at least
    assert len(found) >= 17, sorted(found)
    for name, cls in found.items():
        assert cls.runtime_only, f"{name} ({cls.__qualname__}) is not runtime_only"
        assert name.startswith(RUNTIME_TYPE_PREFIXES), f"{name} is under no reserved prefix"
        assert is_runtime_type(name)
    assert {n for n in found if n.startswith("contextfold.langgraph/")} == {
        "contextfold.langgraph/channel-blob",
        "contextfold.langgraph/checkpoint-put",
        "contextfold.langgraph/writes-put",
        "contextfold.langgraph/checkpoints-retracted",
        "contextfold.langgraph/thread-cleared",
    }


def test_a_reserved_type_is_runtime_only_by_its_name_alone() -> None:
    _integration_classes()
    registered = registered_types()
    for name, cls in registered.items():
        own = cls.__module__.startswith("contextfold.")  # not a test's class
        if own and name.startswith(RUNTIME_TYPE_PREFIXES) and name not in CLIENT_TYPES:
            assert cls.runtime_only, f"{name} is reserved but its class is not runtime_only"
    for name in (
        "adk/not-defined-yet",
        "openai-agents/x",
        "pydantic-ai/x",
        "contextfold.langgraph/x",
    ):
        assert name not in registered and is_runtime_type(name)
    assert {cf.ContextAdded.event_type} == CLIENT_TYPES
    assert not is_runtime_type(cf.ContextAdded.event_type)
    assert not is_runtime_type("my-app/note") and not is_runtime_type("adk")
