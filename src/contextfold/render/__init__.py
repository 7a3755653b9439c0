"""Rendering: one module per provider (request body, response and stream parsing, usage),
the session prefix and the turn envelope.

Importing this package registers the built-in renderers with `contextfold.wire`, where
`wire.render_request` finds them by transport (``import contextfold`` does it).
"""

from ..wire import register_renderer
from . import anthropic, openai_chat, openai_responses

__all__: list[str] = []

register_renderer("openai-chat", openai_chat.render_openai_chat)
register_renderer("openai-responses", openai_responses.render_openai_responses)
register_renderer("anthropic", anthropic.render_anthropic)
