"""The HTTP API's contract: ``/openapi.json`` documents every route, and schemathesis runs
it against ``contextfold serve`` on loopback (a real SQLite journal with an agent session
and a transcript), once with the external writer's token and once with a trusted writer's:
no server error, no undocumented status, every response as documented. Bounded: 30
examples per operation and token, a deadline per example, a total budget."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks
from starlette.routing import Route

import contextfold as cf
from contextfold.server import create_app
from contextfold.server.auth import PUBLIC_PATHS
from contextfold.server.body import DEFAULT_MAX_BODY_BYTES
from contextfold.server.openapi import OPENAPI_PATH, openapi_schema
from contextfold.transcript.parts import Message, TextPart
from contextfold.transcript.store.factory import open_transcript_store

TOKEN = "t0ken"
TRUSTED_TOKEN = "trusted-t0ken"
STREAM = "demo/chat"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRUSTED_AUTH = {"Authorization": f"Bearer {TRUSTED_TOKEN}"}
BUDGET_SECONDS = 300.0
"""The whole schemathesis run must end within this (each example has its own deadline)."""
VERSION = metadata.version("contextfold")
_SSE = r"/(tail|live)$"  # endless by design: their 200 is a stream that never ends


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _seed(url: str) -> int:
    """An agent session with a recorded request, and a transcript message in the same file;
    returns the request's offset."""

    async def run() -> int:
        async with cf.open_journal(url) as journal:
            await journal.append(STREAM, cf.system_prompt("Be brief."))
            await journal.append(STREAM, cf.ContextAdded(role="user", content="hello?"))
            agent = cf.Agent(journal, STREAM, cf.FunctionModel(lambda request: "hi"))
            offset = (await agent.run_until_idle()).requests[0]
        async with open_transcript_store(url) as store:
            message = Message(id="m1", session=STREAM, role="user", created="2025-01-01")
            part = TextPart(id="p1", session=STREAM, message_id="m1", text="hello?")
            await store.write(messages=[message], parts=[part])
        return offset

    return asyncio.run(run())


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The folder of a seeded journal (journal.db), and its recorded request's offset."""
    folder = tmp_path_factory.mktemp("openapi")
    return folder, _seed(f"sqlite:///{folder / 'journal.db'}")


@pytest.fixture(scope="module")
def served(seeded: tuple[Path, int]) -> Iterator[str]:
    """``contextfold serve`` with an external and a trusted token on a free loopback port;
    its base URL."""
    folder, _ = seeded
    url = f"sqlite:///{folder / 'journal.db'}"
    port = _free_port()
    log = (folder / "serve.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "contextfold", "serve", "--url", url, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "CONTEXTFOLD_TOKEN": TOKEN,
            "CONTEXTFOLD_TRUSTED_TOKEN": TRUSTED_TOKEN,
            "CONTEXTFOLD_URL": "",
        },
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(600):  # until it answers (slow machines import for a while)
                try:
                    client.get("/")
                    break
                except httpx.TransportError:
                    assert child.poll() is None, (folder / "serve.log").read_text()
                    time.sleep(0.05)
        yield base
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()
    output = (folder / "serve.log").read_text()
    assert "Traceback" not in output, output


@pytest.fixture(scope="module")
def deadline() -> float:
    """When the run's time budget ends (a monotonic clock time)."""
    return time.monotonic() + BUDGET_SECONDS


# The document ``contextfold serve --token`` serves (a test below checks it is), loaded at
# collection: schemathesis makes one test per operation of it.
DOCUMENT = openapi_schema(
    max_body_bytes=DEFAULT_MAX_BODY_BYTES, authenticated=True, namespaced=False, version=VERSION
)
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(path_regex=_SSE)

# Not the data-acceptance checks: JSON Schema cannot tell 5.0 from 5 (the body parser
# refuses a float where an int belongs), and a header value reaches the server as latin-1
# bytes with its edges stripped. Nor unsupported_method: a 405 also allows HEAD.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.ignored_auth,
]


def test_the_served_document_is_the_one_tested(served: str) -> None:
    response = httpx.get(served + OPENAPI_PATH, headers=AUTH, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == DOCUMENT


_BOUNDED = settings(
    max_examples=30,
    deadline=timedelta(seconds=10),
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
"""Each schemathesis run: 30 examples per operation, each within a deadline, reproducible."""


@schema.parametrize()
@_BOUNDED
def test_the_api_keeps_its_contract(case: Any, served: str, deadline: float) -> None:
    """As an external writer: what it may not append gets 400, as documented."""
    if time.monotonic() > deadline:
        pytest.fail(f"the schemathesis run took more than its budget of {BUDGET_SECONDS} s")
    case.call_and_validate(base_url=served, headers=AUTH, timeout=10, checks=CHECKS)


@schema.parametrize()
@_BOUNDED
def test_the_api_keeps_its_contract_for_a_trusted_writer(
    case: Any, served: str, deadline: float
) -> None:
    """As a trusted writer, whose appends of the runtime's events are stored."""
    if time.monotonic() > deadline:
        pytest.fail(f"the schemathesis run took more than its budget of {BUDGET_SECONDS} s")
    case.call_and_validate(base_url=served, headers=TRUSTED_AUTH, timeout=10, checks=CHECKS)


def test_real_data_is_answered_as_documented(served: str, seeded: tuple[Path, int]) -> None:
    """The seeded session through every read route (random names rarely hit one): each
    answer is a 200 of the documented shape, the transcript from the same database too."""
    _, offset = seeded
    reads: list[tuple[str, dict[str, Any]]] = [
        ("/v1/streams", {}),
        ("/v1/streams/{stream}/events", {"stream": STREAM}),
        ("/v1/streams/{stream}/context", {"stream": STREAM}),
        ("/v1/streams/{stream}/requests/{offset}", {"stream": STREAM, "offset": offset}),
        ("/v1/streams/{stream}/verify", {"stream": STREAM}),
        ("/v1/sessions/{session}/transcript", {"session": STREAM}),
    ]
    for path, parameters in reads:
        case = schema[path]["GET"].Case(path_parameters=parameters)
        response = case.call_and_validate(base_url=served, headers=AUTH, timeout=10, checks=CHECKS)
        assert response.status_code == 200, (path, response.text)
        if path.endswith("/verify"):
            assert response.json()["ok"] is True and response.json()["requests"] == 1
        if path.endswith("/transcript"):
            assert [m["message"]["id"] for m in response.json()["messages"]] == ["m1"]


def test_every_route_is_documented_with_its_body() -> None:
    """Every route of the app (but static HEADs) is a path of the document, with the same
    methods, and the events POST documents its fields and their limits."""

    async def routes() -> tuple[set[tuple[str, str]], dict[str, Any]]:
        async with cf.open_journal("memory://") as journal:
            app = create_app(journal, token=TOKEN)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://testserver"
            ) as client:
                document = (await client.get(OPENAPI_PATH, headers=AUTH)).json()
            found = set()
            for route in app.routes:
                assert isinstance(route, Route)
                path = route.path.replace(":path}", "}").replace(":int}", "}")
                found |= {
                    (path, method.lower()) for method in route.methods or () if method != "HEAD"
                }
            return found, document

    found, document = asyncio.run(routes())
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert found == documented
    post = document["paths"]["/v1/streams/{stream}/events"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/AppendRequest"}
    append = document["components"]["schemas"]["AppendRequest"]
    assert set(append["properties"]) == {
        "events",
        "expected_version",
        "idempotency_key",
        "run_id",
        "actor",
    }
    assert append["additionalProperties"] is False and append["required"] == ["events"]
    assert {"201", "200", "400", "401", "408", "409", "413", "415", "507"} <= set(post["responses"])


@pytest.mark.parametrize(
    ("authenticated", "namespaced"), [(False, False), (True, False), (False, True)]
)
def test_only_statuses_the_app_can_answer_are_documented(
    authenticated: bool, namespaced: bool
) -> None:
    document = openapi_schema(
        max_body_bytes=1000, authenticated=authenticated, namespaced=namespaced
    )
    for path, item in document["paths"].items():
        for operation in item.values():
            statuses = set(operation["responses"])
            public = path in PUBLIC_PATHS  # the inspector's files need no token
            assert ("401" in statuses) == (authenticated and not public)
            assert ("security" in operation) == (authenticated and not public)
            assert ("403" in statuses) == (namespaced and "parameters" in operation)
    assert "1000 bytes" in document["components"]["schemas"]["AppendRequest"]["description"]


async def test_the_documented_error_statuses_are_real(tmp_path: Path) -> None:
    """Each error status the document names for the stream routes, provoked for real: the
    JSON error shape every time."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    async with cf.open_journal(url) as journal:
        await journal.append("s", cf.RawEvent("note", {"i": 1}))
        app = create_app(journal, token=TOKEN, namespaces=["default"], max_body_bytes=200)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client:
            document = (await client.get(OPENAPI_PATH, headers=AUTH)).json()
            event = {"events": [{"type": "note", "payload": {}}]}
            provoked: dict[tuple[str, str, str], Callable[[], Awaitable[httpx.Response]]] = {
                ("get", "/v1/streams", "400"): lambda: client.get(
                    "/v1/streams", params={"page": "2"}, headers=AUTH
                ),
                ("get", "/v1/streams/{stream}/events", "404"): lambda: client.get(
                    "/v1/streams/nope/events", headers=AUTH
                ),
                ("get", "/v1/streams/{stream}/events", "400"): lambda: client.get(
                    "/v1/streams/s/events", params={"after": "zz"}, headers=AUTH
                ),
                ("get", "/v1/streams/{stream}/events", "401"): lambda: client.get(
                    "/v1/streams/s/events"
                ),
                ("get", "/v1/streams/{stream}/events", "403"): lambda: client.get(
                    "/v1/streams/s/events", headers={**AUTH, "X-Contextfold-Namespace": "other"}
                ),
                ("get", "/v1/streams/{stream}/requests/{offset}", "404"): lambda: client.get(
                    "/v1/streams/s/requests/1", headers=AUTH
                ),
                ("get", "/v1/streams/{stream}/verify", "404"): lambda: client.get(
                    "/v1/streams/nope/verify", headers=AUTH
                ),
                ("get", "/v1/streams/{stream}/context", "404"): lambda: client.get(
                    "/v1/streams/nope/context", headers=AUTH
                ),
                ("post", "/v1/streams/{stream}/events", "409"): lambda: client.post(
                    "/v1/streams/s/events", json={**event, "expected_version": 7}, headers=AUTH
                ),
                ("post", "/v1/streams/{stream}/events", "413"): lambda: client.post(
                    "/v1/streams/s/events",
                    json={"events": [{"type": "note", "payload": {"x": "y" * 300}}]},
                    headers=AUTH,
                ),
                ("post", "/v1/streams/{stream}/events", "415"): lambda: client.post(
                    "/v1/streams/s/events", content=b"{}", headers=AUTH
                ),
            }
            for (method, path, status), send in provoked.items():
                response = await send()
                assert str(response.status_code) == status, (path, response.text)
                assert status in document["paths"][path][method]["responses"]
                assert set(response.json()["error"]) == {"type", "message"}
