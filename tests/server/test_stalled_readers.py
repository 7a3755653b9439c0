"""A reader that stops reading costs the server bounded memory, in a real ``contextfold
serve`` process: its live tails hold at most a page of the journal (``TAIL_BUFFER_BYTES``)
and the frame being sent, whatever is appended meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson

from tests.server.test_cli import Served

_STALLED = 10
_EVENT_BYTES = 1_000_000
_APPENDS = 40  # 40 MB in all
_BOUND_MB = 120


def _rss_mb(pid: int) -> float:
    """The resident memory of process ``pid`` in MiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def _stalled_tail(port: int) -> socket.socket:
    """A client that asks for a live tail and never reads a byte of it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel takes little
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET /v1/streams/s/tail HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return sock


def test_stalled_tails_keep_the_server_within_a_memory_bound(tmp_path: Path) -> None:
    served = Served(tmp_path, {})
    stalled: list[socket.socket] = []
    try:
        served.wait_ready()
        client = served.client
        first = {"events": [{"type": "note", "payload": {"text": "first"}}]}
        assert client.post("/v1/streams/s/events", json=first).status_code == 201
        big = {"events": [{"type": "note", "payload": {"text": "y" * (_EVENT_BYTES - 64)}}]}
        # What appending and reading large events costs with no reader stalled (the
        # allocator's high-water mark) is measured before the start: the bound is on what
        # stalled readers add.
        for _ in range(2):
            assert client.post("/v1/streams/warm/events", json=big).status_code == 201
        assert len(client.get("/v1/streams/warm/events").content) > 2 * _EVENT_BYTES
        start = peak = _rss_mb(served.child.pid)
        stalled = [_stalled_tail(served.port) for _ in range(_STALLED)]
        for _ in range(_APPENDS):
            assert client.post("/v1/streams/s/events", json=big).status_code == 201
            peak = max(peak, _rss_mb(served.child.pid))
        # A reader that reads gets every event while the stalled ones stay connected.
        positions: list[int] = []
        with client.stream("GET", "/v1/streams/s/tail") as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    positions.append(orjson.loads(line[6:])["position"])
                    if len(positions) == _APPENDS + 1:
                        break
        peak = max(peak, _rss_mb(served.child.pid))
        assert served.child.poll() is None
    finally:
        for sock in stalled:
            sock.close()
        output = served.close()
    assert positions == list(range(1, _APPENDS + 2))
    assert peak - start < _BOUND_MB, (
        f"{_STALLED} stalled tails and {_APPENDS * _EVENT_BYTES // 10**6} MB appended took the "
        f"server from {start:.0f} MiB to {peak:.0f} MiB\n{output[-2000:]}"
    )
