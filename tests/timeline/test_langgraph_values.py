"""LangGraph checkpoint records, as ``contextfold events``, the HTTP event list and the
inspector list them: the values JournalSaver stores as LangGraph's serializer wrote them
(base64 msgpack) shown decoded, LangChain messages readable and other wrapped objects
named by their class, the stored records unchanged; what cannot be decoded stays as
stored, saying why."""

from __future__ import annotations

import base64
import datetime
import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic import BaseModel
from typer.testing import CliRunner

import contextfold as cf
from contextfold.cli import URL_ENV, app
from contextfold.inspection import event_json
from contextfold.integrations._langgraph_index import WritesPut
from contextfold.integrations.langgraph import JournalSaver
from contextfold.server import create_app
from contextfold.timeline.langgraph_values import shown_payload
from tests.server.helpers import running

THREAD = "t1"
STREAM = f"langgraph/{THREAD}"
CONFIG: Any = {"configurable": {"thread_id": THREAD}}


def _answer(state: MessagesState) -> dict[str, Any]:
    call = {"id": "c1", "name": "look", "args": {"q": "weather"}}
    return {
        "messages": [
            AIMessage(content="", tool_calls=[call]),
            ToolMessage(content="sunny", tool_call_id="c1"),
            AIMessage(content="It is sunny."),
        ]
    }


def _graph(journal: cf.SyncJournal) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("answer", _answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile(checkpointer=JournalSaver(journal))


def _stored(url: str) -> list[cf.StoredEvent]:
    with cf.open_journal_sync(url) as journal:
        _graph(journal).invoke({"messages": [HumanMessage(content="Weather?")]}, CONFIG)
        return list(journal.read_all(STREAM))


def _base64_values(payload: Any) -> list[str]:
    """The stored base64 strings of a record (what must not be listed)."""
    found: list[str] = []
    if isinstance(payload, dict):
        for key, value in payload.items():
            if key == "data" and isinstance(value, str) and value:
                found.append(value)
            else:
                found += _base64_values(value)
    elif isinstance(payload, list):
        if len(payload) == 2 and payload[0] == "msgpack":
            found.append(payload[1])
        else:
            for value in payload:
                found += _base64_values(value)
    return found


def _messages(listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages of the newest stored list of the messages channel."""
    blobs = [
        e.get("readable", e["payload"])
        for e in listed
        if e["type"].endswith("channel-blob") and e["payload"]["channel"] == "messages"
    ]
    items: list[dict[str, Any]] = blobs[-1]["items"]
    return items


def test_a_real_checkpoint_lists_readable_messages_and_no_base64(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    stored = _stored(url)
    listed = [event_json(e) for e in stored]
    secrets = [s for e in stored for s in _base64_values(e.payload)]
    assert secrets, "the saver stores base64 values"
    # The payload stays as stored (a client may append it elsewhere); its readable form
    # holds no base64.
    assert [e["payload"] for e in listed] == [e.payload for e in stored]
    text = orjson.dumps([e.get("readable", e["payload"]) for e in listed]).decode()
    assert not [s for s in secrets if s in text]
    assert {e["payload_view"] for e in listed if "payload_view" in e} == {"decoded"}
    assert "payload_note" not in orjson.dumps(listed).decode()

    newest = _messages(listed)  # the delta: what the list gained
    assert newest[0]["type"] == "ai" and newest[0]["content"] == ""
    assert [(c["name"], c["args"], c["id"]) for c in newest[0]["tool_calls"]] == [
        ("look", {"q": "weather"}, "c1")
    ]
    assert (newest[1]["type"], newest[1]["content"], newest[1]["tool_call_id"]) == (
        "tool",
        "sunny",
        "c1",
    )
    assert (newest[2]["type"], newest[2]["content"]) == ("ai", "It is sunny.")
    puts = [e.get("readable", e["payload"]) for e in listed if e["type"].endswith("checkpoint-put")]
    assert all(p["checkpoint"]["value"]["id"] == p["checkpoint_id"] for p in puts)
    writes = [
        w
        for e in listed
        if e["type"].endswith("writes-put")
        for w in e.get("readable", e["payload"])["writes"]
    ]
    first = next(w for w in writes if w["channel"] == "messages")
    assert first["value"]["value"][0]["type"] == "human"
    assert first["value"]["value"][0]["content"] == "Weather?"

    # Display only: the records keep their bytes, and the saver reads them back.
    assert [s for e in stored for s in _base64_values(e.payload)] == secrets
    with cf.open_journal_sync(url) as journal:
        state = _graph(journal).get_state(CONFIG)
    assert [m.content for m in state.values["messages"]][-1] == "It is sunny."

    # `contextfold events` prints the same lines.
    printed = CliRunner().invoke(app, ["events", STREAM, "--url", url], env={URL_ENV: ""})
    assert printed.exit_code == 0, printed.output
    lines = [json.loads(line) for line in printed.stdout.splitlines()]
    assert [line["payload"] for line in lines] == [e["payload"] for e in listed]


async def test_the_http_event_list_shows_them_decoded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    _stored(url)
    async with cf.open_journal(url) as journal, running(create_app(journal)) as server:
        page = (await server.client.get(f"/v1/streams/{STREAM}/events")).json()
        found = (await server.client.get(f"/v1/streams/{STREAM}/search?q=channel-blob")).json()
    assert _messages(page["events"])[-1]["content"] == "It is sunny."
    assert _messages(found["events"])[-1]["content"] == "It is sunny."


class _Settings(BaseModel):
    level: int


@dataclass
class _Point:
    x: int


def _writes(*values: tuple[str, bytes]) -> dict[str, Any]:
    writes = [
        {"idx": n, "channel": "c", "value": {"type": t, "data": base64.b64encode(d).decode()}}
        for n, (t, d) in enumerate(values)
    ]
    return {"ns": "", "checkpoint_id": "x", "task_id": "t", "writes": writes}


def test_other_objects_are_named_by_their_class() -> None:
    serde = JsonPlusSerializer()
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    ident = uuid.UUID(int=7)
    values = [when, ident, {3}, _Point(1), _Settings(level=2), b"raw", b"\xff\x00", None]
    payload = _writes(*(serde.dumps_typed(v) for v in values))
    shown, note = shown_payload("contextfold.langgraph/writes-put", payload)
    assert note is None
    assert [w["value"]["value"] for w in shown["writes"]] == [
        {"__type__": "datetime.datetime", "value": when.isoformat()},
        {"__type__": "uuid.UUID", "value": ident.hex},
        {"__type__": "builtins.set", "value": [3]},
        {"__type__": f"{__name__}._Point", "x": 1},
        {"__type__": f"{__name__}._Settings", "level": 2},
        {"__type__": "bytes", "text": "raw"},
        {"__type__": "bytes", "base64": base64.b64encode(b"\xff\x00").decode()},
        None,
    ]
    # LangChain's JSON form of a message reads the same as its msgpack one.
    lc = {"lc": 1, "type": "constructor", "id": ["langchain_core", "messages", "HumanMessage"]}
    data = json.dumps([{**lc, "kwargs": {"content": "hi"}}]).encode()
    shown, note = shown_payload("contextfold.langgraph/writes-put", _writes(("json", data)))
    assert note is None and shown["writes"][0]["value"]["value"] == [
        {"type": "human", "content": "hi"}
    ]


def test_what_cannot_be_decoded_stays_as_stored_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    packed = JsonPlusSerializer().dumps_typed({"text": "x" * 50})
    payload = _writes(packed, ("pickle", b"\x80\x04N."))
    shown, note = shown_payload("contextfold.langgraph/writes-put", payload)
    assert shown["writes"][0]["value"]["value"] == {"text": "x" * 50}
    assert shown["writes"][1] == payload["writes"][1]
    assert note == "values serialized as 'pickle' are not decoded for display"

    # The later parts of a value split over records are not whole values.
    blob = {"channel": "doc", "kind": "value", "serde_type": "msgpack", "more": False}
    tail = base64.b64encode(packed[1][-20:]).decode()
    shown, note = shown_payload("contextfold.langgraph/channel-blob", {**blob, "data": tail})
    assert shown["data"] == tail and note is not None and "not one whole msgpack value" in note

    # Without ormsgpack every msgpack value stays as stored, and the listing says so.
    with cf.open_journal_sync("memory://") as journal:
        journal.append(STREAM, WritesPut.model_validate(_writes(packed)))
        (stored,) = journal.read_all(STREAM)
    monkeypatch.setitem(sys.modules, "ormsgpack", None)
    listed = event_json(stored)
    assert listed["payload"] == stored.payload and listed["payload_view"] == "as stored"
    assert listed["payload_note"].startswith("ormsgpack is not installed")
