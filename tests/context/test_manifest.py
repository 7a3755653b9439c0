"""The manifest (Buzz's shape and hash) and the turn records it is folded from."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contextfold.context.events import ContextAdded, LlmResponse
from contextfold.context.manifest import (
    Manifest,
    ManifestLayer,
    content_version,
    layers_json,
    manifest_of,
)
from contextfold.context.turns import SteerAccepted, TurnCompiled, Turns, TurnState, item_sha256
from contextfold.events import Envelope, Event, EventMeta
from contextfold.testing import envelope
from contextfold.wire import ToolCall

FIELDS = (
    "order",
    "layer",
    "scope",
    "source",
    "version",
    "authority",
    "freshness",
    "estimatedTokens",
    "truncated",
)


def _layer(order: int, name: str = "x", version: str = "v", tokens: int = 1) -> ManifestLayer:
    return ManifestLayer(
        order=order,
        layer=name,
        scope="turn",
        source="s",
        version=version,
        authority="evidence",
        freshness="current",
        estimated_tokens=tokens,
    )


layers = st.lists(
    st.builds(
        _layer,
        order=st.integers(0, 9),
        name=st.text(min_size=1),
        version=st.text(min_size=1),
        tokens=st.integers(0, 10**6),
    ),
    max_size=8,
)


@given(layers)
def test_layers_sort_stably_by_order(given_layers: list[ManifestLayer]) -> None:
    manifest = manifest_of(given_layers)
    assert list(manifest.layers) == sorted(given_layers, key=lambda layer: layer.order)


@given(layers)
def test_the_hash_covers_the_compact_layer_array_in_buzz_field_order(
    given_layers: list[ManifestLayer],
) -> None:
    manifest = manifest_of(given_layers)
    array = [
        dict(zip(FIELDS, (x.order, x.layer, x.scope, x.source, x.version, x.authority,
                          x.freshness, x.estimated_tokens, x.truncated), strict=True))
        for x in manifest.layers
    ]  # fmt: skip
    compact = json.dumps(array, separators=(",", ":"), ensure_ascii=False).encode()
    assert layers_json(manifest.layers) == compact
    assert manifest.hash == "sha256:" + hashlib.sha256(compact).hexdigest()


def test_the_json_is_buzzs_and_reads_back() -> None:
    manifest = manifest_of([_layer(7, "current_instruction", "event-1")])
    data = json.loads(manifest.to_json())
    assert list(data) == ["schemaVersion", "hash", "layers"]
    assert data["schemaVersion"] == 1
    assert list(data["layers"][0]) == list(FIELDS)
    assert Manifest.model_validate_json(manifest.to_json()) == manifest


def test_a_manifest_whose_hash_does_not_match_its_layers_is_refused() -> None:
    manifest = manifest_of([_layer(1), _layer(2)])
    data: dict[str, Any] = json.loads(manifest.to_json())
    data["layers"][0]["version"] = "edited"
    with pytest.raises(ValidationError, match="does not match its layers"):
        Manifest.model_validate(data)
    data = json.loads(manifest.to_json())
    data["layers"].reverse()
    with pytest.raises(ValidationError, match="sorted by order"):
        Manifest.model_validate(data)


def test_content_version_is_the_sha256_of_the_utf8_content() -> None:
    assert content_version("ship") == "sha256:" + hashlib.sha256(b"ship").hexdigest()
    assert content_version("é") == "sha256:" + hashlib.sha256("é".encode()).hexdigest()


# --- the turn records -----------------------------------------------------------------------

BASE = manifest_of([_layer(7, "current_instruction", "e-1"), _layer(8, "delivery_contract")])
STEER = (_layer(7, "current_instruction", "s-1"),)


def _env(event: Event, position: int, actor: str = "agent") -> Envelope[Any]:
    meta = EventMeta(event_id=f"ev-{position}", time="2026-01-01T00:00:00+00:00", actor=actor)
    return envelope(event, position, meta=meta)


def _turn(text: str = "turn") -> TurnCompiled:
    return TurnCompiled(
        actor="pk",
        destination="t",
        event_ids=("e-1",),
        manifest=BASE,
        item_sha256=item_sha256(text),
    )


def _steer(turn_at: int = 1, text: str = "steer") -> SteerAccepted:
    return SteerAccepted(
        turn_at=turn_at, event_id="s-1", layers=STEER, item_sha256=item_sha256(text)
    )


def _fold(*envelopes: Envelope[Any]) -> TurnState:
    return Turns.apply_all(Turns.initial_state(), envelopes)


def _answer(request: int, *, calls: bool = False) -> LlmResponse:
    tool_calls = (ToolCall(id="c", name="t", arguments="{}"),) if calls else ()
    return LlmResponse(request_offset=request, model="m", text="ok", tool_calls=tool_calls)


def test_a_turn_and_its_steer_make_the_manifest() -> None:
    state = _fold(
        _env(_turn(), 1),
        _env(ContextAdded(role="user", content="turn"), 2),
        _env(_steer(), 5),
        _env(ContextAdded(role="user", content="steer"), 6),
    )
    assert state.open and state.problems_at(6) == ()
    assert state.manifest == manifest_of((*BASE.layers, *STEER))
    assert [x.version for x in state.manifest.layers] == ["e-1", "s-1", "v"]


def test_the_turn_settles_on_a_final_answer_that_saw_every_steer() -> None:
    opened = [_env(_turn(), 1), _env(ContextAdded(role="user", content="turn"), 2)]
    assert not _fold(*opened, _env(_answer(3), 4)).open
    assert _fold(*opened, _env(_answer(3, calls=True), 4)).open  # tools: the turn goes on
    assert _fold(*opened, _env(_answer(3), 4, actor="user")).open  # not the runtime's
    steered = [*opened, _env(_steer(), 4), _env(ContextAdded(role="user", content="steer"), 5)]
    assert _fold(*steered, _env(_answer(3), 6)).open  # request @3 did not see the steer
    assert not _fold(*steered, _env(_answer(7), 8)).open
    assert _fold(*steered, _env(_answer(7), 8)).manifest is None


def test_records_not_written_by_the_runtime_or_for_another_turn_count_for_nothing() -> None:
    assert _fold(_env(_turn(), 1, actor="user")).turn_at is None
    state = _fold(_env(_turn(), 1), _env(ContextAdded(role="user", content="turn"), 2))
    for record in (_env(_steer(turn_at=9), 3), _env(_steer(), 3, actor="http")):
        assert Turns.apply(state, record).manifest == BASE


def test_a_promised_item_that_does_not_follow_is_a_problem() -> None:
    missing = _fold(_env(_turn(), 1), _env(_answer(3, calls=True), 2))
    assert missing.problems and "no item at @2" in missing.problems[0]
    assert "no item at @2" in _fold(_env(_turn(), 1)).problems_at(2)[0]
    assert _fold(_env(_turn(), 1)).problems_at(1) == ()
    other = _fold(_env(_turn(), 1), _env(ContextAdded(role="user", content="forged"), 2))
    assert "not the envelope" in other.problems[0]
