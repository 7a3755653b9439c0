"""Input encoding: every argument check of the journal, and events turned into stored bytes.

This is the one place arguments are checked. The journal calls these checks before anything
reaches a store, so a store receives only checked input (see :class:`~contextfold.store.Store`)
and every backend answers bad input alike, with the same error. The transcript store and the
server check names with the same functions: one length limit, one set of refused characters.

Every text that passes is valid Unicode (no lone surrogate: SQLite and PostgreSQL store
UTF-8), every limit within its bounds, every payload canonical JSON within its size limit.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

import orjson

from .. import canonical
from ..errors import InvalidCursorError, InvalidInputError, InvalidStreamNameError, PayloadError
from ..events import TYPE_NAME, Event, EventMeta, NewEvent, RawEvent
from ..store.base import MAX_LIMIT

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_BATCH",
    "MAX_META_CHARS",
    "MAX_NAME_LENGTH",
    "Clock",
    "IdFactory",
    "bounded_key",
    "check_batch",
    "check_channels",
    "check_cursor",
    "check_expected_version",
    "check_label",
    "check_limit",
    "check_max_payload_bytes",
    "check_meta",
    "check_name_characters",
    "check_namespace",
    "check_prefix",
    "check_stored_stream",
    "check_stream",
    "check_stream_cursor",
    "check_text",
    "check_types",
    "encode_events",
    "escape_hidden",
    "is_hidden_character",
    "shown_name",
    "utc_now",
]

DEFAULT_MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_BATCH = 10_000
"""The most events one append takes."""
MAX_NAME_LENGTH = 512
"""The longest stream name, namespace or transcript session name, in characters."""
MAX_META_CHARS = 200
"""Most characters of an append's ``idempotency_key``, ``run_id`` and ``actor``: they are
copied into every event of the append, so one small call must not write a large journal."""

Clock = Callable[[], datetime]
IdFactory = Callable[[], str]

_SURROGATE = re.compile("[\ud800-\udfff]")


def utc_now() -> datetime:
    """The journal's default clock: the current time in UTC."""
    return datetime.now(UTC)


def _surrogate_in(text: str) -> int | None:
    """Index of the first lone surrogate in ``text`` (None when it is valid Unicode)."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def check_text(name: str, value: str, error: type[InvalidInputError] = InvalidInputError) -> str:
    """Return ``value`` or raise ``error`` naming ``name`` when it holds a lone surrogate
    (text SQLite and PostgreSQL cannot store: they keep UTF-8)."""
    at = _surrogate_in(value)
    if at is not None:
        raise error(
            f"{name} {value[:80]!r} holds a lone surrogate ({value[at]!r}) at index {at}: "
            "it must be valid Unicode text (encodable as UTF-8); nothing was done"
        )
    return value


def check_stream(stream: object) -> str:
    """Return ``stream`` or raise InvalidStreamNameError saying what is wrong with it."""
    if not isinstance(stream, str):
        raise InvalidStreamNameError(f"stream name must be a str, got {type(stream).__name__}")
    if not stream or stream.strip() != stream:
        raise InvalidStreamNameError(
            f"stream name {stream!r} must be non-empty with no leading or trailing whitespace"
        )
    if len(stream) > MAX_NAME_LENGTH:
        raise InvalidStreamNameError(
            f"stream name {stream[:40]!r}… is {len(stream)} characters; the limit is "
            f"{MAX_NAME_LENGTH}"
        )
    return check_name_characters("stream name", stream, InvalidStreamNameError)


def check_stored_stream(stream: object, *, field: str = "stream name") -> str:
    """Return ``stream``, the name of a stream to read, fold, verify or delete (or a
    listing's cursor), or raise InvalidStreamNameError: a non-empty str of at most
    :data:`MAX_NAME_LENGTH` characters, valid Unicode. Unlike :func:`check_stream` (for the
    names written) it takes a name stored before names were checked for hidden characters,
    so such a stream can still be read and removed: what it refuses, the names written were
    always refused (surrounding whitespace, C0 controls and DEL)."""
    if not isinstance(stream, str) or not stream or len(stream) > MAX_NAME_LENGTH:
        raise InvalidStreamNameError(
            f"{field} must be a non-empty str of at most {MAX_NAME_LENGTH} characters (a "
            f"stream name), got {stream!r:.80}"
        )
    if stream.strip() != stream:
        raise InvalidStreamNameError(
            f"{field} {stream[:80]!r} must have no leading or trailing whitespace (a stream name)"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in stream):
        raise InvalidStreamNameError(f"{field} {stream[:80]!r} contains a control character")
    return check_text(field, stream, InvalidStreamNameError)


def check_stream_cursor(after: object) -> str:
    """Return ``after``, a listing's cursor, or raise InvalidStreamNameError: a str a stream
    name could be (see :func:`check_stored_stream`), so a listing can page past a name
    stored before names were checked for hidden characters."""
    return check_stored_stream(after, field="after")


def check_namespace(namespace: object) -> str:
    """Return ``namespace`` or raise InvalidInputError."""
    if not isinstance(namespace, str) or not namespace or len(namespace) > MAX_NAME_LENGTH:
        raise InvalidInputError(
            f"namespace must be a non-empty str of at most {MAX_NAME_LENGTH} characters, "
            f"got {namespace!r}"
        )
    return check_name_characters("namespace", namespace)


# Characters that show as nothing, or reorder the text around them: every control (Cc),
# format (Cf: bidi controls, zero-width characters, the soft hyphen, tag characters, the
# byte order mark), line and paragraph separator and surrogate code point, and the other
# default-ignorable code points (variation selectors, Hangul fillers, U+2065, the combining
# grapheme joiner), which Unicode asks a renderer to show as nothing.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_IGNORABLE = (
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # Hangul choseong and jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian free variation selectors and vowel separator
    (0x2065, 0x2065),  # unassigned, reserved as invisible
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0xFFF0, 0xFFF8),  # unassigned, reserved as invisible
    (0xE0000, 0xE0FFF),  # tag characters, variation selectors supplement, reserved
)


def is_hidden_character(char: str) -> bool:
    """Whether names may not hold ``char`` (see :func:`check_name_characters`)."""
    code = ord(char)
    return unicodedata.category(char) in _HIDDEN_CATEGORIES or any(
        start <= code <= end for start, end in _IGNORABLE
    )


def _hidden_at(text: str) -> int | None:
    """Index of the first character in ``text`` that :func:`is_hidden_character` (None if none)."""
    return next((at for at, char in enumerate(text) if is_hidden_character(char)), None)


def check_name_characters(
    what: str, name: str, error: type[InvalidInputError] = InvalidInputError
) -> str:
    """Return ``name`` (a stream, namespace or session name) or raise ``error`` naming
    ``what`` when it holds a control, format (bidi, zero-width, tag), separator or other
    default-ignorable character (variation selectors, Hangul fillers) or a lone surrogate.
    Such characters show as nothing or reorder the text around them, so one name could
    pass for another on a screen: the library, the transcript and the HTTP server refuse
    them with this one check."""
    if name.isascii() and name.isprintable():
        return name  # the usual name, checked in C
    at = _hidden_at(name)
    if at is not None:
        char = name[at]
        raise error(
            f"{what} {_escaped_repr(name[:80])} holds {_kind(char)}, U+{ord(char):04X}"
            f"{_named(char)}, at index {at}: a name must not hold control, format, bidi, "
            "zero-width or other invisible characters (they hide or reorder text, so one "
            "name could pass for another); nothing was done"
        )
    return name


def shown_name(name: str) -> str:
    """``name`` for a terminal: as it is when :func:`check_name_characters` would take it,
    else quoted with each such character escaped (``'a\\u202eb'``), so a name stored
    before the check (or by other means) cannot hide or reorder what is printed with it."""
    if name.isascii() and name.isprintable():
        return name
    return name if _hidden_at(name) is None else _escaped_repr(name)


def _escaped_repr(text: str) -> str:
    """``repr(text)`` with every hidden character escaped: repr escapes what Python deems
    unprintable, but leaves fillers and variation selectors as they are."""
    return "".join(
        (f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
        if is_hidden_character(char)
        else char
        for char in repr(text)
    )


def escape_hidden(json_text: str) -> str:
    """JSON text with every character :func:`check_name_characters` refuses written as a
    ``\\u`` escape: the same JSON value, safe to print on a terminal (orjson escapes only
    C0 controls, and only they may stand outside a JSON string)."""
    if json_text.isascii() and json_text.isprintable():
        return json_text
    return "".join(_escaped(char) if is_hidden_character(char) else char for char in json_text)


def _escaped(char: str) -> str:
    """``char`` as JSON ``\\u`` escapes (a surrogate pair beyond the BMP)."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def _named(char: str) -> str:
    name = unicodedata.name(char, "")
    return f" {name}" if name else ""


def _kind(char: str) -> str:
    """What a character :func:`is_hidden_character` takes is, for a message."""
    code, category = ord(char), unicodedata.category(char)
    if char in _BIDI:
        return "a bidi control"
    if char == "\ufeff":
        return "a byte order mark"
    if char in "\u2028\u2029":
        return "a line separator"
    if category == "Cc":
        return "a control character"
    if category == "Cs":
        return "a lone surrogate"
    if char in _ZERO_WIDTH:
        return "a zero-width character"
    if char == "\u00ad":
        return "a soft hyphen"
    if 0xE0000 <= code <= 0xE007F:
        return "a tag character"
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF or 0x180B <= code <= 0x180F:
        return "a variation selector"
    if char in "\u115f\u1160\u3164\uffa0":
        return "a Hangul filler"
    if category == "Cf":
        return "a format character"
    return "an invisible character"


_ZERO_WIDTH = frozenset("\u180e\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064")
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def check_label(
    name: str, value: object, *, empty: bool = True, optional: bool = True
) -> str | None:
    """Return ``value`` (a ``run_id``, ``actor`` or ``idempotency_key``; None allowed when
    ``optional``) or raise InvalidInputError naming ``name``: a str without NUL or lone
    surrogates, non-empty unless ``empty``."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or "\x00" in value or (not empty and not value):
        what = "a str without NUL characters" if empty else "a non-empty str without NUL"
        raise InvalidInputError(f"{name} must be {what}, got {value!r}")
    return check_text(name, value)


def check_meta(name: str, value: object, *, empty: bool = True) -> str | None:
    """Return ``value`` (an append's ``idempotency_key``, ``run_id`` or ``actor``; None
    allowed) or raise InvalidInputError naming ``name``: :func:`check_label`'s rules and
    at most :data:`MAX_META_CHARS` characters. The HTTP server checks its bodies with it."""
    if isinstance(value, str) and len(value) > MAX_META_CHARS:
        raise InvalidInputError(
            f"{name} is {len(value)} characters, over the limit of {MAX_META_CHARS}: "
            "it is stored with every event of the append"
        )
    return check_label(name, value, empty=empty)


def bounded_key(key: str) -> str:
    """``key`` as an idempotency key within :data:`MAX_META_CHARS`: itself when it fits,
    else ``sha256:`` and its SHA-256 (one key names one value either way)."""
    if len(key) <= MAX_META_CHARS:
        return key
    return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def check_channels(channels: Iterable[object]) -> tuple[str, ...]:
    """Return ``channels`` as a tuple or raise InvalidInputError naming the bad channel:
    each a non-empty str without control characters or lone surrogates."""
    checked: list[str] = []
    for index, ch in enumerate(channels):
        if not isinstance(ch, str) or not ch or any(ord(c) < 32 for c in ch):
            raise InvalidInputError(
                f"channel {ch!r} (channels[{index}]) must be a non-empty str without "
                "control characters"
            )
        checked.append(check_text(f"channels[{index}]", ch))
    return tuple(checked)


def check_prefix(prefix: object) -> str | None:
    """Return ``prefix`` (a stream-name prefix; None for all) or raise InvalidInputError."""
    if prefix is None:
        return None
    if not isinstance(prefix, str):
        raise InvalidInputError(f"prefix must be a str, got {type(prefix).__name__}")
    return check_text("prefix", prefix)


def check_limit(value: object, *, name: str = "limit", maximum: int = MAX_LIMIT) -> int:
    """Return ``value`` or raise InvalidInputError naming ``name`` and its bounds: an int
    from 1 to ``maximum`` (a bool is no int here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidInputError(f"{name} must be an int from 1 to {maximum}, got {value!r}")
    return value


def check_cursor(name: str, cursor: object, *, optional: bool = True) -> str | None:
    """Return ``cursor`` (None allowed when ``optional``) or raise InvalidCursorError naming
    ``name``.

    Only its type is checked: a str no store handed out is an unknown cursor, which reads
    answer with a reset, never an error.
    """
    if not isinstance(cursor, str) and (cursor is not None or not optional):
        raise InvalidCursorError(f"{name} must be a str from a previous read, got {cursor!r}")
    return cursor


def check_expected_version(value: object) -> int | None:
    """Return ``value`` (None: no expectation) or raise InvalidInputError: an int >= 0."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise InvalidInputError(f"expected_version must be an int >= 0, got {value!r}")
    return value


def check_max_payload_bytes(value: object) -> int:
    """Return ``value`` or raise InvalidInputError: a positive int."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidInputError(f"max_payload_bytes must be a positive int, got {value!r}")
    return value


_ONE_EVENT = (Event, RawEvent, NewEvent)


def check_batch(
    stream: str, events: Event | RawEvent | NewEvent | Iterable[Event | RawEvent | NewEvent]
) -> list[Event | RawEvent | NewEvent]:
    """The events of one append as a list (one event alone is a batch of one). Raises
    InvalidInputError for an empty batch or one over :data:`MAX_BATCH`."""
    # A NewEvent is a tuple: iterated, it would be taken for a batch of its fields.
    batch: list[Event | RawEvent | NewEvent] = (
        [events] if isinstance(events, _ONE_EVENT) else list(events)
    )
    if not batch:
        raise InvalidInputError(f"append to {stream!r} got no events")
    if len(batch) > MAX_BATCH:
        raise InvalidInputError(
            f"append to {stream!r} got {len(batch)} events; the limit is {MAX_BATCH}"
        )
    return batch


def check_types(types: Sequence[str | type[Event]] | None) -> tuple[str, ...] | None:
    """The type names to filter by (None: every type). Raises InvalidInputError naming the
    entry that is neither a type name nor an Event class with one."""
    if types is None:
        return None
    names = []
    for index, t in enumerate(types):
        if isinstance(t, str):
            names.append(check_text(f"types[{index}]", t))
        elif isinstance(t, type) and issubclass(t, Event) and t.event_type:
            names.append(t.event_type)
        else:
            raise InvalidInputError(f"types must hold type names or Event classes, got {t!r}")
    return tuple(names)


def encode_events(
    events: Iterable[Event | RawEvent | NewEvent],
    *,
    clock: Clock,
    ids: IdFactory,
    max_payload_bytes: int,
    run_id: str | None = None,
    actor: str | None = None,
    channels: Sequence[str] = (),
    idempotency_key: str | None = None,
) -> list[NewEvent]:
    """Events encoded for storage: canonical JSON, one time from ``clock`` for the batch and
    an id from ``ids`` for each event.

    A :class:`NewEvent` (encoded earlier, ``Journal.encode``) is taken as it is, its own
    meta included (but for this append's idempotency key), once checked like the others;
    a batch of only such events reads no clock.

    Raises InvalidInputError naming the label, channel or ``events[i]`` at fault (a bad
    type name, a non-event, an id no store could keep) and PayloadError for a payload that
    is not JSON or is over ``max_payload_bytes``.
    """
    # None needs no check: one call less each for the usual labels.
    if run_id is not None:
        check_meta("run_id", run_id)
    if actor is not None:
        check_meta("actor", actor)
    if idempotency_key is not None:
        check_meta("idempotency_key", idempotency_key, empty=False)
    chans = check_channels(channels)
    time: str | None = None
    prepared: list[NewEvent] = []
    for index, event in enumerate(events):
        # Made here: checked already, but for the size (another journal's limit may be higher).
        if type(event) is _Encoded and len(event.data) <= max_payload_bytes:
            if event.meta.idempotency_key != idempotency_key:
                event = _rekeyed(event, idempotency_key)
            prepared.append(event)
            continue
        if isinstance(event, NewEvent):
            prepared.append(_encoded(index, event, max_payload_bytes, idempotency_key))
            continue
        if time is None:  # one reading for the batch, as it encodes its first event
            time = clock().isoformat()
        if type(event) is RawEvent:
            type_name = event.type
            if not isinstance(type_name, str) or not TYPE_NAME.match(type_name):
                raise InvalidInputError(
                    f"events[{index}]: raw event type {type_name!r} must be 1-200 characters "
                    "of letters, digits and . _ : / @ + -, starting with a letter or digit"
                )
            value = event.payload
        elif isinstance(event, Event):
            type_name = type(event).event_type
            if not type_name:
                raise InvalidInputError(
                    f"events[{index}]: {type(event).__qualname__} has no type name; "
                    'define it as class X(cf.Event, type="x")'
                )
            value = event.model_dump(mode="json")
        else:
            raise InvalidInputError(
                f"events[{index}] is a {type(event).__name__}: append takes cf.Event "
                "instances or cf.RawEvent"
            )
        try:
            data: bytes | None = orjson.dumps(value)
        except TypeError:
            data = None  # the checked encoder below names the field at fault
        # orjson writes NaN and infinity as null: a payload with a null is walked for them.
        if data is None or (b"null" in data and not canonical.is_plain_json(value)):
            try:
                data = canonical.encode_checked(
                    value, where=f"events[{index}] ({type_name}) payload"
                )
            except ValueError as exc:
                raise PayloadError(str(exc)) from exc
        if len(data) > max_payload_bytes:
            raise PayloadError(
                f"events[{index}] ({type_name}): payload is {len(data)} bytes, over the "
                f"limit of {max_payload_bytes}; store large content elsewhere and "
                "reference it, or raise max_payload_bytes"
            )
        event_id = ids()
        # An ASCII id (the usual case) costs three cheap tests; anything else the full check.
        if not (type(event_id) is str and event_id and event_id.isascii()) or "\x00" in event_id:
            check_label(
                f"events[{index}]: the id from ids()", event_id, empty=False, optional=False
            )
        meta = EventMeta(event_id, time, run_id, actor, idempotency_key, chans)
        prepared.append(_Encoded(type_name, data, meta))
    return prepared


class _Encoded(NewEvent):
    """A :class:`NewEvent` :func:`encode_events` made: an append takes it unchecked."""

    __slots__ = ()


def _rekeyed(event: NewEvent, idempotency_key: str | None) -> NewEvent:
    return _Encoded(event.type, event.data, event.meta._replace(idempotency_key=idempotency_key))


def _encoded(
    index: int, event: NewEvent, max_payload_bytes: int, idempotency_key: str | None
) -> NewEvent:
    """An event encoded earlier, checked as :func:`encode_events` checks what it encodes,
    with ``idempotency_key`` (the append's) in its meta. Raises as :func:`encode_events`."""
    type_name, data, meta = event.type, event.data, event.meta
    where = f"events[{index}]"
    if not isinstance(type_name, str) or not TYPE_NAME.match(type_name):
        raise InvalidInputError(f"{where}: encoded event type {type_name!r} is not a type name")
    if type(meta) is not EventMeta:
        raise InvalidInputError(f"{where} ({type_name}): meta must be an EventMeta")
    if not isinstance(data, bytes):
        raise PayloadError(f"{where} ({type_name}): an encoded payload must be JSON bytes")
    if len(data) > max_payload_bytes:
        raise PayloadError(
            f"{where} ({type_name}): payload is {len(data)} bytes, over the limit of "
            f"{max_payload_bytes}; store large content elsewhere and reference it, or raise "
            "max_payload_bytes"
        )
    try:
        orjson.loads(data)  # refuses NaN, lone surrogates and anything else not JSON
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"{where} ({type_name}): payload is not JSON: {exc}") from exc
    check_label(f"{where}: meta.event_id", meta.event_id, empty=False, optional=False)
    check_label(f"{where}: meta.time", meta.time, empty=False, optional=False)
    check_meta(f"{where}: meta.run_id", meta.run_id)
    check_meta(f"{where}: meta.actor", meta.actor)
    channels = check_channels(meta.channels)
    return NewEvent(
        type_name, data, meta._replace(idempotency_key=idempotency_key, channels=channels)
    )
