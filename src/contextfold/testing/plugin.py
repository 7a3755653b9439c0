"""The pytest plugin of ``contextfold.testing``: no test reaches a real model provider.

Enable it in a ``conftest.py`` with ``pytest_plugins = ["contextfold.testing.plugin"]``.
Every test then runs under a :class:`~contextfold.testing.guard.ProviderGuard` and fails
when it tried to reach a provider, even if the code under test swallowed the refusal.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .guard import ProviderGuard

__all__ = ["provider_guard"]


@pytest.fixture(autouse=True)
def provider_guard() -> Iterator[ProviderGuard]:
    """The guard of the running test (autouse): its ``refused`` URLs, if a test wants them."""
    with ProviderGuard() as guard:
        yield guard
    if guard.refused:
        pytest.fail(
            f"the test tried to reach a real model provider: {', '.join(guard.refused)} "
            "(use contextfold.testing's FunctionModel or LocalModel, or a loopback server)",
            pytrace=False,
        )
