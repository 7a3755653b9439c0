"""The context manifest: what one compiled turn put in front of the model, layer by layer.

The shape is Buzz's (its agent context compiler), so manifests are interchangeable with
its: ``{"schemaVersion": 1, "hash": "sha256:…", "layers": [...]}``, each layer with, in
this order, ``order``, ``layer``, ``scope``, ``source``, ``version``, ``authority``,
``freshness``, ``estimatedTokens`` and ``truncated``. ``hash`` is ``"sha256:"`` and the hex
SHA-256 of the compact JSON of the layer array, layers stably sorted by ``order``.

It lives with the context model, not the renderer, because a request records its
manifest and the context's rebuild checks it (``rebuild.verify_requests``); the envelope
compiler (``render.envelope``) makes the layers. Everything here is pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "SCHEMA_VERSION",
    "Manifest",
    "ManifestLayer",
    "content_version",
    "estimate_tokens",
    "layers_json",
    "manifest_of",
]

SCHEMA_VERSION = 1
"""The manifest schema version Buzz emits."""

_DIGEST = "sha256:"


def estimate_tokens(content: str) -> int:
    """Buzz's tokenizer-free estimate: one token per four Unicode scalars, rounded up."""
    return (len(content) + 3) // 4


def content_version(content: str) -> str:
    """``"sha256:"`` and the hex SHA-256 of the UTF-8 content: a layer's version when no
    signed source event names it."""
    return _DIGEST + hashlib.sha256(content.encode()).hexdigest()


class _Buzz(BaseModel):
    # Buzz's JSON names (camelCase) on the wire and in the journal; Python names in code.
    model_config = ConfigDict(
        frozen=True, extra="forbid", serialize_by_alias=True, validate_by_name=True
    )


class ManifestLayer(_Buzz):
    """One present layer: where it sits, what it is, its version and its size.

    Field order is the serialized order (Buzz's), so the hash matches Buzz's for the same
    layers. Raises a ValidationError naming the field for an empty name or a bad number.
    """

    order: int = Field(ge=0, le=255)
    """Canonical position (0-255); layers sort stably by it."""
    layer: str = Field(min_length=1)
    """The layer's name (``current_instruction``, or one of the user's own)."""
    scope: str = Field(min_length=1)
    """What it is about: ``runtime``, ``channel``, ``thread``, ``turn``, …"""
    source: str = Field(min_length=1)
    """Where its content came from: ``base_prompt``, ``relay_events``, …"""
    version: str = Field(min_length=1)
    """The signed source event id when there is one, else the content's ``sha256:…``."""
    authority: str = Field(min_length=1)
    """How far the model should trust it: ``authoritative``, ``instructions``, ``evidence``, …"""
    freshness: str = Field(min_length=1)
    """When it was taken: ``current``, ``cached`` (resolver metadata), ``session_start``, …"""
    estimated_tokens: int = Field(ge=0, alias="estimatedTokens")
    """:func:`estimate_tokens` of the layer's content."""
    truncated: bool = False
    """Whether the content was cut (a long description, a bounded thread read)."""


def layers_json(layers: Iterable[ManifestLayer]) -> bytes:
    """The compact JSON array the hash covers: fields in Buzz's order, non-ASCII as UTF-8."""
    return orjson.dumps([layer.model_dump(mode="json") for layer in layers])


class Manifest(_Buzz):
    """A manifest: the ordered layers of one turn (and its accepted steers) and their hash.

    Build it with :func:`manifest_of`; a Manifest whose hash does not match its layers is
    refused (a ValidationError), so a stored one cannot be edited into another.
    """

    schema_version: Literal[1] = Field(default=1, alias="schemaVersion")
    hash: str
    layers: tuple[ManifestLayer, ...] = ()

    @field_validator("layers")
    @classmethod
    def _ordered(cls, value: tuple[ManifestLayer, ...]) -> tuple[ManifestLayer, ...]:
        orders = [layer.order for layer in value]
        if orders != sorted(orders):
            raise ValueError(f"manifest layers must be sorted by order, got orders {orders}")
        return value

    @model_validator(mode="after")
    def _hashed(self) -> Manifest:
        expected = _hash(self.layers)
        if self.hash != expected:
            raise ValueError(
                f"manifest hash {self.hash!r} does not match its layers ({expected!r}); "
                "build manifests with manifest_of(layers)"
            )
        return self

    def to_json(self) -> bytes:
        """Buzz's JSON of the manifest (``schemaVersion``, ``hash``, ``layers``), compact."""
        return orjson.dumps(self.model_dump(mode="json"))


def _hash(layers: Iterable[ManifestLayer]) -> str:
    return _DIGEST + hashlib.sha256(layers_json(layers)).hexdigest()


def manifest_of(layers: Iterable[ManifestLayer]) -> Manifest:
    """The manifest of ``layers``: stably sorted by order (equal orders keep their order)
    and hashed. Accepted steers are added by passing the turn's layers then theirs."""
    ordered = tuple(sorted(layers, key=lambda layer: layer.order))
    return Manifest(hash=_hash(ordered), layers=ordered)
