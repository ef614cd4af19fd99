"""The database side of crash recovery, per backend: taking a stale run over is a
compare-and-set (one replica wins), fences the old holder out, and a recovery that lost the
run meanwhile writes nothing. Plus the journal reading a recovery resumes from."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kaizen_server_extension.lanes.resume import (
    INTERRUPTED_CONTENT,
    RECOVERY_EVENTS,
    DanglingCall,
    RunJournal,
)
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.runtime.port import CorrectionRule
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.records import EventRecord, RunRecord
from kaizen_server_extension.store.runs import RunLane

SHORT = timedelta(milliseconds=1)


async def _stale_run(store: Store) -> tuple[RunLane, RunRecord]:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    room = await store.conversations.create("alice", "general", "room", False)
    await store.inputs.accept(room.id, "alice", "hi", kind="message", idempotency_key=None)
    lane = RunLane(store)
    run = await lane.claim_next(room.id, "dead-holder", SHORT)
    assert run is not None
    await asyncio.sleep(0.05)
    return lane, run


async def _types(lane: RunLane, run: RunRecord) -> list[str]:
    events = await lane.run_events(run.id, run.conversation_id,
                                   ("tool.settled", "run.resumed", "run.terminal"))
    return [e.type for e in events]


@pytest.mark.rule("R-014", "R-027")
async def test_two_replicas_taking_over_one_stale_run_only_one_wins(store: Store) -> None:
    lane, run = await _stale_run(store)
    stale = await lane.stale_runs()
    assert [s.id for s in stale] == [run.id]
    won = await asyncio.gather(lane.take_over(stale[0], "replica-a", timedelta(seconds=30)),
                               lane.take_over(stale[0], "replica-b", timedelta(seconds=30)))
    winners = [w for w in won if w is not None]
    assert len(winners) == 1
    assert winners[0].fence == run.fence + 1 and winners[0].status == "running"
    # The taken-over run holds a fresh lease: no longer stale, not taken over again.
    assert await lane.stale_runs() == []
    assert await lane.take_over(winners[0], "replica-c", timedelta(seconds=30)) is None
    # The dead holder's fence matches nothing any more.
    assert not await lane.extend_lease(run.id, run.fence, timedelta(seconds=30))
    async with store.transaction() as tx:
        assert await lane.check_live(tx, run.id, run.fence) is None


async def test_a_live_lease_is_not_taken_over(store: Store) -> None:
    lane, run = await _stale_run(store)
    assert await lane.extend_lease(run.id, run.fence, timedelta(seconds=30))
    assert await lane.take_over(run, "replica-a", timedelta(seconds=30)) is None


@pytest.mark.rule("R-014")
async def test_a_recovery_that_lost_the_run_writes_nothing(store: Store) -> None:
    lane, run = await _stale_run(store)
    taken = await lane.take_over(run, "replica-a", timedelta(seconds=30))
    assert taken is not None
    rebuilt = [DanglingCall("c1", "slow_lookup", 1).rebuilt(Capability.READ)]
    # The member cancels before the recovery writes: no rebuilt result, no resumption.
    await lane.cancel(run.id, "alice")
    assert not await lane.close_dangling(taken.id, taken.fence, rebuilt, "kaizen",
                                         resumed={"fence": taken.fence})
    assert await _types(lane, run) == ["run.terminal"]


@pytest.mark.rule("R-014", "R-264")
async def test_a_recovered_terminal_is_written_once(store: Store) -> None:
    lane, run = await _stale_run(store)
    taken = await lane.take_over(run, "replica-a", timedelta(seconds=30))
    assert taken is not None
    rebuilt = [DanglingCall("c1", "slow_update", 1).rebuilt(Capability.WRITE)]
    terminal = ("failed", "interrupted", {"dangling_calls": 1})
    assert await lane.close_dangling(taken.id, taken.fence, rebuilt, "kaizen",
                                     terminal=terminal)
    assert not await lane.close_dangling(taken.id, taken.fence, rebuilt, "kaizen",
                                         terminal=terminal)
    assert not await lane.settle(run.id, "completed", "answered", "alice")
    assert await _types(lane, run) == ["tool.settled", "run.terminal"]


# --- reading the journal back ----------------------------------------------------------------


def _events(*items: tuple[str, dict[str, Any]]) -> list[EventRecord]:
    at = datetime.now(UTC)
    return [EventRecord("conv", seq, "run", kind, "alice", at, data)
            for seq, (kind, data) in enumerate(items, start=1)]


RULE = CorrectionRule("no-guess", "i guess", "Do not guess; check first.")


def test_the_journal_reading_finds_dangling_calls_and_rebuilds_committed_rounds() -> None:
    journal = RunJournal.read(_events(
        ("model.step.started", {"step": 1, "attempt": 1, "synthesis": False}),
        ("correction.applied", {"step": 1, "rule_id": "no-guess", "attempt": 1}),
        ("model.step.started", {"step": 2, "attempt": 1, "synthesis": False}),
        ("tool.requested", {"step": 2, "call_id": "a", "name": "search",
                            "arguments": {"q": "x"}}),
        ("tool.settled", {"step": 2, "call_id": "a", "name": "search", "outcome": "ok",
                          "capability": "read", "content": "found x"}),
        ("model.step.started", {"step": 3, "attempt": 1, "synthesis": False}),
        ("tool.requested", {"step": 3, "call_id": "b", "name": "search",
                            "arguments": {"q": "y"}}),
    ))
    assert set(RECOVERY_EVENTS) >= {"tool.requested", "tool.settled"}
    assert journal.dangling == (DanglingCall("b", "search", 3),)
    assert journal.steps_started == 3 and not journal.synthesis_started
    assert journal.answer is None and not journal.turn_closed

    point = journal.resume_point([journal.dangling[0].rebuilt(Capability.READ)], [RULE])
    assert point is not None
    assert [(m.role, m.content) for m in point.messages] == [
        ("system", "Do not guess; check first."),
        ("assistant", ""), ("tool", "found x"),
        ("assistant", ""), ("tool", INTERRUPTED_CONTENT)]
    assert point.messages[1].tool_calls[0].arguments == '{"q": "x"}'
    assert (point.rounds_used, point.corrections_used, point.steps_started) == (3, 1, 3)
    assert [r.outcome.value for r in point.results] == ["ok", "error"]
    assert point.results[0].evidence and not point.results[1].evidence
    assert point.required_attempted


@pytest.mark.rule("R-020")
def test_a_correction_rule_unknown_to_the_recovery_prevents_resuming() -> None:
    journal = RunJournal.read(_events(
        ("correction.applied", {"step": 1, "rule_id": "no-guess", "attempt": 1})))
    assert journal.resume_point([], [RULE]) is not None
    assert journal.resume_point([], [CorrectionRule("other", "x", "y")]) is None


def test_a_committed_answer_and_a_started_synthesis_are_seen() -> None:
    journal = RunJournal.read(_events(
        ("model.step.started", {"step": 4, "attempt": 1, "synthesis": True}),
        ("answer.committed", {"step": 4, "text": "Final."})))
    assert journal.synthesis_started and journal.answer == "Final."
    assert journal.dangling == ()


async def _held_run(store: Store, owner: str) -> tuple[RunLane, RunRecord]:
    """A run claimed by ``owner`` with a long, live lease."""
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    room = await store.conversations.create("alice", "general", "room", False)
    await store.inputs.accept(room.id, "alice", "hi", kind="message", idempotency_key=None)
    lane = RunLane(store)
    run = await lane.claim_next(room.id, owner, timedelta(hours=1))
    assert run is not None and run.lease_owner == owner
    return lane, run


def _dead_pid() -> int:
    """A pid of this host that no process has (a child that already exited)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.rule("R-014")
async def test_a_run_of_a_dead_process_of_this_host_is_taken_over_before_its_lease(
        store: Store) -> None:
    """A restarted server does not wait out the lease of the process it replaced."""
    from kaizen_server_extension.store.runs import this_host

    dead = f"{this_host()}:{_dead_pid()}:deadbeef"
    lane, run = await _held_run(store, dead)
    orphans = await lane.orphaned_runs()
    assert [r.id for r in orphans] == [run.id]
    taken = await lane.take_over(orphans[0], "taker", timedelta(seconds=30), holder_gone=True)
    assert taken is not None and taken.fence == run.fence + 1 and taken.lease_owner == "taker"
    # Once: the next look finds nothing, and a second taker loses the compare-and-set.
    assert await lane.orphaned_runs() == []
    assert await lane.take_over(orphans[0], "late", timedelta(seconds=30),
                                holder_gone=True) is None


@pytest.mark.rule("R-014")
async def test_a_live_holder_is_never_an_orphan(store: Store) -> None:
    import os
    import socket

    from kaizen_server_extension.store.runs import this_host

    # This very process; a dead pid under the same host name in another PID namespace (a
    # container's); another host's process; a holder that claims no liveness.
    for owner in (f"{this_host()}:{os.getpid()}:cafe0001",
                  f"{socket.gethostname()}~4026530000~other:{_dead_pid()}:cafe0003",
                  "another-host:1:cafe0002", "legacy-holder"):
        lane, run = await _held_run(store, owner)
        assert run.id not in {r.id for r in await lane.orphaned_runs()}
        # Nor can a takeover claiming the holder is gone take a live lease that way
        # from someone it did not find gone (it names the holder it saw).
        assert await lane.take_over(
            dataclasses.replace(run, lease_owner="someone-else"), "taker",
            timedelta(seconds=30), holder_gone=True) is None
        await lane.settle(run.id, "cancelled", "test", "alice")


@pytest.mark.postgres
async def test_a_live_owner_whose_liveness_lock_is_released_is_an_orphan(
        store: Store) -> None:
    """PostgreSQL: a ``…:live`` holder is judged by its session advisory lock, which the
    database releases the moment the holder's connection ends."""
    import asyncpg

    from kaizen_server_extension.events.postgres import asyncpg_dsn
    from kaizen_server_extension.store.runs import LIVE_OWNER_SUFFIX, LIVENESS_LOCK_NAMESPACE
    from tests.conftest import POSTGRES_URL

    if store.engine.dialect.name != "postgresql":
        pytest.skip("the liveness lock is PostgreSQL's")
    owner = "another-host:4242:abcd" + LIVE_OWNER_SUFFIX
    holder = await asyncpg.connect(asyncpg_dsn(POSTGRES_URL))
    await holder.execute("SELECT pg_advisory_lock($1, hashtext($2) & 2147483647)",
                         LIVENESS_LOCK_NAMESPACE, owner)
    try:
        lane, run = await _held_run(store, owner)
        assert await lane.orphaned_runs() == []  # the holder's lock is held: alive
    finally:
        await holder.close()  # the holder's process is gone; so is its lock
    orphans = await lane.orphaned_runs()
    assert [r.id for r in orphans] == [run.id]
    taken = await lane.take_over(orphans[0], "taker", timedelta(seconds=30), holder_gone=True)
    assert taken is not None and taken.fence == run.fence + 1
