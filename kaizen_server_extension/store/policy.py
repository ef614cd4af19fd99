"""The store's side of the tool pipeline's ports: authority, permissions, approvals, audit.

Decisions and receipts are compare-and-set updates, so a second decision or a replayed
receipt matches no row (DESIGN.md: one-shot approvals).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    String,
    bindparam,
    func,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from kaizen_server_extension.policy.approvals import ApprovalMode, ApprovalReceipt, ApprovalStatus
from kaizen_server_extension.protocol.authority import AuthorityBundle, AuthorityRejected
from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolOutcome
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store, Tx, audit_insert, new_id, utcnow
from kaizen_server_extension.store.units import Unit, fetch
from kaizen_server_extension.tools.types import RegisteredTool, ResourceVerdict

log = logging.getLogger("kaizen.tools.audit")


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What one tool call's checks read at call time, in one transaction: the one that
    journals its ``tool.requested`` (``open_call``), or else its authority check's own."""

    run_id: str
    member: str
    status: str
    fence: int
    audience_version: int
    approval_mode: str
    # (tool, member or "*") -> allowed
    policies: Mapping[tuple[str, str], bool]
    # The room's roster is exactly the initiating member (actor-private tools, R-218).
    only_initiator: bool
    # The tools whose policy rows were read; None when every tool's were.
    policy_tools: frozenset[str] | None = None

    def allowed(self, tool: str) -> bool | None:
        """The admin policy for ``tool``, or None when these facts did not read it."""
        if self.policy_tools is not None and tool not in self.policy_tools:
            return None
        # The member's own row overrides the everyone row; no row allows.
        own = self.policies.get((tool, self.member))
        if own is not None:
            return own
        return self.policies.get((tool, "*"), True)


# The facts of the call being checked in this task. Each call's authority check reads them
# afresh, so permissions and the approval mode are still resolved per call,
# with one database round trip instead of three.
_CURRENT_CALL: ContextVar[CallFacts | None] = ContextVar("kaizen_call_facts", default=None)

_RUNS = m.Base.metadata.tables[m.Run.__tablename__]
_CONVERSATIONS = m.Base.metadata.tables[m.Conversation.__tablename__]
_MEMBERS = m.Base.metadata.tables[m.Member.__tablename__]
_PARTICIPANTS = m.Base.metadata.tables[m.Participant.__tablename__]
_POLICIES = m.Base.metadata.tables[m.ToolPolicy.__tablename__]


def _roster_counts(conversation: Any, member: Any) -> tuple[Any, Any]:
    """(participants of the run's room, of whom the run's member) as scalar subqueries."""
    everyone = (select(func.count()).select_from(_PARTICIPANTS)
                .where(_PARTICIPANTS.c.conversation_id == conversation)
                .correlate_except(_PARTICIPANTS).scalar_subquery())
    own = (select(func.count()).select_from(_PARTICIPANTS)
           .where(_PARTICIPANTS.c.conversation_id == conversation,
                  _PARTICIPANTS.c.member_id == member)
           .correlate_except(_PARTICIPANTS).scalar_subquery())
    return everyone, own


def _policy_of(member: Any) -> Any:
    return (select(_POLICIES.c.allowed)
            .where(_POLICIES.c.tool == bindparam("b_tool"), _POLICIES.c.member == member)
            .correlate_except(_POLICIES).scalar_subquery())


# SQLite renders RETURNING columns unqualified, and inside a subquery an unqualified
# ``member`` or ``conversation_id`` would name the inner table's own column; the updated row's
# columns are therefore spelled out with their table.
_RUN_CONVERSATION: ColumnElement[str] = literal_column("runs.conversation_id", String())
_RUN_MEMBER: ColumnElement[str] = literal_column("runs.member", String())

# The run's facts and every admin policy row of its member (or everyone), in one statement:
# one row per policy row, or one row with NULL policy columns when there is none. The write
# guard re-reads these immediately before a write executes, so a round trip counts.
_READ_FACTS = (
    select(_RUNS.c.status, _RUNS.c.fence, _RUNS.c.member, _CONVERSATIONS.c.audience_version,
           _MEMBERS.c.approval_mode, *_roster_counts(_RUNS.c.conversation_id, _RUNS.c.member),
           _POLICIES.c.tool, _POLICIES.c.member, _POLICIES.c.allowed)
    .join_from(_RUNS, _CONVERSATIONS, _CONVERSATIONS.c.id == _RUNS.c.conversation_id)
    .join(_MEMBERS, _MEMBERS.c.id == _RUNS.c.member)
    .outerjoin(_POLICIES, or_(_POLICIES.c.member == _RUNS.c.member,
                              _POLICIES.c.member == literal("*")))
    .where(_RUNS.c.id == bindparam("b_run_id"))
)

# A tool call's opening: the run must still be ours (active, same fence: the UPDATE also locks
# the row on PostgreSQL, so a cancel cannot slip in before the journal write in the same
# transaction), its tool-call count goes up, and what the call's checks need comes back with
# it, for the one tool called. One statement instead of a liveness check plus a read.
_OPEN_CALL = (
    update(_RUNS)
    .where(_RUNS.c.id == bindparam("b_run_id"), _RUNS.c.fence == bindparam("b_fence"),
           # Plain comparisons, not IN: no per-execution re-rendering of the SQL text.
           or_(*(_RUNS.c.status == status for status in m.ACTIVE_RUN_STATUSES)))
    .values(tool_calls=_RUNS.c.tool_calls + 1)
    .returning(
        _RUNS.c.conversation_id, _RUNS.c.status, _RUNS.c.fence, _RUNS.c.member,
        select(_CONVERSATIONS.c.audience_version)
        .where(_CONVERSATIONS.c.id == _RUN_CONVERSATION).scalar_subquery(),
        select(_MEMBERS.c.approval_mode).where(_MEMBERS.c.id == _RUN_MEMBER).scalar_subquery(),
        *_roster_counts(_RUN_CONVERSATION, _RUN_MEMBER),
        _policy_of(_RUN_MEMBER),
        _policy_of(literal("*")),
    )
)


def call_facts(run_id: str) -> Unit[CallFacts | None]:
    """The run's facts and every admin policy row of its member (or everyone)."""
    rows = yield from fetch(_READ_FACTS, {"b_run_id": run_id})
    if not rows:
        return None
    status, fence, member, audience, mode, participants, own = rows[0][:7]
    policies = {(tool, who): bool(allowed) for *_facts, tool, who, allowed in rows
                if tool is not None}
    return CallFacts(run_id, member, status, fence, audience, mode, policies,
                     only_initiator=participants == 1 and own == 1)


async def read_call_facts(store: Store, run_id: str) -> CallFacts | None:
    return await store.run(call_facts(run_id), write=False)


def open_call(run_id: str, fence: int, tool: str) -> Unit[tuple[str, CallFacts] | None]:
    """(conversation id, the call's facts) while the run is still ours at ``fence``,
    counting the call; None when it is not (nothing is changed)."""
    rows = yield from fetch(_OPEN_CALL, {"b_run_id": run_id, "b_fence": fence,
                                         "b_tool": tool})
    if not rows:
        return None
    (conversation, status, run_fence, member, audience, mode, participants, own,
     own_policy, everyone_policy) = rows[0]
    policies: dict[tuple[str, str], bool] = {}
    if own_policy is not None:
        policies[(tool, member)] = bool(own_policy)
    if everyone_policy is not None:
        policies[(tool, "*")] = bool(everyone_policy)
    return conversation, CallFacts(
        run_id, member, status, run_fence, audience, mode, policies,
        only_initiator=participants == 1 and own == 1, policy_tools=frozenset({tool}))


@dataclass
class HeldAudit:
    """A tool call's audit row, held for the transaction that journals its settlement."""

    actor: str
    data: dict[str, Any]
    conversation_id: str
    run_id: str

    def unit(self) -> Unit[None]:
        return audit_insert(self.actor, "tool.call", self.data,
                            conversation_id=self.conversation_id, run_id=self.run_id)


@dataclass
class CallScope:
    """One tool call as the run's host dispatches it.

    ``facts`` were read in the transaction that journaled the call's ``tool.requested``, just
    before dispatch; the call's own authority check uses them once (a re-run after an approval
    reads afresh). ``held`` collects the call's audit rows while ``holding``, so the host
    writes them in the transaction that journals ``tool.settled``.
    """

    run_id: str
    call_id: str
    facts: CallFacts | None = None
    held: list[HeldAudit] = field(default_factory=list)
    holding: bool = True

    def take_facts(self, run_id: str) -> CallFacts | None:
        facts, self.facts = self.facts, None
        return facts if facts is not None and facts.run_id == run_id else None

    def release(self) -> list[HeldAudit]:
        """Stop holding and hand over what was held."""
        self.holding = False
        held, self.held = self.held, []
        return held


# Set by the host in the task that publishes ``tool.requested`` and then calls the tool;
# tasks the call starts inherit it, but only the call's own id matches it.
_CALL_SCOPE: ContextVar[CallScope | None] = ContextVar("kaizen_call_scope", default=None)


def begin_call(run_id: str, call_id: str, facts: CallFacts | None = None) -> CallScope:
    """Make a scope for the call current in this task (the host, around one call)."""
    scope = CallScope(run_id, call_id, facts)
    _CALL_SCOPE.set(scope)
    return scope


def current_call(run_id: str, call_id: str) -> CallScope | None:
    scope = _CALL_SCOPE.get()
    if scope is None or scope.run_id != run_id or scope.call_id != call_id:
        return None
    return scope


def end_call() -> None:
    _CALL_SCOPE.set(None)


def audit_rows(rows: list[HeldAudit]) -> Unit[None]:
    for row in rows:
        yield from row.unit()


async def write_audit_rows(store: Store, rows: list[HeldAudit]) -> None:
    """Held audit rows in their own transaction, when no settlement carries them. Never
    raises: the call already happened, so a failing audit is reported, not propagated."""
    if not rows:
        return
    try:
        await store.run(audit_rows(rows))
    except Exception:
        log.exception("could not write the audit rows of tool call(s) in run %s",
                      rows[0].run_id)


class StoreAuthority:
    """Re-checks a bundle against the admitted one and the live run row (R-007, R-222)."""

    def __init__(self, store: Store, admitted: AuthorityBundle) -> None:
        self._store = store
        self._admitted = admitted

    async def verify(self, bundle: AuthorityBundle) -> None:
        differing = self._admitted.differing_fields(bundle)
        if differing:
            raise AuthorityRejected(differing)
        scope = _CALL_SCOPE.get()
        facts = scope.take_facts(bundle.run_id) if scope is not None else None
        if facts is None:
            facts = await read_call_facts(self._store, bundle.run_id)
        _CURRENT_CALL.set(facts)
        if facts is None:
            raise AuthorityRejected(["run_id"])
        stale = []
        if facts.status not in m.ACTIVE_RUN_STATUSES:
            stale.append("status")
        if facts.fence != bundle.fence:
            stale.append("fence")
        if facts.member != bundle.member:
            stale.append("member")
        if facts.audience_version != bundle.audience_version:
            # The roster changed mid-turn: the admitted audience no longer holds.
            stale.append("audience_version")
        if stale:
            raise AuthorityRejected(stale)


def _current_facts(member: str) -> CallFacts | None:
    facts = _CURRENT_CALL.get()
    return facts if facts is not None and facts.member == member else None


def current_call_facts(bundle: AuthorityBundle) -> CallFacts | None:
    """The facts the current call's authority check read, when they are this run's."""
    facts = _current_facts(bundle.member)
    return facts if facts is not None and facts.run_id == bundle.run_id else None


class StorePermissions:
    """Admin tool policy from the database plus the Jupyter authorizer, read on every call."""

    def __init__(self, store: Store, authorize: Any = None) -> None:
        self._store = store
        # ``authorize(member, tool_name) -> bool``: the Jupyter server's Authorizer.
        self._authorize = authorize

    async def allowed(self, member: str, tool_name: str) -> bool:
        if self._authorize is not None and not self._authorize(member, tool_name):
            return False
        facts = _current_facts(member)
        verdict = facts.allowed(tool_name) if facts is not None else None
        if verdict is not None:
            return verdict
        async with self._store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.ToolPolicy.member, m.ToolPolicy.allowed)
                .where(m.ToolPolicy.tool == tool_name,
                       or_(m.ToolPolicy.member == member, m.ToolPolicy.member == "*"))
            )).all()
        policies = {(tool_name, who): bool(ok) for who, ok in rows}
        own = policies.get((tool_name, member))
        return own if own is not None else policies.get((tool_name, "*"), True)

    async def set_policy(self, tool: str, member: str, allowed: bool, admin: str) -> None:
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.ToolPolicy, (tool, member))
            if row is None:
                tx.session.add(m.ToolPolicy(tool=tool, member=member, allowed=allowed,
                                            updated_by=admin, updated_at=utcnow()))
            else:
                row.allowed, row.updated_by, row.updated_at = allowed, admin, utcnow()
            await tx.audit(admin, "tool.policy", {"tool": tool, "member": member,
                                                  "allowed": allowed})


class StoreApprovalModes:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def mode_for(self, member: str) -> ApprovalMode:
        facts = _current_facts(member)
        if facts is not None:
            return ApprovalMode(facts.approval_mode)
        record = await self._store.members.get(member)
        return ApprovalMode(record.approval_mode if record else "ask_for_writes")


class StoreApprovals:
    """Approval requests, decisions and one-shot receipts."""

    def __init__(self, store: Store, capability_of: Mapping[str, str] | None = None) -> None:
        self._store = store
        self._capability_of = capability_of or {}

    async def find_receipt(self, run_id: str, call_digest: str) -> ApprovalReceipt | None:
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                select(m.Approval.id, m.Approval.status)
                .where(m.Approval.run_id == run_id, m.Approval.args_digest == call_digest)
                .order_by(m.Approval.created_at.desc(), m.Approval.id.desc())
                .limit(1)
            )).first()
        return ApprovalReceipt(row[0], ApprovalStatus(row[1])) if row else None

    async def request(self, run_id: str, bundle: AuthorityBundle, tool: str, args_digest: str,
                      redacted_args: Mapping[str, Any]) -> str:
        approval_id = new_id()
        async with self._store.transaction() as tx:
            tx.session.add(m.Approval(
                id=approval_id, run_id=run_id, conversation_id=bundle.conversation_id,
                member=bundle.member, tool=tool,
                capability=self._capability_of.get(tool, "undeclared"),
                args_digest=args_digest, arguments=dict(redacted_args), status="pending",
                created_at=utcnow(),
            ))
            await tx.session.execute(
                update(m.Run).where(m.Run.id == run_id, m.Run.status == "running",
                                    m.Run.fence == bundle.fence)
                .values(status="awaiting_approval")
            )
            await tx.append_event(bundle.conversation_id, "approval.requested", bundle.member, {
                "approval_id": approval_id, "tool": tool,
                "capability": self._capability_of.get(tool, "undeclared"),
                "arguments": dict(redacted_args), "args_digest": args_digest,
            }, run_id=run_id)
        return approval_id

    async def consume_receipt(self, run_id: str, approval_id: str) -> bool:
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                update(m.Approval)
                .where(m.Approval.id == approval_id, m.Approval.run_id == run_id,
                       m.Approval.status == "approved", m.Approval.consumed_at.is_(None))
                .values(status="consumed", consumed_at=utcnow())
                .returning(m.Approval.id)
            )).scalar_one_or_none()
            return row is not None

    async def decide(self, approval_id: str, member: str, approve: bool) -> dict[str, Any]:
        """The initiating member's one decision; a second one is a 409."""
        status = "approved" if approve else "denied"
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.Approval, approval_id)
            if row is None or row.member != member:
                raise NotFound("No such approval request.", code="approval_not_found")
            decided = (await tx.session.execute(
                update(m.Approval)
                .where(m.Approval.id == approval_id, m.Approval.status == "pending")
                .values(status=status, decided_by=member, decided_at=utcnow())
                .returning(m.Approval.run_id, m.Approval.conversation_id, m.Approval.tool)
            )).first()
            if decided is None:
                raise Conflict("This request was already decided.", code="already_decided")
            run_id, conversation_id, tool = decided
            await tx.session.execute(
                update(m.Run).where(m.Run.id == run_id, m.Run.status == "awaiting_approval")
                .values(status="running")
            )
            await tx.append_event(conversation_id, "approval.decided", member,
                                  {"approval_id": approval_id, "decision": status,
                                   "tool": tool}, run_id=run_id)
            return {"id": approval_id, "status": status, "run_id": run_id, "tool": tool}

    async def status(self, approval_id: str) -> str:
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.Approval, approval_id)
            return row.status if row else "missing"

    async def list_for(self, member: str, status: str | None) -> list[dict[str, Any]]:
        async with self._store.transaction() as tx:
            query = select(m.Approval).where(m.Approval.member == member)
            if status:
                query = query.where(m.Approval.status == status)
            rows = (await tx.session.execute(
                query.order_by(m.Approval.created_at.desc()).limit(200))).scalars().all()
            return [{"id": r.id, "run_id": r.run_id, "conversation_id": r.conversation_id,
                     "tool": r.tool, "capability": r.capability, "arguments": r.arguments,
                     "args_digest": r.args_digest, "status": r.status,
                     "created_at": r.created_at.isoformat()} for r in rows]


class StoreAudit:
    """Tool calls in the audit log: outcome and raw size only; raw text never leaves audit.

    A call the run's host dispatched has its row held and written in the same transaction as
    the call's ``tool.settled``; any other call (a kernel's bridge call, a call outside a
    host) writes its row at once."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def record_tool_call(self, bundle: AuthorityBundle, request: ToolCallRequest,
                               outcome: ToolOutcome, raw: object) -> None:
        row = HeldAudit(bundle.member, {
            "tool": request.name, "call_id": request.call_id, "outcome": outcome.value,
            "raw": _bounded_raw(raw),
        }, bundle.conversation_id, bundle.run_id)
        scope = current_call(bundle.run_id, request.call_id)
        if scope is not None and scope.holding:
            scope.held.append(row)
            return
        await self._store.run(row.unit())


def _bounded_raw(raw: object, limit: int = 64 * 1024) -> object:
    """The raw result as audit stores it: itself when small, else a size marker. Always
    JSON-safe (a value JSON cannot hold is stored as its text), so the row cannot fail to
    write in the settlement's transaction."""
    try:
        text = json.dumps(raw)
        safe = raw
    except (TypeError, ValueError):
        try:
            text = json.dumps(raw, default=str)
        except (TypeError, ValueError):
            text = json.dumps(repr(raw))
        safe = json.loads(text)
    if len(text) <= limit and not isinstance(raw, bytes | bytearray):
        return safe
    return {"truncated": True, "chars": len(text)}


# --- the tool's own resource authorization, read-only ----------------------------------------


@asynccontextmanager
async def read_only_transaction(store: Store) -> AsyncIterator[Tx]:
    """A transaction the database itself keeps read-only, always rolled back.

    SQLite: ``PRAGMA query_only`` on the connection for exactly this transaction (turned off
    again before the connection goes back to the pool, which is invalidated if that fails);
    PostgreSQL: ``SET TRANSACTION READ ONLY``. Whatever the caller staged is discarded: the
    session is closed without a flush and the transaction rolled back (R-365).
    """
    async with store.writer_gate(), store.engine.connect() as conn:
        transaction = await conn.begin()
        sqlite = conn.dialect.name == "sqlite"
        try:
            await conn.exec_driver_sql("PRAGMA query_only = ON" if sqlite
                                       else "SET TRANSACTION READ ONLY")
            session = AsyncSession(bind=conn, expire_on_commit=False, autoflush=True)
            try:
                yield Tx(session)
            finally:
                session.expunge_all()
                await session.close()
        finally:
            try:
                if sqlite:
                    await conn.exec_driver_sql("PRAGMA query_only = OFF")
                # A failed flush may already have rolled it back through the session.
                if transaction.is_active:
                    await transaction.rollback()
            except Exception:
                # Never hand a still read-only (or broken) connection to the next writer.
                await conn.invalidate()
                raise


class ReadOnlyStore(Store):
    """The store as an ``authorize`` callable sees it: every ``transaction()`` is the one
    read-only transaction the check runs in, so repositories and services built on it
    (``ArtifactStore(ctx.store)``) read, and any write is refused by the database."""

    def __init__(self, store: Store, tx: Tx) -> None:
        super().__init__(store.engine)
        self._tx = tx

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        yield self._tx


@dataclass(frozen=True, slots=True)
class ResourceCheckContext:
    """``ResourceContext`` for one call's ``authorize``."""

    bundle: AuthorityBundle
    store: ReadOnlyStore

    @property
    def member(self) -> str:
        return self.bundle.member


class StoreResourceAuthorization:
    """Runs a tool's ``authorize`` as the member in a read-only transaction (R-226, R-365)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def __call__(self, tool: RegisteredTool, bundle: AuthorityBundle,
                       arguments: Mapping[str, Any], /) -> ResourceVerdict:
        authorize = tool.authorize
        if authorize is None:
            return ResourceVerdict.allow()
        async with read_only_transaction(self._store) as tx:
            return await authorize(ResourceCheckContext(bundle, ReadOnlyStore(self._store, tx)),
                                   arguments)
