"""``runtime_only``: the declaration of events only the agent runtime writes."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold.context.rebuild import RequestRecorded
from contextfold.errors import EventDefinitionError
from contextfold.events import Event, runtime_only_types
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
