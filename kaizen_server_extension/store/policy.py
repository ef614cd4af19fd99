"""The store's side of the tool pipeline's ports: authority, permissions, approvals, audit.

Decisions and receipts are compare-and-set updates, so a second decision or a replayed
receipt matches no row (DESIGN.md: one-shot approvals).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update

from kaizen_server_extension.errors import Conflict, NotFound
from kaizen_server_extension.policy.approvals import ApprovalMode, ApprovalReceipt, ApprovalStatus
from kaizen_server_extension.runtime.port import (
    AuthorityBundle,
    AuthorityRejected,
    ToolCallRequest,
    ToolOutcome,
)
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store, new_id, utcnow


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What one tool call's checks read, in one transaction at its authority check."""

    run_id: str
    member: str
    status: str
    fence: int
    audience_version: int
    approval_mode: str
    # (tool, member or "*") -> allowed
    policies: Mapping[tuple[str, str], bool]

    def allowed(self, tool: str) -> bool:
        # The member's own row overrides the everyone row; no row allows.
        own = self.policies.get((tool, self.member))
        if own is not None:
            return own
        return self.policies.get((tool, "*"), True)


# The facts of the call being checked in this task. Each call's authority check reads them
# afresh, so permissions and the approval mode are still resolved per call,
# with one database round trip instead of three.
_CURRENT_CALL: ContextVar[CallFacts | None] = ContextVar("kaizen_call_facts", default=None)


async def read_call_facts(store: Store, run_id: str) -> CallFacts | None:
    async with store.transaction() as tx:
        row = (await tx.session.execute(
            select(m.Run.status, m.Run.fence, m.Run.member, m.Conversation.audience_version,
                   m.Member.approval_mode)
            .join(m.Conversation, m.Conversation.id == m.Run.conversation_id)
            .join(m.Member, m.Member.id == m.Run.member)
            .where(m.Run.id == run_id)
        )).first()
        if row is None:
            return None
        status, fence, member, audience, mode = row
        policies = (await tx.session.execute(
            select(m.ToolPolicy.tool, m.ToolPolicy.member, m.ToolPolicy.allowed)
            .where(or_(m.ToolPolicy.member == member, m.ToolPolicy.member == "*"))
        )).all()
    return CallFacts(run_id, member, status, fence, audience, mode,
                     {(tool, who): bool(allowed) for tool, who, allowed in policies})


class StoreAuthority:
    """Re-checks a bundle against the admitted one and the live run row (R-007, R-222)."""

    def __init__(self, store: Store, admitted: AuthorityBundle) -> None:
        self._store = store
        self._admitted = admitted

    async def verify(self, bundle: AuthorityBundle) -> None:
        differing = self._admitted.differing_fields(bundle)
        if differing:
            raise AuthorityRejected(differing)
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
        if facts is not None:
            return facts.allowed(tool_name)
        async with self._store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.ToolPolicy.member, m.ToolPolicy.allowed)
                .where(m.ToolPolicy.tool == tool_name,
                       or_(m.ToolPolicy.member == member, m.ToolPolicy.member == "*"))
            )).all()
        return CallFacts("", member, "", 0, 0, "",
                         {(tool_name, who): bool(ok) for who, ok in rows}).allowed(tool_name)

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
    """Tool calls in the audit log: outcome and raw size only; raw text never leaves audit."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def record_tool_call(self, bundle: AuthorityBundle, request: ToolCallRequest,
                               outcome: ToolOutcome, raw: object) -> None:
        async with self._store.transaction() as tx:
            await tx.audit(bundle.member, "tool.call", {
                "tool": request.name, "call_id": request.call_id, "outcome": outcome.value,
                "raw": _bounded_raw(raw),
            }, conversation_id=bundle.conversation_id, run_id=bundle.run_id)


def _bounded_raw(raw: object, limit: int = 64 * 1024) -> object:
    import json

    try:
        text = json.dumps(raw, default=str)
    except (TypeError, ValueError):
        text = repr(raw)
    return raw if len(text) <= limit and not isinstance(raw, bytes) else {
        "truncated": True, "chars": len(text)}
