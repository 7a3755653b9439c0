"""A framework's own source (its tests with it) at exactly the installed version: the sdist
from PyPI, checked against the index's SHA-256 and unpacked once per version into the user's
cache (``$XDG_CACHE_HOME/contextfold/framework-sources/<distribution>-<version>``), so the
suites that run a framework's tests against our adapters download nothing after the first run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

__all__ = ["RegistryUnreachableError", "framework_source", "in_ci", "source_or_skip"]

INDEX = os.environ.get("CONTEXTFOLD_PYPI_SIMPLE", "https://pypi.org/simple").rstrip("/")
_TIMEOUT = 60


class RegistryUnreachableError(Exception):
    """The package index could not be reached (no network, a proxy refusing it)."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "contextfold" / "framework-sources"


def _get(url: str, accept: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise RegistryUnreachableError(f"{url}: {exc}") from exc


def _sdist(distribution: str, version: str) -> tuple[str, str, str]:
    """(file name, URL, SHA-256) of the sdist of ``distribution`` at ``version``."""
    project = re.sub(r"[-_.]+", "-", distribution).lower()
    index = json.loads(
        _get(f"{INDEX}/{project}/", "application/vnd.pypi.simple.v1+json").decode("utf-8")
    )
    stem = f"{re.sub(r'[-_.]+', '_', distribution).lower()}-{version}"
    for file in index["files"]:
        name = str(file["filename"])
        if name.lower() in (f"{stem}.tar.gz", f"{stem.replace('_', '-')}.tar.gz"):
            return name, str(file["url"]), str(file["hashes"]["sha256"])
    raise LookupError(f"{distribution} {version} has no sdist on {INDEX}")


def framework_source(distribution: str, members: Sequence[str]) -> Path:
    """The unpacked sdist of the installed ``distribution``: only the top-level ``members``
    (``"tests"``, ``"pyproject.toml"``). Raises RegistryUnreachableError without network,
    LookupError when the version has no sdist, ValueError when the download's hash differs.
    """
    version = importlib.metadata.version(distribution)
    target = _cache_root() / f"{distribution}-{version}"
    if (target / ".complete").exists():
        return target
    name, url, sha256 = _sdist(distribution, version)
    data = _get(url, "application/octet-stream")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{name}: the download does not match the index's SHA-256")
    target.parent.mkdir(parents=True, exist_ok=True)
    unpacking = Path(tempfile.mkdtemp(prefix=f".{distribution}-", dir=target.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            wanted = []
            for member in archive.getmembers():
                parts = Path(member.name).parts
                if len(parts) > 1 and parts[1] in members:
                    member.name = str(Path(*parts[1:]))  # without the sdist's top folder
                    wanted.append(member)
            archive.extractall(unpacking, members=wanted, filter="data")
        (unpacking / ".complete").write_text(f"{name} sha256:{sha256}\n")
        try:
            unpacking.rename(target)
        except OSError:  # another run unpacked it meanwhile
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(unpacking, ignore_errors=True)
    return target


def source_or_skip(distribution: str, members: Sequence[str]) -> Path:
    """:func:`framework_source`, skipping the test when the index is unreachable (failing
    it under ``CI=true``: CI has the registry)."""
    try:
        return framework_source(distribution, members)
    except RegistryUnreachableError as exc:
        reason = f"the package index is unreachable, so {distribution}'s tests are not here: {exc}"
        if in_ci():
            pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)", pytrace=False)
        pytest.skip(reason)
