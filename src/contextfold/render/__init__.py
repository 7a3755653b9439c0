"""Rendering: provider-neutral requests, wire bodies, the session prefix, the turn envelope."""

__all__: list[str] = []
