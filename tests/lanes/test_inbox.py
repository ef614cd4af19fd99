"""The completion inbox: typed destinations, the attendance gate, durable fallback, REST."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.lanes.inbox import (
    Attendance,
    CompletionInbox,
    Destination,
    DestinationKind,
    InvalidDestination,
    PresenceRegistry,
)
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.notifications import NotificationRepository
from kaizen_server_extension.store.runs import RunLane
from tests.events.support import connect, read_until
from tests.lanes.test_turns import _room, _send, _settled
from tests.support.server import ServerProcess


async def _settled_run(store: Store, member: str = "alice") -> tuple[str, str]:
    """A room of ``member`` with one run settled ``completed``: (conversation id, run id)."""
    await store.members.ensure(member)
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    room = await store.conversations.create(member, "general", "room", False)
    accepted = await store.inputs.accept(room.id, member, "hi", kind="message",
                                         idempotency_key=None)
    assert await RunLane(store).settle(accepted.run_id, "completed", "answered", "kaizen")
    return room.id, accepted.run_id


def _inbox(store: Store, presence: Any = None) -> CompletionInbox:
    return CompletionInbox(NotificationRepository(store), presence or PresenceRegistry())


async def _rows(store: Store, member: str = "alice") -> list[Any]:
    return await NotificationRepository(store).list_for(member, unread_only=False)


# --- a typed destination, never a URL ------------------------------------------------


@pytest.mark.rule("R-030")
@pytest.mark.parametrize("data", [
    {"kind": "chat", "resource_id": "abc", "run_id": "r1", "url": "https://evil.example/"},
    {"kind": "chat", "resource_id": "abc", "run_id": "r1", "href": "/lab/tree/x"},
    {"kind": "chat", "resource_id": "https://evil.example/phish", "run_id": "r1"},
    {"kind": "chat", "resource_id": "javascript:alert(1)", "run_id": "r1"},
    {"kind": "chat", "resource_id": "../../etc/passwd", "run_id": "r1"},
    {"kind": "chat", "resource_id": "abc%2F..", "run_id": "r1"},
    {"kind": "chat", "resource_id": "abc", "run_id": "//evil.example"},
    {"kind": "url", "resource_id": "abc", "run_id": "r1"},
    {"kind": "chat", "resource_id": "abc"},           # a chat names its run
    {"kind": "task_run", "resource_id": "task1"},     # and so does a task run
    {"kind": "chat", "resource_id": "", "run_id": "r1"},
    {"kind": "chat", "resource_id": 42, "run_id": "r1"},
])
def test_a_destination_is_typed_and_carries_only_exact_ids(data: dict[str, Any]) -> None:
    with pytest.raises(InvalidDestination):
        Destination.from_mapping(data)


@pytest.mark.rule("R-030")
def test_typed_destinations_of_each_kind_are_accepted() -> None:
    assert Destination.from_mapping({"kind": "chat", "resource_id": "c0ffee",
                                     "run_id": "r1"}) == Destination.chat("c0ffee", "r1")
    assert Destination.prompt("weekly-summary").run_id is None
    assert Destination.task_run("task_1", "run-2").kind is DestinationKind.TASK_RUN
    with pytest.raises(InvalidDestination):
        Destination.chat("https://evil.example", "r1")
    with pytest.raises(InvalidDestination):
        Destination("chat", "abc", "r1")  # type: ignore[arg-type]  # a bare string kind


@pytest.mark.rule("R-030")
async def test_the_producer_api_refuses_anything_but_a_destination(store: Store) -> None:
    await _settled_run(store)
    inbox = _inbox(store)
    with pytest.raises(InvalidDestination):
        await inbox.notify(member="alice", attendance=Attendance.UNATTENDED,
                           destination={"kind": "chat", "url": "https://evil.example"},  # type: ignore[arg-type]
                           status="completed", title="t", dedupe_key="k")
    assert await _rows(store) == []  # a rejected producer writes nothing


# --- an attended foreground stream is suppressed before insertion --------------------


@pytest.mark.rule("R-031")
async def test_an_attended_chat_or_prompt_is_suppressed_before_insertion(store: Store) -> None:
    room, run = await _settled_run(store)
    inbox = _inbox(store)
    for destination in (Destination.chat(room, run), Destination.prompt("p1", run)):
        assert await inbox.notify(member="alice", destination=destination,
                                  attendance=Attendance.ATTENDED, status="completed",
                                  title="t", dedupe_key=f"k-{destination.kind}") is None
    assert await _rows(store) == []
    # A task run is background work: attended or not, it is delivered.
    task = await inbox.notify(member="alice", destination=Destination.task_run("t1", run),
                              attendance=Attendance.ATTENDED, status="completed", title="t",
                              dedupe_key="k-task")
    assert task is not None and task.kind == "task_run"
    # The same chat, unattended, is delivered.
    chat = await inbox.notify(member="alice", destination=Destination.chat(room, run),
                              attendance=Attendance.UNATTENDED, status="completed",
                              title="t", dedupe_key="k-chat")
    assert chat is not None and (chat.resource_id, chat.run_id) == (room, run)


@pytest.mark.rule("R-031")
async def test_the_database_refuses_a_stored_attended_chat_notice(store: Store) -> None:
    await _settled_run(store)
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            tx.session.add(m.Notification(
                id="forged", member="alice", kind="chat", resource_id="c", run_id="r",
                attendance="attended", status="completed", title="t", dedupe_key="forged",
                created_at=utcnow()))


@pytest.mark.rule("R-031")
async def test_a_member_watching_the_room_gets_no_notice_of_its_run(store: Store) -> None:
    room, run = await _settled_run(store)
    presence = PresenceRegistry()
    inbox = _inbox(store, presence)
    release = presence.attend("alice", room)
    presence.attend("bob", room)  # someone else watching does not count for alice
    assert inbox.attendance("alice", room) is Attendance.ATTENDED
    assert await inbox.run_settled(run) is None
    release()
    release()  # idempotent
    assert inbox.attendance("alice", room) is Attendance.UNATTENDED
    delivered = await inbox.run_settled(run)
    assert delivered is not None and delivered.attendance == "unattended"


# --- presence lookup failure falls back to durable delivery ---------------------------


class _BrokenPresence:
    def is_attending(self, member: str, conversation_id: str) -> bool:
        raise ConnectionError("presence service unreachable")


@pytest.mark.rule("R-032")
async def test_a_failing_presence_lookup_delivers_durably(store: Store) -> None:
    room, run = await _settled_run(store)
    inbox = _inbox(store, _BrokenPresence())
    assert inbox.attendance("alice", room) is Attendance.UNKNOWN
    delivered = await inbox.run_settled(run)
    assert delivered is not None
    assert (delivered.kind, delivered.resource_id, delivered.run_id) == ("chat", room, run)
    assert delivered.attendance == "unknown"
    assert [r.id for r in await _rows(store)] == [delivered.id]


async def test_one_settlement_reported_twice_is_one_notice(store: Store) -> None:
    _, run = await _settled_run(store)
    inbox = _inbox(store)
    results = await asyncio.gather(inbox.run_settled(run), inbox.run_settled(run))
    assert sum(r is not None for r in results) == 1
    assert len(await _rows(store)) == 1


async def test_no_notice_for_an_open_run_or_a_cancelled_one(store: Store) -> None:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])
    room = await store.conversations.create("alice", "general", "room", False)
    queued = await store.inputs.accept(room.id, "alice", "a", kind="message",
                                       idempotency_key=None)
    inbox = _inbox(store)
    assert await inbox.run_settled(queued.run_id) is None  # still queued
    await RunLane(store).cancel(queued.run_id, "alice")
    assert await inbox.run_settled(queued.run_id) is None  # the member did it themselves
    assert await _rows(store) == []


# --- REST, end to end through a real server ---------------------------------------------------


def _notices(client: httpx.Client, run_id: str, *, unread: bool = True,
             within: float = 0.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    while True:
        listed = client.get("notifications", params={"unread": "1" if unread else "0"})
        assert listed.status_code == 200, listed.text
        found = [n for n in listed.json() if n["destination"]["run_id"] == run_id]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


@pytest.mark.rule("R-030", "R-031")
def test_an_unattended_run_lands_in_the_inbox_and_only_its_member_can_ack_it(
    model_server: ServerProcess,
) -> None:
    with model_server.client("alice") as alice, model_server.client("bob") as bob:
        room = _room(alice)
        accepted = _send(alice, room, "say hello for the inbox")
        assert _settled(alice, accepted["run_id"])["status"] == "completed"
        notices = _notices(alice, accepted["run_id"], within=10)
        assert len(notices) == 1
        notice = notices[0]
        assert notice["destination"] == {"kind": "chat", "conversation_id": room,
                                         "run_id": accepted["run_id"]}
        assert notice["status"] == "completed" and notice["unread"] is True
        assert not any(k in str(notice).lower() for k in ("http", "url", "href"))
        # Member-scoped: bob neither sees nor acknowledges alice's notice.
        assert _notices(bob, accepted["run_id"]) == []
        refused = bob.post(f"notifications/{notice['id']}/ack")
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "notification_not_found"
        assert alice.post("notifications/nope/ack").status_code == 404
        assert alice.get("notifications", params={"unread": "maybe"}).status_code == 400
        acked = alice.post(f"notifications/{notice['id']}/ack")
        assert acked.status_code == 200 and acked.json()["unread"] is False
        assert alice.post(f"notifications/{notice['id']}/ack").status_code == 200
        assert _notices(alice, accepted["run_id"]) == []
        assert len(_notices(alice, accepted["run_id"], unread=False)) == 1


@pytest.mark.rule("R-033")
def test_the_client_acknowledges_only_the_exact_destination_it_has_open(
    model_server: ServerProcess,
) -> None:
    with model_server.client("alice") as alice, model_server.client("bob") as bob:
        rooms, runs = [], []
        for _ in range(2):
            room = _room(alice)
            accepted = _send(alice, room, "say hello for the open destination")
            assert _settled(alice, accepted["run_id"])["status"] == "completed"
            assert len(_notices(alice, accepted["run_id"], within=10)) == 1
            rooms.append(room)
            runs.append(accepted["run_id"])
        opened, other = rooms

        def ack(client: httpx.Client, body: object) -> httpx.Response:
            return client.post("notifications/ack", json=body)

        # Near misses acknowledge nothing: another kind with the same id, a prefix of the
        # id, another run of the open room, another member's open room.
        for near in ({"kind": "task_run", "resource_id": opened},
                     {"kind": "chat", "resource_id": opened[:-1]},
                     {"kind": "chat", "resource_id": opened, "run_id": runs[1]}):
            response = ack(alice, near)
            assert response.status_code == 200 and response.json() == {"acknowledged": []}
        assert ack(bob, {"kind": "chat", "resource_id": opened}).json() == {"acknowledged": []}
        # Anything but a kind and exact ids is refused, and changes nothing.
        for bad in ({"kind": "chat", "resource_id": opened, "url": "/lab"},
                    {"kind": "chat", "resource_id": f"{opened}/x"},
                    {"kind": "chat", "resource_id": "%"},
                    {"kind": "room", "resource_id": opened},
                    {"kind": "chat"}):
            assert ack(alice, bad).status_code == 422, bad
        assert all(len(_notices(alice, run)) == 1 for run in runs)

        # The open room's notice, and only that one.
        done = ack(alice, {"kind": "chat", "resource_id": opened})
        assert done.status_code == 200
        acked = done.json()["acknowledged"]
        assert [n["destination"] for n in acked] == [
            {"kind": "chat", "conversation_id": opened, "run_id": runs[0]}]
        assert acked[0]["unread"] is False
        assert _notices(alice, runs[0]) == [] and len(_notices(alice, runs[1])) == 1
        # Again: nothing left to acknowledge there; the other room keeps its notice.
        assert ack(alice, {"kind": "chat", "resource_id": opened}).json() == {
            "acknowledged": []}
        assert ack(alice, {"kind": "chat", "resource_id": other, "run_id": runs[1]}).json()[
            "acknowledged"][0]["destination"]["run_id"] == runs[1]


@pytest.mark.rule("R-031")
async def test_a_member_watching_the_room_over_the_websocket_gets_no_notice(
    model_server: ServerProcess,
) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        ws = await connect(model_server, "alice", room)
        try:
            watched = _send(alice, room, "say hello while watched")
            await read_until(ws, lambda frames: any(
                f.get("type") == "run.terminal" and f.get("run_id") == watched["run_id"]
                for f in frames))
            # The notice would have been written by now, had it not been suppressed; the
            # next run of the room proves the lane moved past it.
            after = _send(alice, room, "say hello again, still watched")
            await read_until(ws, lambda frames: any(
                f.get("type") == "run.terminal" and f.get("run_id") == after["run_id"]
                for f in frames))
        finally:
            ws.close()
        assert _notices(alice, watched["run_id"], unread=False) == []
        # Once the tab is closed the member is away: the next completion is delivered.
        await asyncio.sleep(0.3)  # let the server see the close
        away = _send(alice, room, "say hello to nobody")
        _settled(alice, away["run_id"])
        assert len(_notices(alice, away["run_id"], within=10)) == 1
