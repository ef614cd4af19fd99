"""The store's side of credential quarantine: sealed remembered credentials and receipts.

This module never sees a plaintext credential: it stores and returns the sealed bytes the
broker produced (``credentials/crypto.py``) and the credential-free receipts. A nonce is
claimed by inserting its receipt — the UNIQUE ``nonce`` makes a second claim fail in the
database, on either backend, whichever replica tries — and a receipt settles once, by
compare-and-set on ``status = 'claimed'`` (R-397, R-398).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.store import Store

#: Receipts a member's listing returns, newest first.
MAX_LISTED_RECEIPTS = 200


@dataclass(frozen=True, slots=True)
class SealedCredential:
    """A remembered credential's row: its identity, and the sealed value only the broker
    opens."""

    ref: str
    member: str
    destination: str
    origin: str
    scheme: str
    label: str
    sealed: bytes
    created_at: datetime

    def identity(self) -> dict[str, str]:
        """What the seal is bound to (its associated data)."""
        return {"ref": self.ref, "member": self.member, "destination": self.destination,
                "origin": self.origin, "scheme": self.scheme}

    def public(self) -> dict[str, Any]:
        """What a member may see of it: everything but the value (R-395)."""
        return {"credential_ref": self.ref, "destination": self.destination,
                "origin": self.origin, "scheme": self.scheme, "label": self.label,
                "retention": "remember", "created_at": self.created_at.isoformat()}

    def __repr__(self) -> str:
        return f"SealedCredential(ref={self.ref!r}, destination={self.destination!r})"


@dataclass(frozen=True, slots=True)
class Receipt:
    id: str
    kind: str
    member: str
    destination: str
    origin: str
    credential_ref: str | None
    retention: str | None
    operation: str | None
    effect: str | None
    run_id: str | None
    status: str
    claimed_at: datetime
    settled_at: datetime | None

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "destination": self.destination,
                "origin": self.origin, "credential_ref": self.credential_ref,
                "retention": self.retention, "operation": self.operation,
                "effect": self.effect, "run_id": self.run_id, "status": self.status,
                "claimed_at": self.claimed_at.isoformat(),
                "settled_at": self.settled_at.isoformat() if self.settled_at else None}


def _receipt(row: m.CredentialReceipt) -> Receipt:
    return Receipt(row.id, row.kind, row.member, row.destination, row.origin,
                   row.credential_ref, row.retention, row.operation, row.effect, row.run_id,
                   row.status, row.claimed_at, row.settled_at)


def _sealed(row: m.CredentialSecret) -> SealedCredential:
    return SealedCredential(row.ref, row.member, row.destination, row.origin, row.scheme,
                            row.label, bytes(row.sealed), row.created_at)


class NonceSpent(Exception):
    """The nonce already has a receipt: this is a replay."""


class CredentialRecords:
    """Receipts and sealed credentials, each change in its own transaction."""

    def __init__(self, store: Store) -> None:
        self._store = store

    # --- receipts ---------------------------------------------------------------------------

    @staticmethod
    async def claim_in(tx: Tx, *, nonce: str, kind: str, member: str, destination: str,
                       origin: str, operation: str | None = None, effect: str | None = None,
                       run_id: str | None = None, credential_ref: str | None = None,
                       retention: str | None = None) -> str:
        """Claim ``nonce`` in ``tx``; the receipt's id. Raises :class:`NonceSpent` when it was
        claimed before (the UNIQUE constraint answers, not a prior read)."""
        receipt_id = new_id()
        try:
            async with tx.session.begin_nested():
                tx.session.add(m.CredentialReceipt(
                    id=receipt_id, nonce=nonce, kind=kind, member=member,
                    destination=destination, origin=origin, operation=operation,
                    effect=effect, run_id=run_id, credential_ref=credential_ref,
                    retention=retention, status="claimed", claimed_at=utcnow()))
                await tx.session.flush()
        except IntegrityError:
            raise NonceSpent() from None
        return receipt_id

    async def claim(self, **fields: Any) -> str:
        async with self._store.transaction() as tx:
            return await self.claim_in(tx, **fields)

    @staticmethod
    async def settle_in(tx: Tx, receipt_id: str, status: str, *,
                        credential_ref: str | None = None) -> bool:
        """Move a claimed receipt to its one terminal ``status``; False if it was settled."""
        values: dict[str, Any] = {"status": status, "settled_at": utcnow()}
        if credential_ref is not None:
            values["credential_ref"] = credential_ref
        done = await tx.session.execute(
            update(m.CredentialReceipt)
            .where(m.CredentialReceipt.id == receipt_id,
                   m.CredentialReceipt.status == "claimed")
            .values(**values).returning(m.CredentialReceipt.id))
        return done.first() is not None

    async def settle(self, receipt_id: str, status: str) -> bool:
        async with self._store.transaction() as tx:
            return await self.settle_in(tx, receipt_id, status)

    async def nonce_claimed(self, nonce: str) -> bool:
        async with self._store.transaction() as tx:
            found = await tx.session.execute(
                select(m.CredentialReceipt.id).where(m.CredentialReceipt.nonce == nonce))
            return found.first() is not None

    async def receipts_of(self, member: str) -> list[Receipt]:
        async with self._store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.CredentialReceipt).where(m.CredentialReceipt.member == member)
                .order_by(m.CredentialReceipt.claimed_at.desc(), m.CredentialReceipt.id)
                .limit(MAX_LISTED_RECEIPTS))).scalars().all()
            return [_receipt(r) for r in rows]

    # --- remembered credentials ---------------------------------------------------------------

    @staticmethod
    async def remember_in(tx: Tx, credential: SealedCredential) -> None:
        tx.session.add(m.CredentialSecret(
            ref=credential.ref, member=credential.member, destination=credential.destination,
            origin=credential.origin, scheme=credential.scheme, label=credential.label,
            sealed=credential.sealed, created_at=credential.created_at))
        await tx.session.flush()

    async def sealed(self, ref: str) -> SealedCredential | None:
        async with self._store.transaction() as tx:
            row = await tx.session.get(m.CredentialSecret, ref)
            return _sealed(row) if row is not None else None

    async def remembered_by(self, member: str) -> list[SealedCredential]:
        async with self._store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.CredentialSecret).where(m.CredentialSecret.member == member)
                .order_by(m.CredentialSecret.created_at, m.CredentialSecret.ref)
            )).scalars().all()
            return [_sealed(r) for r in rows]

    async def forget(self, member: str, ref: str) -> SealedCredential | None:
        """Delete the member's own remembered credential; None when it is not theirs."""
        async with self._store.transaction() as tx:
            row = (await tx.session.execute(
                delete(m.CredentialSecret)
                .where(m.CredentialSecret.ref == ref, m.CredentialSecret.member == member)
                .returning(m.CredentialSecret))).scalar_one_or_none()
            if row is None:
                return None
            gone = _sealed(row)
            await tx.audit(member, "credential.forgotten",
                           {"credential_ref": ref, "destination": gone.destination})
            return gone
