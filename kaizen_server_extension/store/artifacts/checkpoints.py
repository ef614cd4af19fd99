"""Private building rows of streamed ``update_artifact`` calls (R-245, R-444, R-445).

An update targets an owner-resolved artifact, so its checkpoint may open as soon as the stream
names that artifact: ``open`` locks the member's own root (a foreign or missing one is NotFound
and nothing is written) and creates, or takes over, the single open row for (owner, artifact).
Argument deltas then ``advance`` it, fenced by owner, run, call and the row's fence: any other
writer is refused and changes nothing. A cut stream ``interrupt``s it; a crashed process leaves
it ``building`` under a run that is no longer active. Either way the next turn's retry takes the
SAME row over (new run, call and fence) and ``freeze`` turns it into exactly one new immutable
version, in the same transaction as that version, so completion never adds a second one.

``create_artifact`` has no checkpoint at all: an incomplete create cannot prove its final kind
and language (R-109), so an interrupted create is terminally fenced (R-111).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import or_, select, update

from kaizen_server_extension.protocol.errors import Conflict
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.content import ValidationFailed
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    ArtifactVersionRecord,
    WriteContext,
)
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.store import Store

MAX_CHECKPOINT_CHARS = 1_100_000  # the update's content bound plus its JSON framing
# A fenced streamed update saved its draft when its checkpoint opened, so its refusal never
# says "nothing was saved": it says what happened to this call and where the draft is.
_FENCED = ("This artifact update's checkpoint was taken over or stopped, so this call did not "
           "complete it. What was streamed before is kept with the checkpoint.")
_BUSY = ("Another turn is writing this artifact now, so this update was not applied. The "
         "streamed checkpoint stays with that turn; try again once it has finished.")
#: Refusals of a fenced streamed generation: reported without a "nothing was saved" claim.
FENCED_CHECKPOINT_CODES = frozenset({"checkpoint_fenced", "checkpoint_busy"})


@dataclass(frozen=True, slots=True)
class CheckpointScope:
    """Who streams, in which turn and which tool call."""

    owner: str
    conversation_id: str
    run_id: str
    call_id: str


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    checkpoint_id: str
    artifact_id: str
    base_version: int
    status: str
    fence: int
    run_id: str
    call_id: str
    arguments: str
    frozen_version: int | None
    # True when this turn took over a row an earlier, interrupted turn had opened.
    resumed: bool = False


def _record(row: m.ArtifactUpdateCheckpoint, *, resumed: bool = False) -> CheckpointRecord:
    return CheckpointRecord(row.id, row.artifact_id, row.base_version, row.status, row.fence,
                            row.run_id, row.call_id, row.arguments, row.frozen_version,
                            resumed)


class UpdateCheckpoints:
    def __init__(self, store: Store, artifacts: ArtifactStore | None = None) -> None:
        self.store = store
        self.artifacts = artifacts or ArtifactStore(store)

    async def open(self, scope: CheckpointScope, artifact_id: str) -> CheckpointRecord:
        """Open (or resume) the building row before any content is kept."""
        async with self.store.transaction() as tx:
            return await self._claim(tx, scope, artifact_id, fresh_stream=True)

    async def advance(self, scope: CheckpointScope, checkpoint_id: str, fence: int,
                      fragment: str) -> CheckpointRecord:
        """Append one argument delta; only the exact holder (owner, run, call, fence) may."""
        async with self.store.transaction() as tx:
            row = await self._held(tx, scope, checkpoint_id, fence)
            if len(row.arguments) + len(fragment) > MAX_CHECKPOINT_CHARS:
                raise Conflict("The artifact update is too large; nothing more was saved.",
                               code="checkpoint_too_large")
            row.arguments += fragment
            row.updated_at = utcnow()
            await tx.session.flush()
            return _record(row)

    async def interrupt(self, scope: CheckpointScope, checkpoint_id: str, fence: int) -> None:
        """The stream was cut: keep the row, as ``interrupted``, for the next turn."""
        async with self.store.transaction() as tx:
            row = await self._held(tx, scope, checkpoint_id, fence)
            row.status = "interrupted"
            row.updated_at = utcnow()

    async def interrupt_run(self, run_id: str) -> int:
        """Recovery: every row a dead run was still building becomes resumable."""
        async with self.store.transaction() as tx:
            result = await tx.session.execute(
                update(m.ArtifactUpdateCheckpoint)
                .where(m.ArtifactUpdateCheckpoint.run_id == run_id,
                       m.ArtifactUpdateCheckpoint.status == "building")
                .values(status="interrupted", updated_at=utcnow()))
            return int(getattr(result, "rowcount", 0) or 0)

    async def unfinished(self, owner: str, conversation_id: str) -> list[CheckpointRecord]:
        """The member's open rows in this conversation (the roster's unfinished versions).

        A row still ``building`` under a run that completed normally is not unfinished work:
        its stream ended and the call was settled without writing (refused, declined), so it
        is left out; it is still reused, not duplicated, by the next update."""
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.ArtifactUpdateCheckpoint)
                .outerjoin(m.Run, m.Run.id == m.ArtifactUpdateCheckpoint.run_id)
                .where(m.ArtifactUpdateCheckpoint.owner == owner,
                       m.ArtifactUpdateCheckpoint.conversation_id == conversation_id,
                       m.ArtifactUpdateCheckpoint.status.in_(m.OPEN_CHECKPOINT_STATUSES),
                       or_(m.ArtifactUpdateCheckpoint.status == "interrupted",
                           m.Run.status.is_(None), m.Run.status != "completed"))
                .order_by(m.ArtifactUpdateCheckpoint.created_at)
            )).scalars().all()
            return [_record(row) for row in rows]

    async def freeze(self, scope: CheckpointScope, artifact_id: str, *, content: str,
                     expected_version: int | None, title: str | None = None,
                     language: str | None = None,
                     ) -> tuple[ArtifactVersionRecord, CheckpointRecord]:
        """Complete the update: the open row (this call's, or an interrupted turn's) becomes
        exactly one new version, in one transaction. A store refusal writes nothing."""
        async with self.store.transaction() as tx:
            claimed = await self._claim(tx, scope, artifact_id, fresh_stream=False)
            record = await self.artifacts.update(
                scope.owner, artifact_id, content=content, expected_version=expected_version,
                title=title, language=language,
                where=WriteContext(scope.conversation_id, scope.run_id), tx=tx)
            row = await self._held(tx, scope, claimed.checkpoint_id, claimed.fence)
            row.status = "frozen"
            row.frozen_version = record.version
            row.updated_at = utcnow()
            await tx.session.flush()
            return record, _record(row, resumed=claimed.resumed)

    # --- internals -----------------------------------------------------------------------

    async def _claim(self, tx: Tx, scope: CheckpointScope, artifact_id: str, *,
                     fresh_stream: bool) -> CheckpointRecord:
        """The open row for (owner, artifact), created or taken over by ``scope``. A fresh
        stream restarts its argument text; a completion keeps what its stream received."""
        root = await self.artifacts.lock_owned(tx, scope.owner, artifact_id)
        if root.kind == "file":
            # A file run_code retained stays an opaque native artifact: never reclassified
            # as text by an update. Refused before any row opens.
            raise ValidationFailed("A native file cannot be replaced with text; nothing was "
                                   "saved. Produce a new file with run_code instead.",
                                   code="artifact_not_text")
        row = (await tx.session.execute(
            select(m.ArtifactUpdateCheckpoint).where(
                m.ArtifactUpdateCheckpoint.owner == scope.owner,
                m.ArtifactUpdateCheckpoint.artifact_id == artifact_id,
                m.ArtifactUpdateCheckpoint.status.in_(m.OPEN_CHECKPOINT_STATUSES))
            .with_for_update()
        )).scalar_one_or_none()
        now = utcnow()
        if row is None:
            row = m.ArtifactUpdateCheckpoint(
                id=new_id(), owner=scope.owner, conversation_id=scope.conversation_id,
                artifact_id=artifact_id, base_version=root.current_version,
                run_id=scope.run_id, call_id=scope.call_id, fence=1, arguments="",
                status="building", created_at=now, updated_at=now)
            tx.session.add(row)
            await tx.session.flush()
            return _record(row)
        if row.run_id == scope.run_id and row.call_id == scope.call_id \
                and row.status == "building":
            return _record(row)  # this call's own stream: completion freezes the same row
        if row.status == "building" and row.run_id != scope.run_id \
                and await self._run_is_active(tx, row.run_id):
            raise Conflict(_BUSY, code="checkpoint_busy")
        # Resume: an interrupted or orphaned row, or the row this turn's own stream opened
        # for the call now executing, is taken over (a new fence), never duplicated.
        resumed = row.run_id != scope.run_id
        row.run_id, row.call_id, row.fence = scope.run_id, scope.call_id, row.fence + 1
        row.conversation_id = scope.conversation_id
        row.status, row.updated_at = "building", now
        if fresh_stream:
            row.arguments = ""
        row.base_version = root.current_version
        await tx.session.flush()
        return _record(row, resumed=resumed)

    @staticmethod
    async def _run_is_active(tx: Tx, run_id: str) -> bool:
        status = (await tx.session.execute(
            select(m.Run.status).where(m.Run.id == run_id))).scalar_one_or_none()
        return status in m.ACTIVE_RUN_STATUSES

    @staticmethod
    async def _held(tx: Tx, scope: CheckpointScope, checkpoint_id: str,
                    fence: int) -> m.ArtifactUpdateCheckpoint:
        row = (await tx.session.execute(
            select(m.ArtifactUpdateCheckpoint).where(
                m.ArtifactUpdateCheckpoint.id == checkpoint_id,
                m.ArtifactUpdateCheckpoint.owner == scope.owner,
                m.ArtifactUpdateCheckpoint.run_id == scope.run_id,
                m.ArtifactUpdateCheckpoint.call_id == scope.call_id,
                m.ArtifactUpdateCheckpoint.fence == fence,
                m.ArtifactUpdateCheckpoint.status == "building")
            .with_for_update()
        )).scalar_one_or_none()
        if row is None:
            raise Conflict(_FENCED, code="checkpoint_fenced")
        return row
