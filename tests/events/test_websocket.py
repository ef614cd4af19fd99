"""``WS conversations/{id}/events`` through a real server process (API.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from tornado.websocket import websocket_connect

from tests.events.support import (
    connect,
    events_url,
    read_frame,
    read_until,
    read_while,
    refused,
)
from tests.support.server import ServerProcess, member_token


def _room(server: ServerProcess, owner: str = "alice", *, shared: bool = False) -> str:
    with server.client(owner) as client:
        response = client.post("conversations", json={"agent_id": "general",
                                                      "shared": shared})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def _journal(server: ServerProcess, member: str, room: str, after: int = 0) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    with server.client(member) as client:
        while True:
            response = client.get(f"conversations/{room}/journal",
                                  params={"after": after, "limit": 1000})
            assert response.status_code == 200, response.text
            page = response.json()
            events += page["events"]
            if not page["events"]:
                return events
            after = page["next"]


def _post(server: ServerProcess, member: str, room: str, text: str) -> dict[str, Any]:
    with server.client(member) as client:
        response = client.post(f"conversations/{room}/messages", json={"text": text})
        assert response.status_code == 202, response.text
        return dict(response.json())


def _durable(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for frame in frames:
        assert frame.pop("live") is False
        out.append(frame)
    return out


def _accepted(frames: list[dict[str, Any]]) -> set[str]:
    return {f["data"]["input_id"] for f in frames if f["type"] == "input.accepted"}


async def test_resume_with_after_yields_exactly_the_missing_events(
        server: ServerProcess) -> None:
    room = _room(server)
    for i in range(6):
        _post(server, "alice", room, f"message {i}")
    journal = _journal(server, "alice", room)
    resume_at = journal[2]["seq"]
    expected = [e for e in journal if e["seq"] > resume_at]

    ws = await connect(server, "alice", room, after=resume_at)
    try:
        frames = await read_until(ws, lambda f: len(f) == len(expected))
    finally:
        ws.close()
    # Identical to the journal: same events, same order, nothing before ``after``.
    assert _durable(frames) == expected


async def test_events_appended_while_connected_arrive_all_in_order_once(
        server: ServerProcess) -> None:
    room = _room(server)
    _post(server, "alice", room, "before connecting")
    ws = await connect(server, "alice", room, after=0)
    posted: list[str] = []

    async def post_many() -> None:
        async with httpx.AsyncClient(
                base_url=server.base_url + "kaizen/api/",
                headers={"Authorization": f"token {member_token('alice')}"}) as client:
            for i in range(25):
                response = await client.post(f"conversations/{room}/messages",
                                             json={"text": f"concurrent {i}"})
                assert response.status_code == 202, response.text
                posted.append(response.json()["input_id"])

    try:
        poster = asyncio.create_task(post_many())
        # Reading starts while the backlog is still being sent and appends keep coming.
        frames = await read_while(ws, poster,
                                  lambda f: len(posted) == 25 and set(posted) <= _accepted(f))
        await poster
    finally:
        ws.close()
    seqs = [f["seq"] for f in frames]
    assert seqs == list(range(1, len(seqs) + 1))  # from the first, no gap, no duplicate
    assert _durable(frames) == _journal(server, "alice", room)[:len(frames)]


async def test_refusals_happen_before_the_upgrade(server: ServerProcess) -> None:
    room = _room(server)
    assert await refused(server, None, room) == (
        401, {"error": {"code": "unauthenticated", "message": "Authentication is required."}})
    status, body = await refused(server, "bob", room)  # exists, but not bob's
    assert (status, body["error"]["code"]) == (404, "conversation_not_found")
    status, body = await refused(server, "alice", "no-such-room")
    assert (status, body["error"]["code"]) == (404, "conversation_not_found")
    status, body = await refused(server, "alice", room, after="-1")
    assert (status, body["error"]["code"]) == (400, "invalid_query")


async def test_a_removed_participant_is_disconnected_at_once(server: ServerProcess) -> None:
    room = _room(server, shared=True)
    with server.client("alice") as alice:
        assert alice.post(f"conversations/{room}/participants",
                          json={"member": "bob"}).status_code == 200
    ws = await connect(server, "bob", room)
    try:
        added = await read_frame(ws)
        assert added["type"] == "participant.added" and added["data"]["member"] == "bob"
        with server.client("alice") as alice:
            assert alice.delete(f"conversations/{room}/participants/bob").status_code == 200
        async with asyncio.timeout(10):
            # Nothing after the removal reaches bob: the socket closes.
            assert await ws.read_message() is None
        assert ws.close_code == 4404
    finally:
        ws.close()
    # Bob's next handshake is refused like any stranger's.
    status, _ = await refused(server, "bob", room)
    assert status == 404


async def test_closing_the_socket_cancels_nothing(server: ServerProcess) -> None:
    room = _room(server)
    ws = await connect(server, "alice", room)
    accepted = _post(server, "alice", room, "keep going without me")
    ws.close()
    # The input stays accepted and its run is still there to be read (and run) later.
    events = _journal(server, "alice", room)
    assert accepted["input_id"] in _accepted(events)
    with server.client("alice") as alice:
        assert alice.get(f"runs/{accepted['run_id']}").status_code == 200


async def test_a_browser_style_client_authenticates_with_the_token_query(
        server: ServerProcess) -> None:
    # Browsers cannot set headers on a websocket: jupyter_server also reads ?token=.
    room = _room(server)
    _post(server, "alice", room, "hello")
    url = events_url(server, room, after=0) + f"&token={member_token('alice')}"
    ws = await websocket_connect(url)
    try:
        first = await read_frame(ws)
    finally:
        ws.close()
    assert (first["seq"], first["type"], first["live"]) == (1, "input.accepted", False)
