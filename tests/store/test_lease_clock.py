"""Leases run on the database's clock: a replica whose own clock is off neither hands its live
run to another replica nor keeps a dead one."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from kaizen_server_extension.store import Store
from kaizen_server_extension.store import runs as runs_module
from kaizen_server_extension.store.records import RunRecord
from kaizen_server_extension.store.runs import RunLane


async def _queued_room(store: Store) -> str:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=[])
    room = await store.conversations.create("alice", "general", "room", False)
    await store.inputs.accept(room.id, "alice", "hi", kind="message", idempotency_key=None)
    return room.id


def _skew(monkeypatch: pytest.MonkeyPatch, by: timedelta) -> None:
    """This process's clock, as the lane sees it, is off by ``by``."""
    monkeypatch.setattr(runs_module, "utcnow", lambda: datetime.now(UTC) + by)


async def test_a_replica_whose_clock_is_behind_does_not_lose_its_live_run(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    room = await _queued_room(store)
    lane = RunLane(store)
    _skew(monkeypatch, -timedelta(hours=1))
    run = await lane.claim_next(room, "slow-clock", timedelta(seconds=30))
    assert run is not None
    assert await lane.extend_lease(run.id, run.fence, timedelta(seconds=30))
    monkeypatch.undo()
    # Another replica with a correct clock: the lease has 30 s left, nothing is stale.
    assert await lane.stale_runs() == []
    assert await lane.take_over(run, "kaizen", timedelta(seconds=30)) is None


async def test_a_replica_whose_clock_is_ahead_does_not_keep_a_dead_run(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    room = await _queued_room(store)
    lane = RunLane(store)
    _skew(monkeypatch, timedelta(hours=1))
    run = await lane.claim_next(room, "fast-clock", timedelta(milliseconds=1))
    assert run is not None
    monkeypatch.undo()
    await asyncio.sleep(0.05)
    stale: list[RunRecord] = await lane.stale_runs()
    assert [r.id for r in stale] == [run.id]
    assert await lane.take_over(stale[0], "kaizen", timedelta(seconds=30)) is not None
