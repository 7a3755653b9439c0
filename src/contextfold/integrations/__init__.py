"""Adapters for the agent frameworks users already run, one module per framework.

Each module imports its framework when it is imported itself (never from here), so
``import contextfold`` needs none of them; a missing framework is a one-line ImportError
naming the extra to install.
"""

from __future__ import annotations

__all__: list[str] = []
