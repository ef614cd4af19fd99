"""Kernel access and edit proposals, in the database, journaled as they change.

Every change here is one transaction that writes its row(s) and appends the journal event
observers see (``notebook.kernel_access``, ``notebook.edit.proposed``, ``.decided``,
``.result``), plus an audit row. Decisions and outcomes are compare-and-set updates: a cell is
decided once (``… WHERE decision = 'pending'``); an outcome is recorded once, and ``undone``
only after ``applied``. A proposal is its member's alone: anyone else gets NotFound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from kaizen_server_extension.protocol.errors import Conflict, NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.store import Store

#: Cells one proposal may change (the database's CHECK holds the same bound).
MAX_EDIT_CELLS = m.MAX_NOTEBOOK_EDIT_CELLS

KERNEL_ACCESS_EVENT = "notebook.kernel_access"
ATTACHED_EVENT = "notebook.attached"
PROPOSED_EVENT = "notebook.edit.proposed"
DECIDED_EVENT = "notebook.edit.decided"
RESULT_EVENT = "notebook.edit.result"

_NO_PROPOSAL = "No such notebook edit proposal."


@dataclass(frozen=True, slots=True)
class ProposedCell:
    """One cell of a proposal as the tool built it (validated against the pinned notebook)."""

    op: str
    cell_id: str
    cell_type: str
    source: str | None
    after_cell_id: str | None = None
    base_source: str | None = None
    base_digest: str | None = None


@dataclass(frozen=True, slots=True)
class CellRecord:
    ordinal: int
    op: str
    cell_id: str
    after_cell_id: str | None
    cell_type: str
    base_source: str | None
    source: str | None
    decision: str
    run_after: bool
    outcome: str | None

    def public(self) -> dict[str, Any]:
        return {"ordinal": self.ordinal, "op": self.op, "cell_id": self.cell_id,
                "after_cell_id": self.after_cell_id, "cell_type": self.cell_type,
                "base_source": self.base_source, "source": self.source,
                "decision": self.decision, "run_after": self.run_after,
                "outcome": self.outcome}


@dataclass(frozen=True, slots=True)
class ProposalRecord:
    id: str
    member: str
    conversation_id: str
    run_id: str
    artifact_id: str
    version: int
    path: str
    created_at: datetime
    cells: tuple[CellRecord, ...]

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "member": self.member, "conversation_id": self.conversation_id,
                "run_id": self.run_id, "artifact_id": self.artifact_id,
                "version": self.version, "path": self.path,
                "created_at": self.created_at.isoformat(),
                "cells": [c.public() for c in self.cells]}


def _cell(row: m.NotebookEditCell) -> CellRecord:
    return CellRecord(row.ordinal, row.op, row.cell_id, row.after_cell_id, row.cell_type,
                      row.base_source, row.source, row.decision, bool(row.run_after),
                      row.outcome)


class NotebookStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    # --- kernel access ------------------------------------------------------------------

    async def kernel_access(self, member: str, conversation_id: str) -> datetime | None:
        """When the member allowed the probe in this conversation, or None."""
        async with self.store.transaction() as tx:
            await self.store.conversations.get_for(conversation_id, member, tx)
            return (await tx.session.execute(
                select(m.NotebookKernelAccess.granted_at).where(
                    m.NotebookKernelAccess.member == member,
                    m.NotebookKernelAccess.conversation_id == conversation_id)
            )).scalar_one_or_none()

    async def allow_kernel_access(self, member: str, conversation_id: str) -> datetime:
        """Idempotent: a second allow keeps the first grant and journals nothing."""
        async with self.store.transaction() as tx:
            await self.store.conversations.get_for(conversation_id, member, tx)
            now = utcnow()
            values = {"member": member, "conversation_id": conversation_id, "granted_at": now}
            dialect = postgresql if tx.notifies else sqlite
            inserted = (await tx.session.execute(
                dialect.insert(m.NotebookKernelAccess).values(**values)
                .on_conflict_do_nothing().returning(m.NotebookKernelAccess.granted_at)
            )).scalar_one_or_none()
            if inserted is None:
                granted: datetime = (await tx.session.execute(
                    select(m.NotebookKernelAccess.granted_at).where(
                        m.NotebookKernelAccess.member == member,
                        m.NotebookKernelAccess.conversation_id == conversation_id)
                )).scalar_one()
                return granted
            await tx.append_event(conversation_id, KERNEL_ACCESS_EVENT, member,
                                  {"member": member, "allowed": True})
            await tx.audit(member, "notebook.kernel_access.allowed", {},
                           conversation_id=conversation_id)
            return now

    async def revoke_kernel_access(self, member: str, conversation_id: str) -> bool:
        """Whether there was a grant to revoke; the next probe is refused either way."""
        async with self.store.transaction() as tx:
            await self.store.conversations.get_for(conversation_id, member, tx)
            gone = (await tx.session.execute(
                delete(m.NotebookKernelAccess).where(
                    m.NotebookKernelAccess.member == member,
                    m.NotebookKernelAccess.conversation_id == conversation_id)
                .returning(m.NotebookKernelAccess.member))).scalar_one_or_none()
            if gone is None:
                return False
            await tx.append_event(conversation_id, KERNEL_ACCESS_EVENT, member,
                                  {"member": member, "allowed": False})
            await tx.audit(member, "notebook.kernel_access.revoked", {},
                           conversation_id=conversation_id)
            return True

    # --- attachments --------------------------------------------------------------------

    @staticmethod
    async def journal_attached(tx: Tx, member: str, conversation_id: str,
                               data: dict[str, Any]) -> None:
        """Reading a member's notebook is something Kaizen did to it: journaled."""
        await tx.append_event(conversation_id, ATTACHED_EVENT, member, data)
        await tx.audit(member, "notebook.attached", data, conversation_id=conversation_id)

    # --- proposals ----------------------------------------------------------------------

    async def create_proposal(self, *, member: str, conversation_id: str, run_id: str,
                              artifact_id: str, version: int, path: str, fingerprint: str,
                              cells: Sequence[ProposedCell],
                              summary: str = "") -> ProposalRecord:
        proposal_id = new_id()
        now = utcnow()
        async with self.store.transaction() as tx:
            tx.session.add(m.NotebookEditProposal(
                id=proposal_id, member=member, conversation_id=conversation_id, run_id=run_id,
                artifact_id=artifact_id, version=version, path=path,
                base_fingerprint=fingerprint, created_at=now))
            await tx.session.flush()
            rows = [m.NotebookEditCell(
                proposal_id=proposal_id, ordinal=i, op=c.op, cell_id=c.cell_id,
                after_cell_id=c.after_cell_id, cell_type=c.cell_type,
                base_source=c.base_source, base_digest=c.base_digest, source=c.source,
                decision="pending", run_after=False) for i, c in enumerate(cells)]
            tx.session.add_all(rows)
            await tx.session.flush()
            record = ProposalRecord(proposal_id, member, conversation_id, run_id, artifact_id,
                                    version, path, now, tuple(_cell(r) for r in rows))
            data = record.public() | {"summary": summary}
            await tx.append_event(conversation_id, PROPOSED_EVENT, member, data, run_id=run_id)
            await tx.audit(member, "notebook.edit.proposed", {
                "proposal_id": proposal_id, "path": path, "artifact_id": artifact_id,
                "version": version, "cells": [[c.op, c.cell_id] for c in cells]},
                conversation_id=conversation_id, run_id=run_id)
            return record

    async def get(self, member: str, proposal_id: str) -> ProposalRecord:
        async with self.store.transaction() as tx:
            return await self._get(tx, member, proposal_id)

    async def _get(self, tx: Tx, member: str, proposal_id: str) -> ProposalRecord:
        row = (await tx.session.execute(select(m.NotebookEditProposal).where(
            m.NotebookEditProposal.id == proposal_id))).scalar_one_or_none()
        if row is None or row.member != member:
            raise NotFound(_NO_PROPOSAL, code="proposal_not_found")
        cells = (await tx.session.execute(select(m.NotebookEditCell).where(
            m.NotebookEditCell.proposal_id == proposal_id)
            .order_by(m.NotebookEditCell.ordinal))).scalars().all()
        return ProposalRecord(row.id, row.member, row.conversation_id, row.run_id,
                              row.artifact_id, row.version, row.path, row.created_at,
                              tuple(_cell(c) for c in cells))

    async def decide(self, member: str, proposal_id: str, ordinal: int, *, accept: bool,
                     run_after: bool = False) -> CellRecord:
        """Accept or reject one cell, once (compare-and-set); a second decision is 409."""
        async with self.store.transaction() as tx:
            proposal = await self._get(tx, member, proposal_id)
            cell = next((c for c in proposal.cells if c.ordinal == ordinal), None)
            if cell is None:
                raise NotFound("No such cell in this proposal.", code="proposal_not_found")
            if run_after and not (accept and cell.op == "insert" and cell.cell_type == "code"):
                raise Conflict("Only an accepted inserted code cell can be run after insert.",
                               code="run_after_not_applicable")
            decision = "accepted" if accept else "rejected"
            changed = (await tx.session.execute(
                update(m.NotebookEditCell)
                .where(m.NotebookEditCell.proposal_id == proposal_id,
                       m.NotebookEditCell.ordinal == ordinal,
                       m.NotebookEditCell.decision == "pending")
                .values(decision=decision, run_after=run_after, decided_at=utcnow())
                .returning(m.NotebookEditCell.ordinal))).scalar_one_or_none()
            if changed is None:
                raise Conflict("This cell was already decided.", code="already_decided")
            await tx.append_event(proposal.conversation_id, DECIDED_EVENT, member, {
                "proposal_id": proposal_id, "ordinal": ordinal, "decision": decision,
                "run_after": run_after}, run_id=proposal.run_id)
            await tx.audit(member, "notebook.edit.decided", {
                "proposal_id": proposal_id, "ordinal": ordinal, "decision": decision,
                "run_after": run_after}, conversation_id=proposal.conversation_id,
                run_id=proposal.run_id)
            row = (await tx.session.execute(select(m.NotebookEditCell).where(
                m.NotebookEditCell.proposal_id == proposal_id,
                m.NotebookEditCell.ordinal == ordinal))).scalar_one()
            return _cell(row)

    async def record_outcome(self, member: str, proposal_id: str, ordinal: int, outcome: str,
                             detail: str = "") -> CellRecord:
        """What the member's browser did with an accepted cell: ``applied``, ``stale`` (the
        live notebook no longer matched), ``failed``; later ``undone`` after ``applied``."""
        if outcome not in m.NOTEBOOK_EDIT_OUTCOMES:
            raise ValueError(outcome)  # schema-checked at the route
        async with self.store.transaction() as tx:
            proposal = await self._get(tx, member, proposal_id)
            if not any(c.ordinal == ordinal for c in proposal.cells):
                raise NotFound("No such cell in this proposal.", code="proposal_not_found")
            where = [m.NotebookEditCell.proposal_id == proposal_id,
                     m.NotebookEditCell.ordinal == ordinal,
                     m.NotebookEditCell.decision == "accepted"]
            if outcome == "undone":
                where.append(m.NotebookEditCell.outcome == "applied")
            else:
                where.append(m.NotebookEditCell.outcome.is_(None))
            changed = (await tx.session.execute(
                update(m.NotebookEditCell).where(*where)
                .values(outcome=outcome, outcome_at=utcnow())
                .returning(m.NotebookEditCell.ordinal))).scalar_one_or_none()
            if changed is None:
                raise Conflict("That result does not follow from this cell's state (accept "
                               "it first; undo only what was applied).",
                               code="outcome_out_of_order")
            data = {"proposal_id": proposal_id, "ordinal": ordinal, "outcome": outcome,
                    "detail": detail[:300]}
            await tx.append_event(proposal.conversation_id, RESULT_EVENT, member, data,
                                  run_id=proposal.run_id)
            await tx.audit(member, "notebook.edit.result", data,
                           conversation_id=proposal.conversation_id, run_id=proposal.run_id)
            row = (await tx.session.execute(select(m.NotebookEditCell).where(
                m.NotebookEditCell.proposal_id == proposal_id,
                m.NotebookEditCell.ordinal == ordinal))).scalar_one()
            return _cell(row)
