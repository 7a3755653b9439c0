"""Files attached to context items, as a request shows them.

Every file is named in its item's text by one line after the content, as iterate renders
attachments: ``[File attached: cat.png (image/png)]`` (the name, else the URI; the media
type when known). An image also goes out as the transport's image part when the item is
sent as a user message and its bytes are reachable: a ``data:`` URI with base64 data, or
an ``http(s)`` URL, of one of :data:`~contextfold.wire.IMAGE_MEDIA_TYPES`. Anything else
(another scheme, another type, a malformed data URI) is named only.

Inline data is content, not a reference: a ``data:`` URI is left out of the header's
``files=[...]``, which lists the files attached by reference. All pure.
"""

from __future__ import annotations

import re

from ..wire import IMAGE_MEDIA_TYPES, ImagePart
from .events import FileAttachment

__all__ = ["ATTACHED", "attachment_line", "file_references", "image_part", "media_type_of"]

ATTACHED = "[File attached: "
"""Start of the line that names one attached file in its item's text."""

_DATA_URI = re.compile(r"data:([a-z0-9.+-]+/[a-z0-9.+-]+)((?:;[^;,]*)*),(.*)", re.I | re.S)
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_URL = re.compile(r"https?://[^\s]+", re.I)
# What would break the line or read as another line; names come from any writer.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def _data_uri(uri: str) -> tuple[str, bool, str] | None:
    """Media type, whether base64, and payload of a ``data:`` URI; None for any other."""
    found = _DATA_URI.fullmatch(uri)
    if found is None:
        return None
    params = found.group(2).lower().split(";")
    return found.group(1).lower(), "base64" in params, found.group(3)


def media_type_of(file: FileAttachment) -> str | None:
    """The file's media type: as given, else the one its ``data:`` URI names."""
    if file.media_type:
        return file.media_type
    inline = _data_uri(file.uri)
    return inline[0] if inline is not None else None


def attachment_line(file: FileAttachment) -> str:
    """The one line naming ``file`` in its item's text: ``[File attached: name (type)]``."""
    inline = file.uri[:5].lower() == "data:"
    label = file.name or ("inline data" if inline else file.uri)
    media = media_type_of(file)
    shown = _UNSAFE.sub(" ", label if media is None else f"{label} ({media})")
    return f"{ATTACHED}{shown}]"


def file_references(files: tuple[FileAttachment, ...]) -> tuple[str, ...]:
    """The URIs the header lists as ``files=[...]``: every file but inline ``data:`` ones."""
    return tuple(file.uri for file in files if file.uri[:5].lower() != "data:")


def image_part(file: FileAttachment) -> ImagePart | None:
    """The image part ``file`` is sent as, or None when it is no image a transport can take
    (another type, no reachable bytes, a data URI that is not base64)."""
    inline = _data_uri(file.uri)
    if inline is not None:
        media, base64, payload = inline
        if media not in IMAGE_MEDIA_TYPES or not base64 or not payload:
            return None
        if _BASE64.fullmatch(payload) is None:
            return None
        return ImagePart(media_type=media, data=payload)
    media = (file.media_type or "").lower()
    if media in IMAGE_MEDIA_TYPES and _URL.fullmatch(file.uri) is not None:
        return ImagePart(media_type=media, url=file.uri)
    return None
