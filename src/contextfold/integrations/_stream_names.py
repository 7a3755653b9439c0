"""Stream names made of a framework's ids (an ADK app, user and session, an OpenAI Agents
session): each id becomes one part of the name, whatever it holds."""

from __future__ import annotations

from ..journal.encode import is_hidden_character

__all__ = ["stream_part"]


def stream_part(part: str) -> str:
    """``part`` with ``%``, ``/``, whitespace, unprintable characters and those stream names
    may not hold (invisible ones such as variation selectors and fillers) percent-escaped
    (UTF-8 bytes, ``%2F``): one part of a stream name, and distinct ids give distinct parts."""
    return "".join(
        ch
        if ch.isprintable() and not ch.isspace() and ch not in "%/" and not is_hidden_character(ch)
        else "".join(f"%{byte:02X}" for byte in ch.encode())
        for ch in part
    )
