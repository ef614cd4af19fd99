"""What the event bus carries to its subscribers.

Durable messages carry no event body: the journal row is the truth, and a subscriber re-reads
it from the database (so a notice that arrives twice, late or out of order is harmless).
Live-only messages are not stored anywhere and so travel whole, within a size bound.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A live event's JSON (ASCII-escaped) may be at most this long. It bounds subscriber queues
# in memory and the NOTIFY chunks of one event across processes (about ten).
MAX_LIVE_BYTES = 64 * 1024
MAX_LIVE_TYPE_CHARS = 64
_LIVE_KEYS = frozenset({"type", "run_id", "data"})


class LiveEventInvalid(ValueError):
    """The caller handed the bus something that is not a well-formed, bounded live event."""


class LiveEventTooLarge(LiveEventInvalid):
    """Coalesce or split deltas before publishing; the bus does not hold unbounded events."""


@dataclass(frozen=True, slots=True)
class JournalAppended:
    """Durable: the journal of ``conversation_id`` has events up to at least ``seq``."""

    conversation_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """Live-only (e.g. ``answer.delta``): shown to observers now, never stored."""

    conversation_id: str
    type: str
    run_id: str | None
    data: dict[str, Any]

    def body(self) -> dict[str, Any]:
        """What crosses processes; the conversation id travels in the envelope."""
        return {"type": self.type, "run_id": self.run_id, "data": self.data}

    def frame(self) -> dict[str, Any]:
        """The websocket frame (API.md): marked ``live`` so clients never journal it."""
        return {"type": self.type, "live": True, "conversation_id": self.conversation_id,
                "run_id": self.run_id, "data": self.data}


@dataclass(frozen=True, slots=True)
class Resync:
    """Notices may have been lost (slow subscriber, listener reconnect): re-read the DB."""

    reason: str


BusMessage = JournalAppended | LiveEvent | Resync


def encode_live_body(event: LiveEvent) -> str:
    """Compact, ASCII-only JSON: one character is one byte, so it can be cut anywhere."""
    return json.dumps(event.body(), separators=(",", ":"), ensure_ascii=True)


def live_event(conversation_id: str, event: Mapping[str, Any]) -> LiveEvent:
    """Validate what the runtime host publishes: ``{"type", "run_id"?, "data"?}``."""
    unknown = set(event) - _LIVE_KEYS
    if unknown:
        raise LiveEventInvalid(f"unknown live event keys: {sorted(unknown)}")
    kind = event.get("type")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_LIVE_TYPE_CHARS:
        raise LiveEventInvalid(f"a live event needs a type of 1-{MAX_LIVE_TYPE_CHARS} chars")
    run_id = event.get("run_id")
    if run_id is not None and not isinstance(run_id, str):
        raise LiveEventInvalid("run_id must be a string or None")
    data = event.get("data", {})
    if not isinstance(data, dict):
        raise LiveEventInvalid("data must be a JSON object")
    live = LiveEvent(conversation_id, kind, run_id, data)
    try:
        size = len(encode_live_body(live))
    except (TypeError, ValueError) as exc:
        raise LiveEventInvalid(f"live event data is not JSON: {exc}") from None
    if size > MAX_LIVE_BYTES:
        raise LiveEventTooLarge(f"live event of {size} bytes exceeds {MAX_LIVE_BYTES}")
    return live
