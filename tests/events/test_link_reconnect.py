"""The PostgreSQL link's reconnect policy, on a fake connection (runs without PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from kaizen_server_extension.events import EventBus, JournalAppended, Resync
from kaizen_server_extension.events.bus import Subscription
from kaizen_server_extension.events.messages import BusMessage
from kaizen_server_extension.events.postgres import PostgresLink


class FakeConnection:
    """Just what the link uses of an asyncpg connection."""

    def __init__(self) -> None:
        self.listeners: dict[str, Callable[..., None]] = {}
        self._on_close: list[Callable[[Any], None]] = []
        self._closed = False

    def add_termination_listener(self, callback: Callable[[Any], None]) -> None:
        self._on_close.append(callback)

    async def add_listener(self, channel: str, callback: Callable[..., None]) -> None:
        self.listeners[channel] = callback

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return "kz_test" if "current_schema" in query else 1

    def notify(self, channel: str, payload: str) -> None:
        self.listeners[channel](self, 1234, channel, payload)

    def terminate(self) -> None:  # also what a network drop looks like to the link
        if not self._closed:
            self._closed = True
            for callback in self._on_close:
                callback(self)

    def is_closed(self) -> bool:
        return self._closed


async def _next(sub: Subscription) -> BusMessage:
    async with asyncio.timeout(5):
        return await sub.get()


async def test_it_retries_a_failed_connect_and_resyncs_after_every_reconnect() -> None:
    attempts: list[FakeConnection | None] = []

    async def connect() -> Any:
        if len(attempts) == 0:
            attempts.append(None)
            raise OSError("database is starting up")
        conn = FakeConnection()
        attempts.append(conn)
        return conn

    bus = EventBus()
    link = PostgresLink(bus, "postgresql+asyncpg://x@localhost/db", backoff_initial=0.01,
                        connect=connect)
    with bus.subscribe("room") as sub:
        await link.start()
        assert link.connected and link.connects == 1 and len(attempts) == 2
        assert await _next(sub) == Resync("event listener (re)connected")

        first = attempts[-1]
        assert first is not None
        first.notify("kaizen_journal", json.dumps({"n": "kz_test", "c": "room", "s": 3}))
        first.notify("kaizen_journal", json.dumps({"n": "other", "c": "room", "s": 9}))
        assert await _next(sub) == JournalAppended("room", 3)

        first.terminate()  # the connection drops: notices may be lost from here...
        # ...so once listening again, every subscriber is told to re-read the journal.
        assert await _next(sub) == Resync("event listener (re)connected")
        assert link.connects == 2 and link.connected and attempts[-1] is not first
        await link.stop()
    assert sub.pending() == 0
