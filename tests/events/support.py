"""Websocket helpers for the events tests (tornado's client, like a browser would)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from tests.support.server import ServerProcess, member_token


def events_url(server: ServerProcess, room: str, after: int | None = None) -> str:
    url = server.base_url.replace("http", "ws", 1) + f"kaizen/api/conversations/{room}/events"
    return url if after is None else f"{url}?after={after}"


async def connect(server: ServerProcess, member: str | None, room: str,
                  after: int | None = None) -> WebSocketClientConnection:
    headers = {"Authorization": f"token {member_token(member)}"} if member else {}
    request = HTTPRequest(events_url(server, room, after), headers=headers,
                          connect_timeout=10, request_timeout=10)
    return await websocket_connect(request)


async def refused(server: ServerProcess, member: str | None, room: str,
                  after: str | None = None) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON error of a handshake the server must refuse."""
    headers = {"Authorization": f"token {member_token(member)}"} if member else {}
    url = events_url(server, room) + (f"?after={after}" if after is not None else "")
    try:
        ws = await websocket_connect(HTTPRequest(url, headers=headers, request_timeout=10))
    except HTTPClientError as exc:
        assert exc.response is not None
        return exc.code, json.loads(exc.response.body)
    ws.close()
    raise AssertionError("the websocket was accepted")


async def read_frame(ws: WebSocketClientConnection, within: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(within):
        message = await ws.read_message()
    assert message is not None, f"closed: {ws.close_code} {ws.close_reason}"
    assert isinstance(message, str)
    frame: dict[str, Any] = json.loads(message)
    return frame


async def read_until(ws: WebSocketClientConnection, done: Any,
                     within: float = 15) -> list[dict[str, Any]]:
    """Frames until ``done(frames)`` holds."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(within):
        while not done(frames):
            frames.append(await read_frame(ws, within))
    return frames


async def read_while(ws: WebSocketClientConnection, work: asyncio.Task[Any], done: Any,
                     within: float = 15) -> list[dict[str, Any]]:
    """Frames while ``work`` runs, until it has finished and ``done(frames)`` holds.

    The condition is looked at again when ``work`` finishes, not only when a frame comes:
    the last frames may arrive before the last request's answer does, and nothing would
    follow them. A pending read is kept across looks, so no frame is lost."""
    frames: list[dict[str, Any]] = []
    reading: asyncio.Future[dict[str, Any]] | None = None
    try:
        async with asyncio.timeout(within):
            while not (work.done() and done(frames)):
                if work.done() and work.exception() is not None:
                    break  # the caller's ``await work`` raises it
                reading = reading or asyncio.ensure_future(read_frame(ws, within))
                await asyncio.wait({reading, work}, return_when=asyncio.FIRST_COMPLETED)
                if reading.done():
                    frames.append(reading.result())
                    reading = None
    finally:
        if reading is not None:
            reading.cancel()
    return frames
