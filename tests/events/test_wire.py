"""NOTIFY payloads: per-schema filtering, chunking of large live events, reassembly."""

from __future__ import annotations

import json

from kaizen_server_extension.events import LiveEvent
from kaizen_server_extension.events.wire import (
    NOTIFY_LIMIT,
    LiveAssembler,
    decode_journal,
    encode_live,
)


def _event(text: str) -> LiveEvent:
    return LiveEvent("room1", "answer.delta", "run1", {"text": text})


def test_journal_notices_are_read_for_our_schema_only() -> None:
    payload = json.dumps({"n": "kz_a", "c": "room1", "s": 42})
    assert decode_journal(payload, "kz_a") == ("room1", 42)
    assert decode_journal(payload, "kz_b") is None
    for junk in ("", "nope", "[]", '{"n": "kz_a"}', '{"n": "kz_a", "c": 1, "s": 2}'):
        assert decode_journal(junk, "kz_a") is None


def test_a_small_live_event_is_one_payload() -> None:
    payloads = encode_live(_event("hi"), schema="kz_a", origin="A", event_id=1)
    assert len(payloads) == 1
    assert LiveAssembler("kz_a", "B").feed(payloads[0]) == _event("hi")


def test_a_large_live_event_is_split_within_the_limit_and_reassembled() -> None:
    event = _event("ü€ and \"quotes\" \\ " * 2000)  # escapes make the JSON longer still
    payloads = encode_live(event, schema="kz_a", origin="A", event_id=7)
    assert len(payloads) > 1
    assert all(len(p.encode("utf-8")) <= NOTIFY_LIMIT for p in payloads)
    receiver = LiveAssembler("kz_a", "B")
    assert [receiver.feed(p) for p in payloads[:-1]] == [None] * (len(payloads) - 1)
    assert receiver.feed(payloads[-1]) == event


def test_own_and_foreign_schema_payloads_are_ignored() -> None:
    payload = encode_live(_event("hi"), schema="kz_a", origin="A", event_id=1)[0]
    assert LiveAssembler("kz_a", "A").feed(payload) is None  # our own echo
    assert LiveAssembler("kz_b", "B").feed(payload) is None  # another install's


def test_an_incomplete_event_is_dropped_whole_and_the_next_one_still_arrives() -> None:
    big = encode_live(_event("x" * 20000), schema="kz_a", origin="A", event_id=1)
    small = encode_live(_event("next"), schema="kz_a", origin="A", event_id=2)
    receiver = LiveAssembler("kz_a", "B")
    assert receiver.feed(big[0]) is None
    assert receiver.feed(big[2]) is None  # chunk 1 went missing
    assert receiver.feed(big[-1]) is None
    assert receiver.dropped >= 1
    assert receiver.feed(small[0]) == _event("next")
    assert receiver.feed("garbage") is None
