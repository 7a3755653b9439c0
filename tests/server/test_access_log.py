"""The token never reaches the access log: an EventSource (the inspector's live views) sends
it as ``?access_token=``, which ``contextfold serve`` logs with the value masked."""

from __future__ import annotations

import logging
from pathlib import Path

from contextfold.server.auth import AccessTokenRedaction, redact_access_token
from tests.server.test_cli import Served

_TOKEN = "s3cret-t0ken"


def test_serve_masks_the_access_token_in_its_access_log(tmp_path: Path) -> None:
    served = Served(tmp_path, {"CONTEXTFOLD_TOKEN": _TOKEN})
    try:
        served.wait_ready()
        client = served.client
        body = {"events": [{"type": "note", "payload": {"text": "hi"}}]}
        auth = {"Authorization": f"Bearer {_TOKEN}"}
        assert client.post("/v1/streams/s/events", json=body, headers=auth).status_code == 201
        for query in (f"access_token={_TOKEN}", f"after=&access%5Ftoken={_TOKEN}"):
            with client.stream("GET", f"/v1/streams/s/tail?{query}") as response:
                assert response.status_code == 200
                assert next(response.iter_lines()) == ": stream open"
        # Streamed: a server that wrongly accepted it would answer an endless tail.
        with client.stream("GET", f"/v1/streams/s/tail?access_token={_TOKEN}x") as wrong:
            assert wrong.status_code == 401
        assert client.get(f"/v1/streams?access_token={_TOKEN}").status_code == 401
        served.interrupt()
    finally:
        output = served.close()
    assert _TOKEN not in output, output
    assert '"GET /v1/streams/s/tail?access_token=*** HTTP/1.1" 200' in output, output
    assert '"GET /v1/streams/s/tail?after=&access%5Ftoken=*** HTTP/1.1" 200' in output, output
    assert '"GET /v1/streams?access_token=*** HTTP/1.1" 401' in output, output


def test_only_the_token_is_masked() -> None:
    assert redact_access_token("/v1/streams/s/tail") == "/v1/streams/s/tail"
    assert redact_access_token("/t?after=7&access_token=x&namespace=n&access_token") == (
        "/t?after=7&access_token=***&namespace=n&access_token=***"
    )
    assert redact_access_token("/t?access+token=x&my_access_token=y") == (
        "/t?access+token=x&my_access_token=y"
    )
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s" %d',
        ("127.0.0.1:1", "GET", "/t?access_token=x", 200), None,
    )  # fmt: skip
    assert AccessTokenRedaction().filter(record)
    assert record.getMessage() == '127.0.0.1:1 - "GET /t?access_token=***" 200'
