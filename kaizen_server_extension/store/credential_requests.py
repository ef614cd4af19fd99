"""Tool calls paused for a credential form: the store's side (docs/credentials.md, "A call
that needs a credential").

A paused call is to a credential what a pending approval is to a decision, and it uses the
same run mechanics: creating one moves the run from ``running`` to ``awaiting_approval`` (the
run status "waiting for the member"), and settling it — the member submitted the form,
cancelled it, or it expired — moves the run back to ``running`` and journals
``credential.settled``, so the host that waits re-issues the call. Every change is a
compare-and-set on ``status = 'pending'``; the re-issued call takes the outcome once
(``resumed_at IS NULL``). The rows hold identity and status only: the value is never here,
only the opaque reference of the use-once value the broker holds (R-386, R-391).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, utcnow
from kaizen_server_extension.store.models import CREDENTIAL_REQUEST_STATUSES
from kaizen_server_extension.store.store import Store

#: Who settles a request that expired, or whose run stopped waiting: the server.
SETTLED_BY_SERVER = "kaizen"
#: Requests a member's listing returns, newest first.
MAX_LISTED = 200


@dataclass(frozen=True, slots=True)
class PausedCall:
    """One paused call, as the host, the pipeline and the member's listing see it."""

    id: str
    run_id: str
    conversation_id: str
    call_id: str
    member: str
    tool: str
    destination: str
    origin: str
    effect: str
    args_digest: str
    approval_id: str | None
    authorized_by: str
    status: str
    expires_at: datetime
    created_at: datetime
    settled_at: datetime | None
    resumed_at: datetime | None

    def public(self) -> dict[str, Any]:
        """What the member may see: identity and status (no reference, no value)."""
        return {"id": self.id, "run_id": self.run_id, "conversation_id": self.conversation_id,
                "call_id": self.call_id, "tool": self.tool, "destination": self.destination,
                "origin": self.origin, "effect": self.effect, "approval_id": self.approval_id,
                "status": self.status, "expires_at": self.expires_at.isoformat(),
                "created_at": self.created_at.isoformat(),
                "settled_at": self.settled_at.isoformat() if self.settled_at else None}


def _paused(row: m.CredentialRequest) -> PausedCall:
    return PausedCall(row.id, row.run_id, row.conversation_id, row.call_id, row.member,
                      row.tool, row.destination, row.origin, row.effect, row.args_digest,
                      row.approval_id, row.authorized_by, row.status, row.expires_at,
                      row.created_at, row.settled_at, row.resumed_at)


class RequestClosed(Exception):
    """The paused call is no longer waiting (submitted, cancelled, expired, or its run
    stopped): nothing was changed."""


@dataclass(frozen=True, slots=True)
class NewPause:
    """What the pipeline's credential port knows of a call when it pauses it."""

    id: str
    run_id: str
    fence: int
    conversation_id: str
    call_id: str
    member: str
    tool: str
    destination: str
    origin: str
    effect: str
    args_digest: str
    approval_id: str | None
    authorized_by: str
    nonce: str
    expires_at: datetime


class CredentialRequests:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def pause(self, new: NewPause, event: dict[str, Any]) -> bool:
        """Persist ``new`` and move its run to waiting, journaling ``credential.requested``
        with ``event``. False (nothing written) when the run is no longer ours to pause."""
        async with self._store.transaction() as tx:
            moved = (await tx.session.execute(
                update(m.Run).where(m.Run.id == new.run_id, m.Run.status == "running",
                                    m.Run.fence == new.fence)
                .values(status="awaiting_approval").returning(m.Run.id))).first()
            if moved is None:
                return False
            tx.session.add(m.CredentialRequest(
                id=new.id, run_id=new.run_id, conversation_id=new.conversation_id,
                call_id=new.call_id, member=new.member, tool=new.tool,
                destination=new.destination, origin=new.origin, effect=new.effect,
                args_digest=new.args_digest, approval_id=new.approval_id,
                authorized_by=new.authorized_by, nonce=new.nonce,
                status="pending", expires_at=new.expires_at, created_at=utcnow()))
            await tx.session.flush()
            await tx.append_event(new.conversation_id, "credential.requested", new.member,
                                  event, run_id=new.run_id)
        return True

    @staticmethod
    async def settle_in(tx: Tx, request_id: str, status: str, actor: str, *,
                        member: str | None = None, credential_ref: str | None = None,
                        now: datetime | None = None) -> PausedCall:
        """Settle a pending request in ``tx`` (``submitted`` with the reference of the value
        the broker holds, ``cancelled`` or ``expired``): its run goes back to running and
        ``credential.settled`` is journaled. Raises :class:`RequestClosed` when it is not
        pending (or, for a submission, has expired or its run stopped waiting)."""
        now = now or utcnow()
        conditions = [m.CredentialRequest.id == request_id,
                      m.CredentialRequest.status == "pending"]
        if member is not None:
            conditions.append(m.CredentialRequest.member == member)
        if status == "submitted":
            conditions.append(m.CredentialRequest.expires_at > now)
            # A run that no longer waits (stopped, recovered, settled) takes no credential.
            conditions.append(m.CredentialRequest.run_id.in_(
                select(m.Run.id).where(m.Run.status == "awaiting_approval")))
        row = (await tx.session.execute(
            update(m.CredentialRequest).where(*conditions)
            .values(status=status, settled_at=now, credential_ref=credential_ref)
            .returning(m.CredentialRequest)
            .execution_options(synchronize_session=False))).scalar_one_or_none()
        if row is None:
            raise RequestClosed(request_id)
        await tx.session.execute(
            update(m.Run).where(m.Run.id == row.run_id, m.Run.status == "awaiting_approval")
            .values(status="running"))
        await tx.append_event(row.conversation_id, "credential.settled", actor, {
            "request_id": row.id, "call_id": row.call_id, "tool": row.tool,
            "origin": row.origin, "status": status}, run_id=row.run_id)
        return _paused(row)

    async def settle(self, request_id: str, status: str, actor: str, *,
                     member: str | None = None) -> PausedCall:
        async with self._store.transaction() as tx:
            return await self.settle_in(tx, request_id, status, actor, member=member)

    async def expire_if_due(self, request_id: str, *, grace_s: float = 0.0) -> bool:
        """Expire a pending request whose form's time is up; True when it did."""
        now = utcnow()
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.CredentialRequest, request_id)
            if row is None or row.status != "pending" \
                    or row.expires_at + timedelta(seconds=grace_s) > now:
                return False
            try:
                await self.settle_in(tx, request_id, "expired", SETTLED_BY_SERVER, now=now)
            except RequestClosed:
                return False
        return True

    async def get(self, request_id: str) -> PausedCall | None:
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.CredentialRequest, request_id)
            return _paused(row) if row is not None else None

    async def of_call(self, run_id: str, call_id: str,
                      args_digest: str) -> PausedCall | None:
        """The settled, not yet resumed request of this exact call, if any."""
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                select(m.CredentialRequest).where(
                    m.CredentialRequest.run_id == run_id,
                    m.CredentialRequest.call_id == call_id,
                    m.CredentialRequest.args_digest == args_digest,
                    m.CredentialRequest.status != "pending",
                    m.CredentialRequest.resumed_at.is_(None))
                .order_by(m.CredentialRequest.created_at.desc()).limit(1))).scalar_one_or_none()
            return _paused(row) if row is not None else None

    async def of_approval(self, approval_id: str) -> PausedCall | None:
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                select(m.CredentialRequest)
                .where(m.CredentialRequest.approval_id == approval_id))).scalar_one_or_none()
            return _paused(row) if row is not None else None

    async def resume(self, request_id: str) -> tuple[str, str | None] | None:
        """Take a settled request's outcome for its re-issued call, once: (status,
        credential_ref), or None when it was taken before (or is still pending)."""
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                update(m.CredentialRequest)
                .where(m.CredentialRequest.id == request_id,
                       m.CredentialRequest.status != "pending",
                       m.CredentialRequest.resumed_at.is_(None))
                .values(resumed_at=utcnow())
                .returning(m.CredentialRequest.status, m.CredentialRequest.credential_ref)
            )).first()
            return (str(row[0]), row[1]) if row is not None else None

    async def list_for(self, member: str, status: str | None = None) -> list[PausedCall]:
        async with self._store.transaction() as tx:
            query = select(m.CredentialRequest).where(m.CredentialRequest.member == member)
            if status:
                query = query.where(m.CredentialRequest.status == status)
            rows = (await tx.session.execute(
                query.order_by(m.CredentialRequest.created_at.desc()).limit(MAX_LISTED)
            )).scalars().all()
            return [_paused(r) for r in rows]


__all__ = ["CREDENTIAL_REQUEST_STATUSES", "SETTLED_BY_SERVER", "CredentialRequests",
           "NewPause", "PausedCall", "RequestClosed"]
