"""The bus across processes on PostgreSQL: LISTEN/NOTIFY, reconnect and resync."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from kaizen_server_extension.events import EventBus, JournalAppended, LiveEvent, Resync
from kaizen_server_extension.events.bus import Subscription
from kaizen_server_extension.events.messages import BusMessage
from kaizen_server_extension.events.postgres import PostgresLink, asyncpg_dsn
from kaizen_server_extension.store import Store
from tests.conftest import POSTGRES_URL
from tests.events.support import connect, read_until
from tests.support.server import ServerProcess

pytestmark = pytest.mark.postgres


async def _next(sub: Subscription, within: float = 5) -> BusMessage:
    async with asyncio.timeout(within):
        return await sub.get()


async def _until(sub: Subscription, wanted: type, within: float = 5) -> BusMessage:
    async with asyncio.timeout(within):
        while True:
            message = await sub.get()
            if isinstance(message, wanted):
                return message


async def _links(schema: str, n: int = 2) -> list[PostgresLink]:
    links = [PostgresLink(EventBus(), POSTGRES_URL, schema, backoff_initial=0.05)
             for _ in range(n)]
    for link in links:
        await link.start()
        assert link.connected
    return links


async def _room(store: Store) -> str:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])
    return (await store.conversations.create("alice", "general", "room", False)).id


async def test_a_live_event_published_in_one_process_reaches_another(
        pg_store: tuple[Store, str]) -> None:
    _, schema = pg_store
    a, b = await _links(schema)
    try:
        with b.bus.subscribe("room1") as sub_b, a.bus.subscribe("room1") as sub_a:
            small = a.bus.publish_live("room1", {"type": "answer.delta", "run_id": "r",
                                                 "data": {"text": "hello"}})
            big = a.bus.publish_live("room1", {"type": "answer.delta", "run_id": "r",
                                               "data": {"text": "é" * 8_000}})
            assert await _until(sub_b, LiveEvent) == small
            assert await _until(sub_b, LiveEvent) == big  # chunked across NOTIFYs
            # A's own subscriber got each once (in process), not again from the echo.
            assert [await _until(sub_a, LiveEvent), await _until(sub_a, LiveEvent)] == [small,
                                                                                         big]
            await asyncio.sleep(0.2)
            assert sub_a.pending() == 0
    finally:
        for link in (a, b):
            await link.stop()


async def test_stopping_right_after_publishing_does_not_hang(
        pg_store: tuple[Store, str]) -> None:
    _, schema = pg_store
    for _ in range(5):  # the cancel lands as the sender takes the event off its queue
        (link,) = await _links(schema, 1)
        link.bus.publish_live("room1", {"type": "answer.delta", "data": {"text": "x"}})
        async with asyncio.timeout(5):
            await link.stop()


async def test_a_journal_append_is_announced_to_other_processes_on_commit_only(
        pg_store: tuple[Store, str]) -> None:
    store, schema = pg_store
    (link,) = await _links(schema, 1)
    room = await _room(store)
    try:
        with link.bus.subscribe(room) as sub:
            with pytest.raises(RuntimeError):
                async with store.transaction() as tx:
                    await tx.append_event(room, "note", "alice", {})
                    raise RuntimeError("rolled back")
            async with store.transaction() as tx:
                await tx.append_event(room, "note", "alice", {})
            # The store's in-process listener is not attached here: this came by NOTIFY.
            assert await _next(sub) == JournalAppended(room, 1)
    finally:
        await link.stop()


async def test_after_the_connection_drops_it_reconnects_and_subscribers_resync(
        pg_store: tuple[Store, str]) -> None:
    store, schema = pg_store
    (link,) = await _links(schema, 1)
    room = await _room(store)
    admin = await asyncpg.connect(asyncpg_dsn(POSTGRES_URL))
    try:
        with link.bus.subscribe(room) as sub:
            pid = link._conn.get_server_pid() if link._conn else None
            assert pid is not None
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
            # An append while nobody listens: no notice can reach us for it...
            async with store.transaction() as tx:
                await tx.append_event(room, "note", "alice", {})
            # ...so the reconnect tells subscribers to re-read the journal instead.
            assert await _until(sub, Resync, within=10) == Resync(
                "event listener (re)connected")
            assert link.connects == 2 and link.connected
            async with store.transaction() as tx:
                await tx.append_event(room, "note", "alice", {})
            assert await _until(sub, JournalAppended) == JournalAppended(room, 2)
    finally:
        await admin.close()
        await link.stop()


async def test_a_message_posted_to_one_server_is_seen_on_a_websocket_of_another(
        server_pair: tuple[ServerProcess, ServerProcess]) -> None:
    a, b = server_pair
    with a.client("alice") as alice:
        room = alice.post("conversations", json={"agent_id": "general"}).json()["id"]
    ws = await connect(b, "alice", room)
    try:
        with a.client("alice") as alice:
            accepted = alice.post(f"conversations/{room}/messages",
                                  json={"text": "from A"}).json()
        frames = await read_until(ws, lambda f: any(
            x["type"] == "input.accepted" and x["data"]["input_id"] == accepted["input_id"]
            for x in f), within=10)
    finally:
        ws.close()
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    assert frames[-1]["data"]["text"] == "from A"
