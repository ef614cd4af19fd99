"""The gateway's HTTP transport (models/transport.py): the environment's proxy, SSE lines split
anywhere by the network, redirects and cookies, over real loopback sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest

from kaizen_server_extension.protocol.model import ModelStepError, TextDelta
from tests.models.conftest import FakeFactory, GatewayFactory
from tests.models.helpers import collect, finished_of, snapshot_for, text_of

Respond = Callable[[bytes], list[bytes]]


def _sse_answer(text: str) -> list[bytes]:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    done = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body = (f"data: {json.dumps(chunk)}\r\n\r\ndata: {json.dumps(done)}\r\n\r\n"
            "data: [DONE]\r\n\r\n").encode()
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    return [head, body]


@asynccontextmanager
async def raw_server(respond: Respond) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A loopback HTTP/1.1 peer answering one request per connection (its answers say
    ``Connection: close``) with ``respond``'s pieces, each written (and flushed) on its own;
    yields its port and the request heads."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        heads.append(head)
        for piece in respond(head):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.005)  # a separate segment on the wire
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], heads
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy",
                 "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


async def test_the_environments_proxy_carries_the_model_request(
    no_proxy_env: pytest.MonkeyPatch, gateway_for: GatewayFactory
) -> None:
    async with raw_server(lambda head: _sse_answer("via the proxy")) as (port, heads):
        no_proxy_env.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        # Nothing resolves this name: only a request sent to the proxy can be answered.
        gateway = gateway_for("http://model.invalid/v1")

        events = await collect(gateway, snapshot_for("hi"))

    assert text_of(events) == "via the proxy"
    assert heads[0].startswith(b"POST http://model.invalid/v1/chat/completions HTTP/1.1")


async def test_no_proxy_sends_the_request_straight_to_the_provider(
    no_proxy_env: pytest.MonkeyPatch, fake_openai_factory: FakeFactory,
    gateway_for: GatewayFactory
) -> None:
    fake = fake_openai_factory([{"responses": [{"text": "direct"}]}])
    no_proxy_env.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    no_proxy_env.setenv("NO_PROXY", "127.0.0.1")

    events = await collect(gateway_for(fake), snapshot_for("hi"))

    assert text_of(events) == "direct"


async def test_lines_split_across_network_reads_are_joined(
    no_proxy_env: pytest.MonkeyPatch, gateway_for: GatewayFactory
) -> None:
    """An SSE event cut mid-line, mid-JSON and between CR and LF still arrives whole."""
    def dribbled(head: bytes) -> list[bytes]:
        start, body = _sse_answer("joined again")
        cuts = [7, 30, body.index(b"\r\n") + 1, len(body) - 3]
        pieces, last = [start], 0
        for cut in cuts:
            pieces.append(body[last:cut])
            last = cut
        pieces.append(body[last:])
        return pieces

    async with raw_server(dribbled) as (port, _heads):
        events = await collect(gateway_for(f"http://127.0.0.1:{port}/v1"), snapshot_for("hi"))

    assert events[0] == TextDelta("joined again")
    assert finished_of(events).finish_reason == "stop"


async def test_a_redirect_is_not_followed(
    no_proxy_env: pytest.MonkeyPatch, gateway_for: GatewayFactory
) -> None:
    async with raw_server(lambda head: [b"HTTP/1.1 307 Temporary Redirect\r\n"
                                        b"Location: /v1/elsewhere\r\n"
                                        b"Content-Length: 0\r\n\r\n"]) as (port, heads):
        with pytest.raises(ModelStepError) as caught:
            await collect(gateway_for(f"http://127.0.0.1:{port}/v1"), snapshot_for("hi"))

    assert len(heads) == 1  # asked once; the Location (this same server) was not visited
    assert caught.value.code.startswith("provider_")


async def test_a_providers_cookie_is_never_sent_back(
    no_proxy_env: pytest.MonkeyPatch, gateway_for: GatewayFactory
) -> None:
    def with_cookie(head: bytes) -> list[bytes]:
        start, body = _sse_answer("ok")
        return [start.replace(b"\r\n\r\n", b"\r\nSet-Cookie: session=abc; Path=/\r\n\r\n"),
                body]

    async with raw_server(with_cookie) as (port, heads):
        gateway = gateway_for(f"http://127.0.0.1:{port}/v1")
        await collect(gateway, snapshot_for("hi"))
        await collect(gateway, snapshot_for("again"))

    assert len(heads) == 2
    assert b"cookie" not in heads[1].lower()
