"""The in-process bus: routing, de-duplication, the slow-subscriber policy, live bounds."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from kaizen_server_extension.events import (
    MAX_LIVE_BYTES,
    EventBus,
    JournalAppended,
    LiveEvent,
    LiveEventInvalid,
    LiveEventTooLarge,
    Resync,
)
from kaizen_server_extension.events.bus import Subscription
from kaizen_server_extension.events.messages import BusMessage
from kaizen_server_extension.store.records import EventRecord


def _record(room: str, seq: int) -> EventRecord:
    return EventRecord(room, seq, None, "input.accepted", "alice", datetime.now(UTC), {})


def _drain(sub: Subscription) -> list[BusMessage]:
    out = []
    while sub.pending():
        out.append(sub._queue.get_nowait())
    return out


async def test_notices_reach_only_that_conversations_subscribers() -> None:
    bus = EventBus()
    with bus.subscribe("a") as a1, bus.subscribe("a") as a2, bus.subscribe("b") as b:
        bus.publish_appended([_record("a", 1), _record("a", 2), _record("b", 7)])
        assert _drain(a1) == _drain(a2) == [JournalAppended("a", 2)]
        assert _drain(b) == [JournalAppended("b", 7)]
    assert bus.subscriber_count() == 0


async def test_an_old_or_repeated_notice_is_not_delivered_again() -> None:
    # On PostgreSQL an append is announced twice (after commit here, then NOTIFY's echo).
    bus = EventBus()
    with bus.subscribe("a") as sub:
        bus.publish_durable("a", 3)
        bus.publish_durable("a", 3)
        bus.publish_durable("a", 2)
        bus.publish_durable("a", 4)
        assert _drain(sub) == [JournalAppended("a", 3), JournalAppended("a", 4)]


async def test_a_slow_subscriber_is_told_to_resync_and_never_blocks_publishers() -> None:
    bus = EventBus(queue_size=4)
    with bus.subscribe("a") as slow, bus.subscribe("a") as fast:
        received: list[BusMessage] = []
        for seq in range(1, 11):  # ten notices and a live event: more than the queue holds
            bus.publish_durable("a", seq)
            received += _drain(fast)  # this one keeps up
        live = bus.publish_live("a", {"type": "answer.delta", "data": {"text": "x"}})
        received += _drain(fast)
        assert received == [*(JournalAppended("a", s) for s in range(1, 11)), live]
        # The slow one lost what it had not read, was told so, and still gets what is new.
        messages = _drain(slow)
        assert isinstance(messages[0], Resync)
        assert messages[-1] == live
        assert slow.overflows >= 1 and fast.overflows == 0
        assert len(messages) <= 4


async def test_live_events_are_validated_and_bounded() -> None:
    bus = EventBus()
    with bus.subscribe("a") as sub:
        event = bus.publish_live("a", {"type": "thinking.delta", "run_id": "r1",
                                       "data": {"text": "hmm"}})
        assert _drain(sub) == [event]
        assert event.frame() == {"type": "thinking.delta", "live": True,
                                 "conversation_id": "a", "run_id": "r1",
                                 "data": {"text": "hmm"}}
        with pytest.raises(LiveEventTooLarge):
            bus.publish_live("a", {"type": "answer.delta",
                                   "data": {"text": "x" * MAX_LIVE_BYTES}})
        bad_events: list[dict[str, Any]] = [
            {"data": {}}, {"type": "", "data": {}}, {"type": "t", "data": []},
            {"type": "t", "extra": 1}, {"type": "t", "data": {"x": object()}},
            {"type": "t", "run_id": 5}]
        for bad in bad_events:
            with pytest.raises(LiveEventInvalid):
                bus.publish_live("a", bad)
        assert _drain(sub) == []


async def test_a_remote_publisher_gets_live_events_but_not_remote_ones() -> None:
    sent: list[LiveEvent] = []

    class Remote:
        def send_live(self, event: LiveEvent) -> None:
            sent.append(event)

    bus = EventBus()
    bus.attach_remote(Remote())
    with bus.subscribe("a") as sub:
        mine = bus.publish_live("a", {"type": "answer.delta", "data": {}})
        theirs = LiveEvent("a", "answer.delta", None, {"from": "elsewhere"})
        bus.deliver_remote_live(theirs)
        assert sent == [mine]  # never echoed back out
        assert _drain(sub) == [mine, theirs]


async def test_resync_all_reaches_every_subscriber() -> None:
    bus = EventBus()
    with bus.subscribe("a") as a, bus.subscribe("b") as b:
        bus.resync_all("listener reconnected")
        assert _drain(a) == _drain(b) == [Resync("listener reconnected")]


async def test_publishing_from_another_thread_is_delivered_on_the_loop() -> None:
    bus = EventBus()
    with bus.subscribe("a") as sub:
        thread = threading.Thread(target=lambda: bus.publish_live(
            "a", {"type": "answer.delta", "data": {"text": "from a thread"}}))
        thread.start()
        thread.join()
        async with asyncio.timeout(5):
            message = await sub.get()
        assert isinstance(message, LiveEvent) and message.data == {"text": "from a thread"}


async def test_a_closed_subscription_receives_nothing() -> None:
    bus = EventBus()
    sub = bus.subscribe("a")
    sub.close()
    sub.close()  # idempotent
    bus.publish_durable("a", 1)
    assert sub.pending() == 0 and bus.subscriber_count("a") == 0


async def test_the_run_hosts_publish_live_lands_on_the_bus_and_never_fails_a_run() -> None:
    bus = EventBus()
    with bus.subscribe("a") as sub:
        bus.publish_run_live("a", "answer.delta", {"run_id": "r", "text": "hi"})
        bus.publish_run_live("a", "answer.delta", {"run_id": "r", "text": "x" * MAX_LIVE_BYTES})
        assert _drain(sub) == [LiveEvent("a", "answer.delta", "r", {"text": "hi"})]
