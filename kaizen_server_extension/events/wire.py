"""NOTIFY payloads between server processes sharing one PostgreSQL database.

Channels are database-wide while Kaizen installs are per schema, so every payload names its
schema and receivers ignore other schemas.

* ``kaizen_journal`` (durable): ``{"n": schema, "c": conversation_id, "s": seq}``, written by
  the store inside the appending transaction (``Tx.append_event``), so it is delivered if and
  only if the append commits.
* ``kaizen_live`` (live-only): ``<header JSON>\\n<chunk>``. The event's ASCII JSON is cut into
  chunks so each payload stays within ``NOTIFY_LIMIT`` bytes (PostgreSQL refuses 8000+);
  the header ``{"n", "o": origin, "c", "i": id, "k": index, "t": total}`` lets the receiver
  reassemble. All chunks of one event are sent in one transaction by one sender, so they
  arrive together and in order; an incomplete sequence is dropped, never half-delivered.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kaizen_server_extension.events.messages import LiveEvent, encode_live_body
from kaizen_server_extension.store.core import JOURNAL_CHANNEL

__all__ = ["JOURNAL_CHANNEL", "LIVE_CHANNEL", "NOTIFY_LIMIT", "LiveAssembler",
           "decode_journal", "encode_live"]

LIVE_CHANNEL = "kaizen_live"
NOTIFY_LIMIT = 7900
# Room left for the header in every chunk; ids are short (32 hex), schemas <= 63 chars.
HEADER_RESERVE = 600
CHUNK_CHARS = NOTIFY_LIMIT - HEADER_RESERVE
MAX_PARTIAL_ORIGINS = 64


def decode_journal(payload: str, schema: str) -> tuple[str, int] | None:
    """``(conversation_id, seq)`` of a journal notice for ``schema``; None otherwise."""
    try:
        body = json.loads(payload)
        if body.get("n") != schema:
            return None
        conversation_id, seq = body["c"], body["s"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(conversation_id, str) or not isinstance(seq, int):
        return None
    return conversation_id, seq


def encode_live(event: LiveEvent, *, schema: str, origin: str, event_id: int) -> list[str]:
    """The NOTIFY payloads that carry one live event (one unless it is large)."""
    body = encode_live_body(event)
    chunks = [body[i:i + CHUNK_CHARS] for i in range(0, len(body), CHUNK_CHARS)] or [""]
    payloads = []
    for index, chunk in enumerate(chunks):
        header = json.dumps({"n": schema, "o": origin, "c": event.conversation_id,
                             "i": event_id, "k": index, "t": len(chunks)},
                            separators=(",", ":"), ensure_ascii=True)
        payload = f"{header}\n{chunk}"
        if len(payload.encode("utf-8")) > NOTIFY_LIMIT:
            raise ValueError("live event header does not fit a NOTIFY payload")
        payloads.append(payload)
    return payloads


@dataclass
class _Partial:
    event_id: int
    total: int
    conversation_id: str
    chunks: list[str] = field(default_factory=list)


class LiveAssembler:
    """Reassembles chunked live events, per origin (each origin has one sender)."""

    def __init__(self, schema: str, own_origin: str) -> None:
        self.schema = schema
        self.own_origin = own_origin
        self.dropped = 0
        self._partials: OrderedDict[str, _Partial] = OrderedDict()

    def feed(self, payload: str) -> LiveEvent | None:
        """The complete event once its last chunk arrives; None until then (or if it is
        ours, another schema's, or malformed)."""
        header_text, sep, chunk = payload.partition("\n")
        try:
            header = json.loads(header_text) if sep else None
            if not isinstance(header, dict) or header.get("n") != self.schema:
                return None
            origin, event_id = str(header["o"]), int(header["i"])
            index, total, conversation_id = int(header["k"]), int(header["t"]), header["c"]
        except (ValueError, KeyError, TypeError):
            self.dropped += 1
            return None
        if origin == self.own_origin:
            return None  # delivered in-process when it was published
        if index == 0:
            partial = _Partial(event_id, total, str(conversation_id))
            self._partials[origin] = partial
            self._partials.move_to_end(origin)
            while len(self._partials) > MAX_PARTIAL_ORIGINS:
                self._partials.popitem(last=False)
        else:
            found = self._partials.get(origin)
            if found is None or found.event_id != event_id or len(found.chunks) != index:
                self._partials.pop(origin, None)
                self.dropped += 1
                return None
            partial = found
        partial.chunks.append(chunk)
        if len(partial.chunks) < partial.total:
            return None
        del self._partials[origin]
        return self._decode(partial)

    def _decode(self, partial: _Partial) -> LiveEvent | None:
        try:
            body: Any = json.loads("".join(partial.chunks))
            run_id = body.get("run_id")
            event = LiveEvent(partial.conversation_id, str(body["type"]),
                              None if run_id is None else str(run_id), dict(body["data"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            self.dropped += 1
            return None
        return event
