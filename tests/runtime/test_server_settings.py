"""What a model client assumes about the server it talks to: the vendor's own API keeps the
time tail and the developer role; any other server (llama.cpp, vLLM, Ollama) gets the date
clock and system roles unless told otherwise; a model contextfold's table does not know takes
its context window from the client's option, else from what the server reports."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from contextfold.errors import ConfigurationError, InvalidInputError
from contextfold.runtime.clients import (
    AnthropicModel,
    FunctionModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    clock_of,
    context_window_of,
)


@contextmanager
def serving(pages: dict[str, Any]) -> Iterator[str]:
    """A loopback server answering GET ``path`` with the JSON in ``pages`` (404 otherwise);
    yields its root URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = pages.get(self.path)
            body = json.dumps(page).encode() if page is not None else b"{}"
            self.send_response(200 if page is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_vendors_own_api_keeps_the_tail_and_the_developer_role() -> None:
    openai = OpenAIChatModel("gpt-4o", api_key="k")
    anthropic = AnthropicModel("claude-haiku-4-5", api_key="k")
    assert clock_of(openai) == "tail" and openai.developer_role is None
    assert clock_of(anthropic) == "tail"


@pytest.mark.parametrize("cls", [OpenAIChatModel, OpenAIResponsesModel])
def test_another_server_gets_the_date_and_no_developer_role(cls: type[Any]) -> None:
    model = cls("local", base_url="http://127.0.0.1:8080/v1", api_key="k")
    assert clock_of(model) == "date" and model.developer_role is False
    told = cls("local", base_url="http://127.0.0.1:8080/v1", api_key="k", clock="tail")
    assert clock_of(told) == "tail"
    anthropic = AnthropicModel("local", base_url="http://127.0.0.1:8080", api_key="k")
    assert clock_of(anthropic) == "date"


def test_a_clock_that_is_not_one_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="clock must be 'tail', 'date' or None"):
        OpenAIChatModel("gpt-4o", api_key="k", clock="noon")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="clock"):
        FunctionModel(lambda request: "ok", clock="tails")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="context_window"):
        OpenAIChatModel("gpt-4o", api_key="k", context_window=0)


async def test_the_window_is_the_options_then_the_tables_then_the_servers() -> None:
    assert await context_window_of(FunctionModel(lambda request: "ok")) == (None, "default")
    given = OpenAIChatModel(
        "local", base_url="http://127.0.0.1:1/v1", api_key="k", context_window=5
    )
    assert await context_window_of(given) == (5, "option")
    known = OpenAIChatModel("gpt-4o", base_url="http://127.0.0.1:1/v1", api_key="k")
    assert await context_window_of(known) == (None, "table")
    llama = {"/props": {"default_generation_settings": {"n_ctx": 8192}}}
    with serving(llama) as root:
        model = OpenAIChatModel("smol", base_url=f"{root}/v1", api_key="k")
        assert await context_window_of(model) == (8192, "server")
        await model.client.close()


async def test_a_model_list_gives_the_window_of_the_model_asked_for() -> None:
    vllm = {
        "/v1/models": {
            "data": [
                {"id": "other", "max_model_len": 4096},
                {"id": "mine", "max_model_len": 32768},
            ]
        }
    }
    with serving(vllm) as root:
        model = OpenAIChatModel("mine", base_url=f"{root}/v1", api_key="k")
        assert await model.server_context_window() == 32768
        await model.client.close()


async def test_a_server_that_reports_no_window_is_said_once(caplog: Any) -> None:
    with serving({"/v1/models": {"data": [{"id": "a"}, {"id": "b"}]}}) as root:
        model = OpenAIChatModel("mine", base_url=f"{root}/v1", api_key="k")
        assert await context_window_of(model) == (None, "unreported")
        assert await model.server_context_window() is None  # asked once, kept
        await model.client.close()
    closed = OpenAIChatModel("mine", base_url="http://127.0.0.1:9/v1", api_key="k")
    with caplog.at_level("INFO", logger="contextfold.runtime.clients"):
        assert await closed.server_context_window() is None
    assert "reported no context window for 'mine'" in caplog.text
    await closed.client.close()
