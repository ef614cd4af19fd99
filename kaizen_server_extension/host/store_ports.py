"""The store's side of the tool pipeline's ports: authority, permissions, approvals, audit.

Each call's facts arrive explicitly (``policy/ports.py: CallScope``): the authority check
returns what it checked against and the pipeline hands that to the permission and approval-mode
checks of the same call.

Decisions and receipts are compare-and-set updates, so a second decision or a replayed
receipt matches no row (DESIGN.md: one-shot approvals).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from kaizen_server_extension.policy.approvals import (
    ApprovalMode,
    ApprovalReceipt,
    ApprovalStatus,
    grantable,
)
from kaizen_server_extension.protocol.authority import (
    AuthorityBundle,
    AuthorityRejected,
    verify_bundle,
)
from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolOutcome
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.checkpoints import UpdateCheckpoints
from kaizen_server_extension.store.artifacts.drafts import DraftStore
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.calls import CallFacts, HeldAudit, read_call_facts
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.library import LibraryStore
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.store.tool_grants import NotGrantable, grant_in
from kaizen_server_extension.tools.authorization import CallAuthorization
from kaizen_server_extension.tools.ports import CallFactsView
from kaizen_server_extension.tools.services import ArtifactServices, ToolServices
from kaizen_server_extension.tools.types import RegisteredTool, ResourceVerdict

log = logging.getLogger("kaizen.tools.audit")


class StoreAuthority:
    """Re-checks a bundle against the admitted one and the live run row (R-007, R-222)."""

    def __init__(self, store: Store, admitted: AuthorityBundle) -> None:
        self._store = store
        self._admitted = admitted

    async def verify(self, bundle: AuthorityBundle,
                     prefetched: CallFactsView | None = None) -> CallFacts:
        verify_bundle(self._admitted, bundle)
        facts = prefetched if isinstance(prefetched, CallFacts) \
            and prefetched.run_id == bundle.run_id else None
        if facts is None:
            facts = await read_call_facts(self._store, bundle.run_id)
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
        return facts


def _facts_of(member: str, facts: CallFactsView | None) -> CallFactsView | None:
    """``facts`` when they are this member's (a call's facts never answer for another)."""
    return facts if facts is not None and facts.member == member else None


class StorePermissions:
    """Admin tool policy from the database plus the Jupyter authorizer, read on every call."""

    def __init__(self, store: Store, authorize: Any = None, *,
                 ancestors_of: Callable[[str], Sequence[str]] | None = None) -> None:
        self._store = store
        # ``authorize(member, tool_name) -> bool``: the Jupyter server's Authorizer.
        self._authorize = authorize
        # The policy selectors above a tool, root first (a source tool's root, family and
        # source, docs/tool-policies.md); none for a built-in.
        self._ancestors_of = ancestors_of

    async def allowed(self, member: str, tool_name: str,
                      facts: CallFactsView | None = None) -> bool:
        if self._authorize is not None and not self._authorize(member, tool_name):
            return False
        ancestors = self._ancestors_of(tool_name) if self._ancestors_of is not None else ()
        # A denied ancestor is a hard ceiling over each tool beneath it: the tool's own row,
        # whatever it says, cannot re-enable one, and an ancestor's allow grants nothing the
        # tool's own row denies (ancestors only tighten, R-312, R-314).
        for ancestor in ancestors:
            if not await self._policy(member, ancestor, facts):
                return False
        return await self._policy(member, tool_name, facts)

    async def allowed_names(self, member: str, names: Sequence[str]) -> frozenset[str]:
        """Those of ``names`` :meth:`allowed` would allow now, read in one statement (a
        source's discovery checks up to thousands of tools at once)."""
        names = [n for n in names
                 if self._authorize is None or self._authorize(member, n)]
        ancestry = {n: (self._ancestors_of(n) if self._ancestors_of is not None else ())
                    for n in names}
        wanted = sorted({*names, *(a for chain in ancestry.values() for a in chain)})
        policies: dict[tuple[str, str], bool] = {}
        async with self._store.transaction() as tx:
            for start in range(0, len(wanted), 500):
                rows = (await tx.session.execute(
                    select(m.ToolPolicy.tool, m.ToolPolicy.member, m.ToolPolicy.allowed)
                    .where(m.ToolPolicy.tool.in_(wanted[start:start + 500]),
                           or_(m.ToolPolicy.member == member, m.ToolPolicy.member == "*"))
                )).all()
                policies.update({(tool, who): bool(ok) for tool, who, ok in rows})

        def verdict(tool: str) -> bool:
            own = policies.get((tool, member))
            return own if own is not None else policies.get((tool, "*"), True)

        return frozenset(n for n in names
                         if all(verdict(a) for a in ancestry[n]) and verdict(n))

    async def _policy(self, member: str, tool_name: str,
                      facts: CallFactsView | None) -> bool:
        facts = _facts_of(member, facts)
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

    async def mode_for(self, member: str,
                       facts: CallFactsView | None = None) -> ApprovalMode:
        facts = _facts_of(member, facts)
        if facts is not None:
            return ApprovalMode(facts.approval_mode)
        record = await self._store.members.get(member)
        return ApprovalMode(record.approval_mode if record else "ask_for_writes")


#: Who a withdrawn approval request was decided by: the server, not a member.
WITHDRAWN_BY = "kaizen"


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
                      redacted_args: Mapping[str, Any], *, capability: str | None = None) -> str:
        """``capability`` is the run's frozen declaration of ``tool`` when the caller has it
        (a source tool is known only to its run); else the registry's."""
        approval_id = new_id()
        capability = capability or self._capability_of.get(tool, "undeclared")
        async with self._store.transaction() as tx:
            tx.session.add(m.Approval(
                id=approval_id, run_id=run_id, conversation_id=bundle.conversation_id,
                member=bundle.member, tool=tool,
                capability=capability,
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
                "capability": capability,
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

    async def decide(self, approval_id: str, member: str, approve: bool, *,
                     scope: str = "call") -> dict[str, Any]:
        """The initiating member's one decision; a second one is a 409.

        ``scope="conversation"`` (an approval only) also allows the request's tool for the
        rest of its conversation, for this member, in the same transaction: refused with
        ``grant_not_allowed`` (nothing decided) for a tool that confirms every call."""
        status = "approved" if approve else "denied"
        for_conversation = approve and scope == "conversation"
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.Approval, approval_id)
            if row is None or row.member != member:
                raise NotFound("No such approval request.", code="approval_not_found")
            if for_conversation and not grantable(row.capability):
                raise NotGrantable(
                    f"{row.tool} asks every time and cannot be allowed for the whole "
                    "conversation; approve or deny this call.", code="grant_not_allowed")
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
            if for_conversation:
                await grant_in(tx, member=member, conversation_id=conversation_id, tool=tool,
                               capability=row.capability, approval_id=approval_id)
            decided_scope = "conversation" if for_conversation else "call"
            await tx.append_event(conversation_id, "approval.decided", member,
                                  {"approval_id": approval_id, "decision": status,
                                   "tool": tool, "scope": decided_scope}, run_id=run_id)
            return {"id": approval_id, "status": status, "run_id": run_id, "tool": tool,
                    "scope": decided_scope}

    async def withdraw(self, approval_id: str) -> bool:
        """Withdraw a request nobody waits for any more (the delegated turn that asked was cut
        off): it is denied by the server, so a later decision finds it decided and nothing
        runs, and the run waits on it no longer. True when it was still pending. A request of
        a run that is no longer active is left as it is (the run's terminal settled it)."""
        async with self._store.transaction() as tx:
            request = await tx.session.get(m.Approval, approval_id)
            run = await tx.session.get(m.Run, request.run_id) if request is not None else None
            if run is None or run.status not in m.ACTIVE_RUN_STATUSES:
                return False
            withdrawn = (await tx.session.execute(
                update(m.Approval)
                .where(m.Approval.id == approval_id, m.Approval.status == "pending")
                .values(status="denied", decided_by=WITHDRAWN_BY, decided_at=utcnow())
                .returning(m.Approval.run_id, m.Approval.conversation_id, m.Approval.tool)
            )).first()
            if withdrawn is None:
                return False
            run_id, conversation_id, tool = withdrawn
            await tx.session.execute(
                update(m.Run).where(m.Run.id == run_id, m.Run.status == "awaiting_approval")
                .values(status="running"))
            await tx.append_event(conversation_id, "approval.decided", WITHDRAWN_BY,
                                  {"approval_id": approval_id, "decision": "denied",
                                   "tool": tool, "scope": "call", "withdrawn": True},
                                  run_id=run_id)
        return True

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


def tool_call_audit(bundle: AuthorityBundle, request: ToolCallRequest, outcome: ToolOutcome,
                    raw: object, authorization: CallAuthorization | None = None) -> HeldAudit:
    """A tool call's audit row: outcome, the bounded raw result (raw text never leaves
    audit) and what authorized the call to run — no decision needed, Never ask, a standing
    grant or a one-shot approval (R-377) — or None when it never ran."""
    return HeldAudit(bundle.member, {
        "tool": request.name, "call_id": request.call_id, "outcome": outcome.value,
        "raw": _bounded_raw(raw),
        "authorization": None if authorization is None else authorization.audit(),
    }, bundle.conversation_id, bundle.run_id)


class StoreAudit:
    """Tool calls in the audit log, each written at once: the sink of calls no host holds
    (a kernel's bridge call, a call outside a run's host)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def record_tool_call(self, bundle: AuthorityBundle, request: ToolCallRequest,
                               outcome: ToolOutcome, raw: object,
                               authorization: CallAuthorization | None = None) -> None:
        await self._store.run(
            tool_call_audit(bundle, request, outcome, raw, authorization).unit())


class HeldCallAudit:
    """The audit of one call the run's host dispatched, held until :meth:`release` so the
    host writes it in the transaction that journals the call's ``tool.settled``. What is
    recorded after the release (nothing normally) is written at once."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._held: list[HeldAudit] = []
        self._holding = True

    async def record_tool_call(self, bundle: AuthorityBundle, request: ToolCallRequest,
                               outcome: ToolOutcome, raw: object,
                               authorization: CallAuthorization | None = None) -> None:
        row = tool_call_audit(bundle, request, outcome, raw, authorization)
        if self._holding:
            self._held.append(row)
            return
        await self._store.run(row.unit())

    def release(self) -> list[HeldAudit]:
        """Stop holding and hand over what was held."""
        self._holding = False
        held, self._held = self._held, []
        return held


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


def artifact_services(store: Store) -> ArtifactServices:
    """The member-artifact services over ``store`` (the run's, or a read-only one)."""
    artifacts = ArtifactStore(store)
    return ArtifactServices(store=artifacts, drafts=DraftStore(store, artifacts),
                            checkpoints=UpdateCheckpoints(store, artifacts),
                            library=LibraryStore(store, artifacts))


@dataclass(frozen=True, slots=True)
class ResourceCheckContext:
    """``ResourceContext`` for one call's ``authorize``: its services see only the check's
    read-only transaction."""

    bundle: AuthorityBundle
    store: ReadOnlyStore
    services: ToolServices

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
            read_only = ReadOnlyStore(self._store, tx)
            services = ToolServices(artifacts=artifact_services(read_only))
            return await authorize(ResourceCheckContext(bundle, read_only, services), arguments)
