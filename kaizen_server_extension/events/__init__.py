"""Observers of the journal: the event bus, in process and across processes (DESIGN.md,
"Data flow of a turn", step 5). A websocket is one observer; closing it cancels nothing.

The runtime host calls :meth:`EventBus.publish_live` for live-only events (deltas); durable
journal appends reach the bus by themselves (the store's after-commit listener here, and
PostgreSQL NOTIFY from other processes through :class:`PostgresLink`).
"""

from kaizen_server_extension.events.bus import EventBus, RemotePublisher, Subscription
from kaizen_server_extension.events.messages import (
    MAX_LIVE_BYTES,
    BusMessage,
    JournalAppended,
    LiveEvent,
    LiveEventInvalid,
    LiveEventTooLarge,
    Resync,
)
from kaizen_server_extension.events.postgres import PostgresLink

__all__ = [
    "MAX_LIVE_BYTES",
    "BusMessage",
    "EventBus",
    "JournalAppended",
    "LiveEvent",
    "LiveEventInvalid",
    "LiveEventTooLarge",
    "PostgresLink",
    "RemotePublisher",
    "Resync",
    "Subscription",
]
