"""One tool call through the run's host: what is durable when, and what is re-read per call.

A call costs two transactions: ``tool.requested`` is journaled together with the facts the
call's checks need (run claim and fence, audience, roster, approval mode, the tool's admin
policy), and ``tool.settled`` together with the call's audit row. These tests pin down what
that must not change: the dispatched call is durable before the tool runs (so recovery can
close it), every call re-reads its permissions and approval mode, and every call leaves exactly
one audit row, even when its settlement is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select, update

from kaizen_server_extension.host.bundle import resource_digest
from kaizen_server_extension.host.run_host import RunHost
from kaizen_server_extension.host.store_ports import StorePermissions, _bounded_raw
from kaizen_server_extension.host.tool_backend import PipelineToolBackend
from kaizen_server_extension.lanes.resume import RECOVERY_EVENTS, RunJournal
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.errors import RunCancelled
from kaizen_server_extension.protocol.model import StepEvent, StepSnapshot
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.runtime.port import TraceEvent
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.calls import open_call
from kaizen_server_extension.store.runs import Admission, RunLane
from kaizen_server_extension.tools.decorators import tool
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.registry import ToolRegistry
from kaizen_server_extension.tools.types import RoomClass, ToolContext


@dataclass
class _Probe:
    """What the probe tools saw while they ran."""

    store: Store | None = None
    lane: RunLane | None = None
    journal_at_run: list[str] | None = None
    recover_mid_call: bool = False


PROBE = _Probe()


async def _journal_types(store: Store, conversation_id: str) -> list[str]:
    return [e.type for e in await store.journal.read(conversation_id, "alice", limit=500)]


@tool(name="probe_read", capability=Capability.READ, timeout_s=5,
      room_class=RoomClass.AUDIENCE_SAFE_READ)
async def probe_read(ctx: ToolContext, key: str = "") -> dict[str, Any]:
    """Report what the journal holds while this call runs."""
    bundle: AuthorityBundle = ctx.bundle  # type: ignore[attr-defined]
    assert PROBE.store is not None and PROBE.lane is not None
    PROBE.journal_at_run = await _journal_types(PROBE.store, bundle.conversation_id)
    if PROBE.recover_mid_call:
        # The holder "dies" here: its lease runs out and another replica recovers the run.
        async with PROBE.store.transaction() as tx:
            await tx.session.execute(
                update(m.Run).where(m.Run.id == bundle.run_id)
                .values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
        [stale] = await PROBE.lane.stale_runs()
        # What the lane's recovery does for a stale run (lanes/service.py): take it over,
        # rebuild its dangling call from the journal, settle it in one transaction.
        taken = await PROBE.lane.take_over(stale, "kaizen", timedelta(seconds=30))
        assert taken is not None
        journal = RunJournal.read(await PROBE.lane.run_events(
            taken.id, taken.conversation_id, RECOVERY_EVENTS))
        rebuilt = [call.rebuilt(Capability.READ) for call in journal.dangling]
        assert await PROBE.lane.close_dangling(
            taken.id, taken.fence, rebuilt, "kaizen",
            terminal=("failed", "interrupted", {"dangling_calls": len(rebuilt)}))
    return {"key": key, "seen": len(PROBE.journal_at_run)}


@tool(name="private_read", capability=Capability.READ, timeout_s=5,
      room_class=RoomClass.ACTOR_PRIVATE_READ)
async def private_read(ctx: ToolContext) -> dict[str, Any]:
    """Read something only the initiating member may see."""
    return {"private": True}


@tool(name="save_note", capability=Capability.WRITE, timeout_s=5,
      room_class=RoomClass.ACTOR_BOUND_WRITE, write_category=WriteCategory.MEMBER_STORE)
async def save_note(ctx: ToolContext, text: str) -> dict[str, Any]:
    """Save a note in the member's own store."""
    return {"saved": text}


@tool(name="relay_read", capability=Capability.READ, timeout_s=5,
      room_class=RoomClass.AUDIENCE_SAFE_READ)
async def relay_read(ctx: ToolContext) -> Any:
    """Call probe_read through the run's bridge, as a kernel's tools.call would."""
    return await ctx.services.bridge.dispatch("probe_read", {"key": "inner"})  # type: ignore[attr-defined]


TOOLS = (probe_read, private_read, save_note, relay_read)


async def _no_model(snapshot: StepSnapshot) -> AsyncIterator[StepEvent]:
    raise AssertionError("these tests drive the host directly")
    yield  # pragma: no cover


@dataclass
class Turn:
    store: Store
    lane: RunLane
    backend: PipelineToolBackend
    host: RunHost
    bundle: AuthorityBundle

    async def call(self, call_id: str, name: str, arguments: str = "{}") -> ToolCallResult:
        """What the controller does for one call: publish ``tool.requested``, then call."""
        await self.host.publish(self.bundle, TraceEvent("tool.requested", {
            "step": 1, "call_id": call_id, "name": name, "arguments": arguments}))
        return await self.host.call_tool(self.bundle, ToolCallRequest(call_id, name,
                                                                      arguments, 1))

    async def audit_rows(self) -> list[dict[str, Any]]:
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.AuditEvent.data).where(m.AuditEvent.run_id == self.bundle.run_id,
                                                m.AuditEvent.action == "tool.call")
                .order_by(m.AuditEvent.id))).scalars().all()
        return [dict(r) for r in rows]


async def _turn(store: Store, *, shared: bool = False) -> Turn:
    registry = ToolRegistry()
    for item in TOOLS:
        registry.register(item, owner="tests")
    backend = PipelineToolBackend(store, registry, discovery_enabled=False,
                                  metrics=ToolMetrics(CollectorRegistry()))
    await store.members.ensure("alice")
    await store.members.update_settings("alice", approval_mode="never_ask", model=None)
    agent = await store.agents.ensure_system_agent(
        "probe-agent", "Probe", persona="p", mode="chat",
        tool_ceiling=[t.descriptor.name for t in TOOLS])
    room = await store.conversations.create("alice", agent.id, "room", shared=shared)
    await store.inputs.accept(room.id, "alice", "go", kind="message", idempotency_key=None)
    lane = RunLane(store)
    run = await lane.claim_next(room.id, "test", timedelta(seconds=30))
    assert run is not None
    conversation = await store.runs.conversation_of(room.id)
    tools = backend.freeze(agent=agent, conversation=conversation, member="alice",
                           request_text="go")
    bundle = AuthorityBundle(
        run_id=run.id, conversation_id=room.id, input_position=run.input_position,
        member="alice", agent_version_id=agent.version_id,
        audience_version=conversation.audience_version,
        resource_digest=resource_digest(conversation, agent, tools.digest), fence=run.fence)
    assert await lane.admit(run.id, run.fence, Admission(
        agent_version_id=agent.version_id, audience_version=conversation.audience_version,
        resource_digest=bundle.resource_digest, catalog_digest=tools.digest, model="fake",
    ), {"input_position": run.input_position})
    host = RunHost(store=store, lane=lane, bundle=bundle, model_stream=_no_model,
                   call_tool=backend.caller(bundle=bundle, tools=tools,
                                            cancelled=asyncio.Event()),
                   publish_live=lambda conversation, kind, data: None,
                   lease=timedelta(seconds=30), read_tools=tools.read_tools)
    PROBE.store, PROBE.lane, PROBE.journal_at_run = store, lane, None
    PROBE.recover_mid_call = False
    return Turn(store, lane, backend, host, bundle)


async def test_the_dispatched_call_is_journaled_before_the_tool_runs(store: Store) -> None:
    turn = await _turn(store)
    result = await turn.call("c1", "probe_read", '{"key": "k"}')
    assert result.outcome is ToolOutcome.OK
    # A separate transaction, while the tool ran, already saw the committed request.
    assert PROBE.journal_at_run is not None and PROBE.journal_at_run[-1] == "tool.requested"
    types = await _journal_types(store, turn.bundle.conversation_id)
    assert types[-2:] == ["tool.requested", "tool.settled"]
    [audit] = await turn.audit_rows()
    assert audit == {"tool": "probe_read", "call_id": "c1", "outcome": "ok",
                     "raw": {"key": "k", "seen": len(PROBE.journal_at_run)},
                     # A read: no decision was needed, even under Never ask.
                     "authorization": {"by": "not_required", "mode": "never_ask",
                                       "run_id": turn.bundle.run_id}}
    run = await store.runs.get_for(turn.bundle.run_id, "alice")
    assert run.tool_calls == 1


@pytest.mark.rule("R-264")
async def test_a_holder_that_dies_mid_tool_leaves_a_call_recovery_closes(store: Store) -> None:
    turn = await _turn(store)
    PROBE.recover_mid_call = True
    with pytest.raises(RunCancelled):
        await turn.call("c1", "probe_read")
    events = await store.journal.read(turn.bundle.conversation_id, "alice", limit=500)
    settled = [e for e in events if e.type == "tool.settled"]
    # Exactly one settlement: the rebuilt error; the fenced-out holder's own one is refused.
    assert len(settled) == 1
    assert settled[0].data["call_id"] == "c1" and settled[0].data["outcome"] == "error"
    assert settled[0].data["rebuilt"] is True
    assert events[-1].type == "run.terminal" and events[-1].data["reason"] == "interrupted"
    # The call did run, so its audit row is there although its settlement was refused.
    assert [row["call_id"] for row in await turn.audit_rows()] == ["c1"]


@pytest.mark.rule("R-005", "R-204")
async def test_a_revocation_between_two_calls_bites_on_the_second(store: Store) -> None:
    turn = await _turn(store)
    assert (await turn.call("c1", "probe_read")).outcome is ToolOutcome.OK
    await StorePermissions(store).set_policy("probe_read", "alice", False, admin="dave")
    refused = await turn.call("c2", "probe_read", '{"key": "again"}')
    assert refused.outcome is ToolOutcome.ERROR and refused.closes_turn
    assert refused.close_reason == "permission_denied"
    assert [row["outcome"] for row in await turn.audit_rows()] == ["ok", "error"]


async def test_an_everyone_row_and_the_members_own_row_apply_per_call(store: Store) -> None:
    turn = await _turn(store)
    permissions = StorePermissions(store)
    await permissions.set_policy("probe_read", "*", False, admin="dave")
    assert (await turn.call("c1", "probe_read")).close_reason == "permission_denied"
    await permissions.set_policy("probe_read", "alice", True, admin="dave")
    assert (await turn.call("c2", "probe_read")).outcome is ToolOutcome.OK


async def test_an_approval_mode_change_applies_from_the_next_call(store: Store) -> None:
    turn = await _turn(store)
    assert (await turn.call("c1", "save_note", '{"text": "a"}')).outcome is ToolOutcome.OK
    await store.members.update_settings("alice", approval_mode="always_ask", model=None)

    async def deny_when_asked() -> None:
        while True:
            pending = await turn.backend.approvals.list_for("alice", "pending")
            if pending:
                await turn.backend.approvals.decide(pending[0]["id"], "alice", approve=False)
                return
            await asyncio.sleep(0.05)

    denier = asyncio.create_task(deny_when_asked())
    declined = await asyncio.wait_for(turn.call("c2", "save_note", '{"text": "b"}'), 10)
    await denier
    assert declined.outcome is ToolOutcome.ERROR
    assert "declined" in declined.content


async def test_a_private_tool_runs_when_the_roster_is_only_the_initiator(store: Store) -> None:
    turn = await _turn(store)
    assert (await turn.call("c1", "private_read")).outcome is ToolOutcome.OK


async def test_the_call_facts_see_a_shared_roster_and_a_lost_claim(store: Store) -> None:
    turn = await _turn(store, shared=True)
    await store.members.ensure("bob")
    async with store.transaction() as tx:
        # A second participant without an audience bump, to reach the roster check itself.
        tx.session.add(m.Participant(conversation_id=turn.bundle.conversation_id,
                                     member_id="bob", added_at=datetime.now(UTC)))
    opened = await store.run(open_call(turn.bundle.run_id, turn.bundle.fence, "private_read"))
    assert opened is not None
    conversation, facts = opened
    assert conversation == turn.bundle.conversation_id and not facts.only_initiator
    refused = await turn.call("c1", "private_read")
    assert refused.close_reason == "room_admission"

    assert await store.run(open_call(turn.bundle.run_id, turn.bundle.fence + 1, "x")) is None
    run = await store.runs.get_for(turn.bundle.run_id, "alice")
    assert run.tool_calls == 2  # the stale fence counted nothing


async def test_a_bridge_call_inside_a_call_is_audited_on_its_own(store: Store) -> None:
    turn = await _turn(store)
    result = await turn.call("outer", "relay_read")
    assert result.outcome is ToolOutcome.OK
    rows = await turn.audit_rows()
    # The inner call is written when it settles, before the outer call's settlement.
    assert [row["tool"] for row in rows] == ["probe_read", "relay_read"]
    assert rows[0]["call_id"].startswith("bridge-") and rows[1]["call_id"] == "outer"


async def test_a_call_without_a_published_request_still_settles_and_audits(
    store: Store,
) -> None:
    turn = await _turn(store)
    result = await turn.host.call_tool(turn.bundle,
                                       ToolCallRequest("c9", "probe_read", "{}", 1))
    assert result.outcome is ToolOutcome.OK
    assert [row["call_id"] for row in await turn.audit_rows()] == ["c9"]


def test_audit_stores_a_value_json_cannot_hold_as_text() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque"

    assert _bounded_raw({"a": Opaque()}) == {"a": "opaque"}
    assert _bounded_raw({"a": 1}) == {"a": 1}
    assert _bounded_raw(b"bytes") == {"truncated": True, "chars": len('"b\'bytes\'"')}
    assert _bounded_raw("x" * 70_000) == {"truncated": True, "chars": 70_002}


async def test_a_tool_call_costs_two_transactions(store: Store) -> None:
    """The overhead budget (bench/runtime_overhead.py) rests on this: one transaction opens
    the call with its facts, one settles it with its audit row."""
    from sqlalchemy import event

    turn = await _turn(store)
    begun: list[object] = []

    def on_begin(connection: object) -> None:
        begun.append(connection)

    # A first call starts the direct runner's own pool (on PostgreSQL that reads the
    # search_path once through the store's engine).
    assert (await turn.call("c0", "probe_read")).outcome is ToolOutcome.OK
    units_before = store.unit_counts.transactions
    event.listen(store.engine.sync_engine, "begin", on_begin)
    try:
        assert (await turn.call("c1", "probe_read")).outcome is ToolOutcome.OK
    finally:
        event.remove(store.engine.sync_engine, "begin", on_begin)
    # The call's two run as units straight on the driver; the probe tool itself reads the
    # journal once, a read unit (store/reads.py) of its own. No session transaction at all.
    assert store.unit_counts.transactions - units_before == 2 + 1
    assert begun == []
