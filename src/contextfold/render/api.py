"""Transitional: ``cf.render`` now lives with the context model (`contextfold.context.request`)."""

from __future__ import annotations

from ..context.request import render

__all__ = ["render"]
