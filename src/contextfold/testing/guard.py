"""A guard that keeps tests off real model providers.

While a :class:`ProviderGuard` is on, every HTTP request made through httpx (or ``httpx2``,
the fork the ``openai`` and ``anthropic`` SDKs send with) to a host that is not loopback is
refused before anything is sent, and the provider keys and base URLs are taken out of the
environment (so code choosing a provider from them, the demo included, picks the local
model). Requests to ``127.0.0.1``, ``::1`` and ``localhost`` go through: a loopback server
stands in for a provider. An SDK may turn the refusal into its own connection error; the
guard remembers every refused URL, and :meth:`ProviderGuard.check` (called by the pytest
plugin after each test) fails the test on any.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import ProviderBlockedError

__all__ = [
    "HTTP_CLIENTS",
    "PROVIDER_ENVIRONMENT",
    "ProviderGuard",
    "is_loopback",
    "no_real_providers",
    "transports",
]

PROVIDER_ENVIRONMENT = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
)
"""The variables the guard takes out of the environment while it is on."""

HTTP_CLIENTS = ("httpx", "httpx2")
"""The HTTP client packages whose network transports the guard patches (those installed)."""

_LOCK = threading.Lock()
_ACTIVE: list[ProviderGuard] = []
_ORIGINALS: list[tuple[type, str, Callable[..., Any]]] = []


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _refuse_unless_loopback(request: Any) -> None:
    if is_loopback(request.url.host):
        return
    url = str(request.url.copy_with(query=None))
    with _LOCK:
        if _ACTIVE:  # the innermost guard answers for it: a test of refusals nests its own
            _ACTIVE[-1].refused.append(url)
    raise ProviderBlockedError(
        f"a test tried to reach {url}: real model providers are blocked under "
        "contextfold.testing's guard; use FunctionModel or LocalModel, or a loopback server",
        url=url,
    )


def _guarded_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    def handle_request(self: Any, request: Any) -> Any:
        _refuse_unless_loopback(request)
        return original(self, request)

    return handle_request


def _guarded_async(original: Callable[..., Any]) -> Callable[..., Any]:
    async def handle_async_request(self: Any, request: Any) -> Any:
        _refuse_unless_loopback(request)
        return await original(self, request)

    return handle_async_request


def transports() -> list[tuple[type, str]]:
    """The network transports (class, method) of the installed :data:`HTTP_CLIENTS`."""
    found: list[tuple[type, str]] = []
    for name in HTTP_CLIENTS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found += [(module.HTTPTransport, "handle_request")]
        found += [(module.AsyncHTTPTransport, "handle_async_request")]
    return found


def _patch() -> None:
    for cls, method in transports():
        original = getattr(cls, method)
        wrap = _guarded_async if method == "handle_async_request" else _guarded_sync
        _ORIGINALS.append((cls, method, original))
        setattr(cls, method, wrap(original))


def _unpatch() -> None:
    while _ORIGINALS:
        cls, method, original = _ORIGINALS.pop()
        setattr(cls, method, original)


class ProviderGuard:
    """Refuses non-loopback HTTP while on (``with ProviderGuard() as guard``).

    Guards nest: the transports are patched while at least one is on, and a refusal is
    recorded in ``refused`` of the innermost (the one entered last), so a test that checks
    refusals with its own guard leaves the plugin's clean.
    """

    def __init__(self) -> None:
        self.refused: list[str] = []
        self._environment: dict[str, str] = {}

    def __enter__(self) -> ProviderGuard:
        with _LOCK:
            if not _ACTIVE:
                _patch()
            _ACTIVE.append(self)
        self._environment = {
            name: os.environ.pop(name) for name in PROVIDER_ENVIRONMENT if name in os.environ
        }
        return self

    def __exit__(self, *exc: object) -> None:
        for name in PROVIDER_ENVIRONMENT:
            os.environ.pop(name, None)
        os.environ.update(self._environment)
        with _LOCK:
            _ACTIVE.remove(self)
            if not _ACTIVE:
                _unpatch()

    def check(self) -> None:
        """Raise ProviderBlockedError naming the first refused URL, if any was refused (even
        when the code under test caught the refusal)."""
        if self.refused:
            raise ProviderBlockedError(
                f"{len(self.refused)} request(s) tried to reach a real model provider, the "
                f"first {self.refused[0]}; use FunctionModel or LocalModel in tests",
                url=self.refused[0],
            )


@contextmanager
def no_real_providers() -> Iterator[ProviderGuard]:
    """A :class:`ProviderGuard` that also fails on leaving when a request was refused."""
    with ProviderGuard() as guard:
        yield guard
    guard.check()
