"""Worked examples, shipped as documented, typed code that users' own tests can import.

- :mod:`contextfold.examples.coding_assistant`: a coding assistant on a segmented fold
  (prompts, model steps with their tool results, answers), its chat view, a rendering for
  chat APIs that answers every tool call, and summaries written in chunks.

Importing this package imports no example: each registers its event types on import, so
import the one you use.
"""

__all__: list[str] = []
