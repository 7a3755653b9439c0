"""Rendering: provider wire bodies, session prefix and the turn envelope."""
