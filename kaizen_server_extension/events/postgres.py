"""The bus across server processes: one dedicated asyncpg connection per process.

It LISTENs for journal notices (sent by the store inside each appending transaction) and for
live events, and it sends this process's live events. If the connection drops it reconnects
with capped, jittered backoff; every (re)connect tells all local subscribers to resync from
the database, since whatever was appended while nobody listened produced no notice here.
Live events are best effort: while disconnected they are dropped, not queued for later.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from kaizen_server_extension.events.bus import EventBus
from kaizen_server_extension.events.messages import LiveEvent
from kaizen_server_extension.events.wire import (
    JOURNAL_CHANNEL,
    LIVE_CHANNEL,
    LiveAssembler,
    decode_journal,
    encode_live,
)

log = logging.getLogger("kaizen.events")

Connect = Callable[[], Awaitable[asyncpg.Connection]]
# Failures of the network or the server: logged briefly. Anything else gets a traceback.
_EXPECTED = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    """``postgresql+asyncpg://…`` (SQLAlchemy) → ``postgresql://…`` (asyncpg)."""
    url = make_url(sqlalchemy_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class PostgresLink:
    """Connects an :class:`EventBus` to the other processes on one PostgreSQL database."""

    def __init__(self, bus: EventBus, url: str, schema: str | None = None, *,
                 backoff_initial: float = 0.2, backoff_max: float = 10.0,
                 keepalive_seconds: float = 15.0, query_timeout: float = 5.0,
                 outbox_size: int = 1000, connect: Connect | None = None) -> None:
        self.bus = bus
        self.origin = uuid.uuid4().hex  # tells our own live NOTIFYs apart from others'
        self.backoff_initial, self.backoff_max = backoff_initial, backoff_max
        self.keepalive_seconds, self.query_timeout = keepalive_seconds, query_timeout
        self.connects = 0
        self.dropped_live = 0
        self._dsn = asyncpg_dsn(url)
        self._server_settings = {"search_path": schema} if schema else {}
        self._connect: Connect = connect or self._default_connect
        self._schema: str | None = None
        self._assembler: LiveAssembler | None = None
        self._outbox: asyncio.Queue[list[str]] = asyncio.Queue(outbox_size)
        self._event_ids = itertools.count(1)
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        # Session advisory locks held on the connection while it is up: (namespace, key).
        self._locks: list[tuple[int, str]] = []
        self._locked = asyncio.Event()

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self, wait_seconds: float = 5.0) -> None:
        """Start listening; waits briefly for the first connection but never fails start-up
        (subscribers read the database anyway, and the link keeps retrying)."""
        if self._task is None:
            self.bus.attach_remote(self)
            self._task = asyncio.create_task(self._run(), name="kaizen-events-listener")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_seconds):
                await self._connected.wait()
        if not self._connected.is_set():
            log.warning("Kaizen events: not yet listening on PostgreSQL; retrying")

    async def stop(self) -> None:
        self.bus.attach_remote(None)
        task, self._task = self._task, None
        if task is not None:
            self.break_connection()
            task.cancel()
            # Shutdown must not hang on the database: give up waiting after a moment.
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, self.query_timeout)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def hold_advisory_lock(self, namespace: int, key: str) -> None:
        """Hold the session advisory lock (``namespace``, ``hashtext(key)``) whenever the link
        is connected, taken again on every reconnect. PostgreSQL releases it the moment the
        connection ends — when this process dies, however it dies — which is what other
        replicas read as this process's liveness (store/runs.py: HOLDER_GONE)."""
        self._locks.append((namespace, key))

    @property
    def holds_locks(self) -> bool:
        """Whether the locks asked for are held now (connected, and taken on this
        connection)."""
        return bool(self._locks) and self._locked.is_set()

    def break_connection(self) -> None:
        """Drop the current connection as if the network had (tests, operators)."""
        if self._conn is not None:
            self._conn.terminate()

    # -- sending (called by the bus) ----------------------------------------------------------

    def send_live(self, event: LiveEvent) -> None:
        if not self._connected.is_set() or self._schema is None:
            self.dropped_live += 1
            return
        payloads = encode_live(event, schema=self._schema, origin=self.origin,
                               event_id=next(self._event_ids))
        try:
            self._outbox.put_nowait(payloads)
        except asyncio.QueueFull:
            self.dropped_live += 1  # the database is slower than the deltas: drop, never wait

    # -- the connection -------------------------------------------------------------------------

    async def _default_connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self._dsn, server_settings=self._server_settings,
                                     timeout=self.query_timeout)

    async def _run(self) -> None:
        delay = self.backoff_initial
        while True:
            try:
                conn = await self._connect()
            except Exception as exc:  # whatever the cause, keep retrying: never give up
                log.warning("Kaizen events: cannot connect to PostgreSQL (%s); retrying in "
                            "%.1fs", type(exc).__name__, delay)
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, self.backoff_max)
                continue
            try:
                await self._serve(conn)
                log.warning("Kaizen events: PostgreSQL listener connection closed; "
                            "reconnecting")
            except Exception as exc:  # a dead listener would silently stop cross-process events
                log.warning("Kaizen events: PostgreSQL listener lost (%s); reconnecting",
                            type(exc).__name__, exc_info=not isinstance(exc, _EXPECTED))
            finally:
                was_listening = self._connected.is_set()
                self._connected.clear()
                self._locked.clear()
                self._conn = None
                self._drain_outbox()
                if not conn.is_closed():
                    conn.terminate()
            # After a working connection, retry quickly; a connection that fails before it
            # listens (permissions, a broken server) backs off like a failed connect.
            delay = self.backoff_initial if was_listening else min(delay * 2, self.backoff_max)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))

    async def _serve(self, conn: asyncpg.Connection) -> None:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        self._schema = str(await conn.fetchval("SELECT current_schema()"))
        for namespace, key in self._locks:
            await conn.execute("SELECT pg_advisory_lock($1, hashtext($2) & 2147483647)",
                               namespace, key, timeout=self.query_timeout)
        self._locked.set()
        self._assembler = LiveAssembler(self._schema, self.origin)
        await conn.add_listener(JOURNAL_CHANNEL, self._on_notify)
        await conn.add_listener(LIVE_CHANNEL, self._on_notify)
        self._conn = conn
        self.connects += 1
        self._connected.set()
        # Listening from here on; anything committed before is in the database. Order
        # matters: LISTEN first, then resync, so nothing falls between the two.
        self.bus.resync_all("event listener (re)connected")
        sender = asyncio.create_task(self._send_loop(conn))
        watcher = asyncio.create_task(lost.wait())
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if sender.done():
                sender.result()  # re-raises what broke the connection
        finally:
            # Close the socket first: cancelling a query in flight makes asyncpg wait for the
            # server's answer, which a dead (or shutting down) connection never gives.
            conn.terminate()
            for task in (sender, watcher):
                task.cancel()
            await asyncio.gather(sender, watcher, return_exceptions=True)

    async def _send_loop(self, conn: asyncpg.Connection) -> None:
        # The only task that runs queries on this connection (asyncpg allows one at a time);
        # when idle it pings, so a silently dead connection is noticed and replaced.
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that
                # lands just as the queue hands over an item, and stop() would hang.
                async with asyncio.timeout(self.keepalive_seconds):
                    payloads = await self._outbox.get()
            except TimeoutError:
                await conn.fetchval("SELECT 1", timeout=self.query_timeout)
                continue
            # One transaction: the chunks of one event reach every listener together.
            async with conn.transaction():
                for payload in payloads:
                    await conn.execute("SELECT pg_notify($1, $2)", LIVE_CHANNEL, payload,
                                       timeout=self.query_timeout)

    def _drain_outbox(self) -> None:
        while not self._outbox.empty():
            self._outbox.get_nowait()
            self.dropped_live += 1

    def _on_notify(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        if self._schema is None:
            return
        if channel == JOURNAL_CHANNEL:
            notice = decode_journal(payload, self._schema)
            if notice is not None:
                self.bus.publish_durable(*notice)
        elif channel == LIVE_CHANNEL and self._assembler is not None:
            event = self._assembler.feed(payload)
            if event is not None:
                self.bus.deliver_remote_live(event)
