"""The in-process event bus: per-conversation subscribers fed from bounded queues.

Publishers are the store (after each commit), the runtime host (live deltas) and the
PostgreSQL link (what other processes appended or published). Publishing never waits: a
subscriber that cannot keep up loses its queued messages and is told to resync from the
database instead, so a slow websocket can never stall a run.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from kaizen_server_extension.events.messages import (
    BusMessage,
    JournalAppended,
    LiveEvent,
    LiveEventInvalid,
    Resync,
    live_event,
)
from kaizen_server_extension.store.records import EventRecord

log = logging.getLogger("kaizen.events")

DEFAULT_QUEUE_SIZE = 1000


class RemotePublisher(Protocol):
    """Carries live events to other server processes (see ``events.postgres``)."""

    def send_live(self, event: LiveEvent) -> None: ...


class Subscription:
    """One observer of one conversation. Use as a context manager, or ``close()`` it."""

    def __init__(self, bus: EventBus, conversation_id: str, maxsize: int) -> None:
        if maxsize < 2:
            raise ValueError("a subscription queue needs room for a Resync and one event")
        self.conversation_id = conversation_id
        self.overflows = 0
        self._bus = bus
        self._queue: asyncio.Queue[BusMessage] = asyncio.Queue(maxsize)
        self._closed = False

    def offer(self, message: BusMessage) -> None:
        """Enqueue without ever blocking the publisher."""
        if self._closed:
            return
        try:
            self._queue.put_nowait(message)
            return
        except asyncio.QueueFull:
            pass
        # Too slow: what it has not read is dropped. Durable events are in the database and
        # the Resync makes the subscriber re-read them; dropped live events are only a
        # preview. Newer live events still follow the Resync.
        self.overflows += 1
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(Resync("subscriber fell behind"))
        if not isinstance(message, JournalAppended):
            self._queue.put_nowait(message)

    async def get(self) -> BusMessage:
        """The next message (bound the wait with ``asyncio.timeout`` if needed)."""
        return await self._queue.get()

    def pending(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._bus._unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass
class _Room:
    subscribers: set[Subscription] = field(default_factory=set)
    # Highest seq announced to these subscribers: the same append is announced twice on
    # PostgreSQL (store listener here, NOTIFY echo), and older notices add nothing because
    # subscribers always read everything after their own last seq.
    high_seq: int = 0


class EventBus:
    """Subscribe per conversation; publish durable notices and live-only events."""

    def __init__(self, *, queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        self.queue_size = queue_size
        self._rooms: dict[str, _Room] = {}
        self._remote: RemotePublisher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    # -- subscribers -----------------------------------------------------------------------

    def subscribe(self, conversation_id: str) -> Subscription:
        """Start receiving; call this *before* reading the journal backlog."""
        self._bind_loop()
        sub = Subscription(self, conversation_id, self.queue_size)
        self._rooms.setdefault(conversation_id, _Room()).subscribers.add(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        room = self._rooms.get(sub.conversation_id)
        if room is None:
            return
        room.subscribers.discard(sub)
        if not room.subscribers:
            del self._rooms[sub.conversation_id]

    def subscriber_count(self, conversation_id: str | None = None) -> int:
        if conversation_id is not None:
            room = self._rooms.get(conversation_id)
            return len(room.subscribers) if room else 0
        return sum(len(r.subscribers) for r in self._rooms.values())

    # -- publishers ------------------------------------------------------------------------

    def attach_remote(self, remote: RemotePublisher | None) -> None:
        self._remote = remote

    def publish_appended(self, events: Sequence[EventRecord]) -> None:
        """The store's after-commit listener: announce each conversation's newest seq."""
        newest: dict[str, int] = {}
        for event in events:
            newest[event.conversation_id] = max(event.seq, newest.get(event.conversation_id, 0))
        for conversation_id, seq in newest.items():
            self.publish_durable(conversation_id, seq)

    def publish_durable(self, conversation_id: str, seq: int) -> None:
        """Announce that the journal holds events up to ``seq`` (local or from NOTIFY)."""
        self._on_loop(self._deliver_durable, conversation_id, seq)

    def publish_live(self, conversation_id: str, event: Mapping[str, Any]) -> LiveEvent:
        """Publish a live-only event (``{"type", "run_id"?, "data"?}``) to every observer of
        the conversation, here and in other server processes. Never blocks, never stores.

        Raises ``LiveEventInvalid`` (``LiveEventTooLarge`` over ``MAX_LIVE_BYTES``).
        """
        live = live_event(conversation_id, event)
        self._on_loop(self._deliver, live)
        if self._remote is not None:
            self._remote.send_live(live)
        return live

    def publish_run_live(self, conversation_id: str, kind: str, data: Mapping[str, Any]) -> None:
        """A run's live-only event (answer and thinking deltas): shown, never stored, and never
        an error for the run. ``data`` may carry ``run_id``, which becomes the event's own."""
        fields = dict(data)
        run_id = fields.pop("run_id", None)
        try:
            self.publish_live(conversation_id, {"type": kind, "run_id": run_id, "data": fields})
        except LiveEventInvalid as exc:
            # A preview that cannot be shown must not fail the run: the journal has the rest.
            log.warning("live event %s not published: %s", kind, exc)

    def deliver_remote_live(self, event: LiveEvent) -> None:
        """A live event another process published (not re-sent anywhere)."""
        self._on_loop(self._deliver, event)

    def resync_all(self, reason: str) -> None:
        """Tell every subscriber to re-read the journal (notices may have been missed)."""
        self._on_loop(self._resync_all, reason)

    # -- delivery (always on the bus's loop) -------------------------------------------------

    def _deliver_durable(self, conversation_id: str, seq: int) -> None:
        room = self._rooms.get(conversation_id)
        if room is None or seq <= room.high_seq:
            return
        room.high_seq = seq
        self._offer_all(room, JournalAppended(conversation_id, seq))

    def _deliver(self, event: LiveEvent) -> None:
        room = self._rooms.get(event.conversation_id)
        if room is not None:
            self._offer_all(room, event)

    def _resync_all(self, reason: str) -> None:
        message = Resync(reason)
        for room in self._rooms.values():
            self._offer_all(room, message)

    @staticmethod
    def _offer_all(room: _Room, message: BusMessage) -> None:
        for sub in tuple(room.subscribers):
            sub.offer(message)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._loop_thread = loop, threading.get_ident()

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        # asyncio queues are not thread-safe; a publisher on another thread (a kernel
        # bridge, a worker) hands the delivery to the loop the subscribers live on.
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            fn(*args)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)
