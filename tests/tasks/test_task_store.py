"""The database side of durable tasks, per backend: a due time fires once however many
replicas race for it, a crash between firing and acceptance is finished exactly once, missed
due times are coalesced, and a run's task authority is read live (R-054, R-057, R-059)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.protocol.errors import MemberSafeError, NotFound, SchemaViolation
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import new_id
from kaizen_server_extension.store.tasks import TaskStore, next_slot


async def _room(store: Store, owner: str = "alice", shared: bool = False) -> str:
    await store.members.ensure(owner)
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    return (await store.conversations.create(owner, "general", "room", shared)).id


async def _count(store: Store, model: type[m.Base], **where: object) -> int:
    async with store.transaction() as tx:
        query = select(func.count()).select_from(model)
        for column, value in where.items():
            query = query.where(getattr(model, column) == value)
        return int((await tx.session.execute(query)).scalar_one())


def _second_replica(store: Store) -> Store:
    """Another replica's store on the same database: its own sessions, connections and
    (SQLite) writer gate, over the same engine."""
    return Store(store.engine)


async def test_a_due_time_fires_once_however_many_replicas_race(store: Store) -> None:
    room = await _room(store)
    tasks = TaskStore(store)
    due = datetime.now(UTC) - timedelta(seconds=1)
    task = await tasks.create("alice", conversation_id=room, name="daily", prompt="numbers?",
                              interval_seconds=3600, first_run_at=due)
    other = _second_replica(store)
    racers = [TaskStore(store) for _ in range(4)] + [TaskStore(other) for _ in range(4)]
    fired = await asyncio.gather(*(r.fire_due(task.id, due) for r in racers))
    winners = [f for f in fired if f is not None]
    assert len(winners) == 1 and winners[0].run_id is not None
    assert await _count(store, m.TaskFiring, task_id=task.id) == 1
    assert await _count(store, m.AcceptedInput, conversation_id=room) == 1
    moved = await tasks.get_for("alice", task.id)
    assert moved.next_due_at == due + timedelta(hours=1)
    # The database itself refuses a second firing of that due time.
    with pytest.raises(IntegrityError):
        async with store.transaction() as tx:
            tx.session.add(m.TaskFiring(
                id=new_id(), task_id=task.id, key=f"due:{due.isoformat()}", kind="scheduled",
                posture="task_run", due_at=due, task_version=1, created_at=due))


@pytest.mark.rule("R-054")
async def test_a_crash_between_firing_and_acceptance_is_finished_exactly_once(
        store: Store) -> None:
    room = await _room(store)
    tasks = TaskStore(store)
    task = await tasks.create("alice", conversation_id=room, name="t", prompt="numbers?")
    # The writer committed the firing and died before accepting its input.
    past = datetime.now(UTC) - timedelta(minutes=1)
    async with store.transaction() as tx:
        tx.session.add(m.TaskFiring(id="f" * 32, task_id=task.id, key="run_now:crashed",
                                    kind="run_now", posture="task_run", due_at=past,
                                    task_version=1, created_at=past))
    (orphan,) = await tasks.unfinished_firings()
    # Two replicas find it at once, and one of them twice: one input, one run.
    other = _second_replica(store)
    done = await asyncio.gather(tasks.complete(orphan), TaskStore(other).complete(orphan),
                                tasks.complete(orphan))
    assert len({d.run_id for d in done}) == 1 and done[0].run_id is not None
    assert await _count(store, m.AcceptedInput, conversation_id=room) == 1
    assert await tasks.unfinished_firings() == []
    assert await tasks.posture_of(str(done[0].run_id)) == "task_run"


async def test_missed_due_times_are_coalesced_into_one_firing(store: Store) -> None:
    room = await _room(store)
    tasks = TaskStore(store)
    now = datetime.now(UTC)
    due = now - timedelta(minutes=3, seconds=30)  # 3.5 intervals of 60 s ago
    task = await tasks.create("alice", conversation_id=room, name="t", prompt="numbers?",
                              interval_seconds=60, first_run_at=due)
    assert [t for t, _ in await tasks.due(now)] == [task.id]
    firing = await tasks.fire_due(task.id, due, now)
    assert firing is not None and firing.due_at == due
    after = await tasks.get_for("alice", task.id)
    assert after.missed_firings == 3
    assert after.next_due_at == due + timedelta(minutes=4)
    assert after.next_due_at is not None and after.next_due_at > now
    assert await tasks.due(now) == []
    assert await _count(store, m.TaskFiring, task_id=task.id) == 1


def test_next_slot_arithmetic() -> None:
    due = datetime(2026, 1, 1, 8, tzinfo=UTC)
    assert next_slot(due, 3600, due - timedelta(seconds=1)) == (due, 0)
    assert next_slot(due, 3600, due) == (due + timedelta(hours=1), 0)
    assert next_slot(due, 3600, due + timedelta(hours=2, minutes=1)) == \
        (due + timedelta(hours=3), 2)


@pytest.mark.rule("R-057")
async def test_task_authority_is_read_live_and_gone_after_edit_delete_or_leaving(
        store: Store) -> None:
    room = await _room(store, shared=True)
    await store.members.ensure("bob")
    await store.conversations.add_participant(room, "alice", "bob")
    tasks = TaskStore(store)

    async def fired_run(owner: str) -> tuple[str, str]:
        task = await tasks.create(owner, conversation_id=room, name="t", prompt="numbers?")
        firing = await tasks.fire_now(owner, task.id, kind="run_now")
        assert firing.run_id is not None
        return task.id, firing.run_id

    edited, run = await fired_run("alice")
    assert await tasks.current_authority(run, "alice") is not None
    assert await tasks.current_authority(run, "bob") is None  # never another member's
    await tasks.update("alice", edited, prompt="something else")
    assert await tasks.current_authority(run, "alice") is None  # the edit withdrew it

    deleted, run = await fired_run("alice")
    await tasks.delete("alice", deleted)
    assert await tasks.current_authority(run, "alice") is None
    # The run keeps its posture: it does not become a chat run with full authority.
    assert await tasks.posture_of(run) == "task_run"

    _, run = await fired_run("bob")
    assert await tasks.current_authority(run, "bob") is not None
    await store.conversations.remove_participant(room, "alice", "bob")
    assert await tasks.current_authority(run, "bob") is None


@pytest.mark.rule("R-059", "R-053")
async def test_tasks_are_owner_bound_and_their_invariants_live_in_the_schema(
        store: Store) -> None:
    room = await _room(store)
    await store.members.ensure("bob")
    tasks = TaskStore(store)
    task = await tasks.create("alice", conversation_id=room, name="t", prompt="p")
    for attempt in (tasks.get_for("bob", task.id), tasks.delete("bob", task.id),
                    tasks.fire_now("bob", task.id, kind="run_now"),
                    tasks.update("bob", task.id, name="mine")):
        with pytest.raises(NotFound):
            await attempt
    with pytest.raises(NotFound):  # nor a task in a room bob is not in
        await tasks.create("bob", conversation_id=room, name="t", prompt="p")
    for bad in ({"interval_seconds": 59}, {"name": " "}, {"prompt": ""}):
        with pytest.raises(SchemaViolation):
            await tasks.create("alice", **{"conversation_id": room, "name": "t",
                                           "prompt": "p", **bad})  # type: ignore[arg-type]
    now = datetime.now(UTC)
    # The database refuses what Python would: a short cadence, a due paused task, and a
    # safe test that does not run in the test posture.
    for row in (
        m.Task(id=new_id(), owner="alice", conversation_id=room, name="t", prompt="p",
               interval_seconds=10, status="active", version=1, created_at=now,
               updated_at=now),
        m.Task(id=new_id(), owner="alice", conversation_id=room, name="t", prompt="p",
               interval_seconds=60, next_due_at=now, status="paused", version=1,
               created_at=now, updated_at=now),
        m.TaskFiring(id=new_id(), task_id=task.id, key="k", kind="safe_test",
                     posture="task_run", due_at=now, task_version=1, created_at=now),
    ):
        with pytest.raises(IntegrityError):
            async with store.transaction() as tx:
                tx.session.add(row)
    assert await _count(store, m.Task) == 1


@pytest.mark.rule("R-059", "R-188")
async def test_the_task_tools_act_as_the_runs_member_in_the_runs_room_only(
        store: Store) -> None:
    import dataclasses

    from kaizen_plugins.tasks import inspect_tasks, manage_tasks

    from kaizen_server_extension.host.task_tools import TaskTools
    from kaizen_server_extension.host.tool_backend import RunToolContext
    from kaizen_server_extension.tools.services import ToolServices
    from tests.policy.fakes import BUNDLE

    alice_room = await _room(store)
    bob_room = await _room(store, owner="bob")
    woken: list[str] = []
    service = TaskTools(TaskStore(store), woken.append)
    alices = await TaskStore(store).create("alice", conversation_id=alice_room, name="a",
                                           prompt="alice's numbers")
    bob = RunToolContext(dataclasses.replace(BUNDLE, member="bob", conversation_id=bob_room),
                         ToolServices(tasks=service))
    # bob's turn names alice's task: it does not exist for him, whatever the action.
    for action in ("delete", "run_now", "pause", "update"):
        with pytest.raises(MemberSafeError) as refused:
            await manage_tasks.impl(bob, action=action, task_id=alices.id, name="mine")
        assert refused.value.code == "task_not_found"
    listed = await inspect_tasks.impl(bob)
    assert listed == {"tasks": []}
    # What bob creates is his, in the room his run is in; no argument could say otherwise.
    made = await manage_tasks.impl(bob, action="create", name="b", prompt="bob's numbers")
    assert made["task"]["conversation_id"] == bob_room
    assert [t.owner for t in await TaskStore(store).list_for("bob")] == ["bob"]
    assert (await TaskStore(store).get_for("alice", alices.id)).version == 1  # untouched
    assert woken == []
