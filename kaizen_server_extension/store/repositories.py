"""The store's repositories: members, agents, conversations, the journal, inputs and runs.

Each is a small class over the :class:`~kaizen_server_extension.store.store.Store`; a method
opens its own transaction unless handed a :class:`~kaizen_server_extension.store.core.Tx`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, select, update
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.agents import UNSCOPED, KnowledgeScope
from kaizen_server_extension.protocol.errors import Conflict, Forbidden, NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store import reads
from kaizen_server_extension.store.core import Tx, new_id, text_digest, utcnow
from kaizen_server_extension.store.records import (
    CHAT_POSTURE,
    AcceptedInputRecord,
    AgentRecord,
    ConversationRecord,
    EventRecord,
    MemberRecord,
    RunRecord,
)
from kaizen_server_extension.store.units import Unit

if TYPE_CHECKING:
    from kaizen_server_extension.store.accept_batch import AcceptBatcher
    from kaizen_server_extension.store.inputs import NewInput
    from kaizen_server_extension.store.store import Store


class _Repository:
    def __init__(self, store: Store) -> None:
        self.store = store


class MemberRepository(_Repository):
    async def ensure(self, member_id: str, display_name: str | None = None,
                     tx: Tx | None = None) -> MemberRecord:
        """The member row for an authenticated identity, created on first sight."""
        if tx is None:
            async with self.store.transaction() as own:
                return await self.ensure(member_id, display_name, own)
        row = await tx.session.get(m.Member, member_id)
        if row is None:
            row = m.Member(id=member_id, display_name=display_name or member_id,
                           approval_mode="ask_for_writes", tool_result_compression=False,
                           created_at=utcnow())
            tx.session.add(row)
            await tx.session.flush()
        return _member(row)

    async def get(self, member_id: str) -> MemberRecord | None:
        return await self.store.read(reads.member_record, member_id, single_statement=True)

    async def update_settings(self, member_id: str, *, approval_mode: str,
                              model: str | None,
                              tool_result_compression: bool = False) -> MemberRecord:
        async with self.store.transaction() as tx:
            row = await tx.session.get(m.Member, member_id)
            if row is None:
                raise NotFound("No such member.")
            row.approval_mode = approval_mode
            row.model = model
            row.tool_result_compression = tool_result_compression
            await tx.audit(member_id, "member.settings", {
                "approval_mode": approval_mode, "model": model,
                "tool_result_compression": tool_result_compression})
            return _member(row)


class AgentRepository(_Repository):
    async def ensure_system_agent(self, agent_id: str, name: str, *, persona: str,
                                  mode: str, tool_ceiling: Sequence[str],
                                  knowledge_scope: KnowledgeScope = UNSCOPED) -> AgentRecord:
        """Seed a system agent; when the shipped definition changed (its knowledge scope
        included), add a new immutable version rather than editing the old one (runs keep
        pointing at theirs, and their resource digest binds the scope they were admitted
        with)."""
        scope = knowledge_scope.stored()
        async with self.store.transaction() as tx:
            now = utcnow()
            agent = await tx.session.get(m.Agent, agent_id)
            if agent is None:
                agent = m.Agent(id=agent_id, name=name, owner=None, current_version=0,
                                created_at=now)
                tx.session.add(agent)
                current = None
            else:
                current = (await tx.session.execute(
                    select(m.AgentVersion).where(m.AgentVersion.agent_id == agent_id,
                                                 m.AgentVersion.version == agent.current_version)
                )).scalar_one_or_none()
            unchanged = current is not None and (
                current.persona, list(current.tool_ceiling), current.mode,
                dict(current.knowledge_scope),
            ) == (persona, list(tool_ceiling), mode, scope)
            if not unchanged:
                version = (agent.current_version or 0) + 1
                agent.current_version = version
                agent.name = name
                await tx.session.flush()
                tx.session.add(m.AgentVersion(
                    id=f"{agent_id}@{version}", agent_id=agent_id, version=version,
                    persona=persona, tool_ceiling=list(tool_ceiling), knowledge_scope=scope,
                    mode=mode, created_at=now,
                ))
                await tx.session.flush()
        record = await self.get_visible(agent_id, member=None)
        assert record is not None
        return record

    def _visible(self, member: str | None) -> Any:
        return m.Agent.owner.is_(None) if member is None else (
            (m.Agent.owner.is_(None)) | (m.Agent.owner == member))

    async def list_visible(self, member: str) -> list[AgentRecord]:
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.Agent, m.AgentVersion)
                .join(m.AgentVersion, and_(m.AgentVersion.agent_id == m.Agent.id,
                                           m.AgentVersion.version == m.Agent.current_version))
                .where(self._visible(member))
                .order_by(m.Agent.name, m.Agent.id)
            )).all()
            return [_agent(a, v) for a, v in rows]

    async def get_visible(self, agent_id: str, member: str | None,
                          tx: Tx | None = None) -> AgentRecord | None:
        if tx is None:
            return await self.store.read(reads.agent_record, agent_id, member,
                                         single_statement=True)
        return await tx.run(reads.agent_record(agent_id, member))


class ConversationRepository(_Repository):
    async def create(self, owner: str, agent_id: str, title: str,
                     shared: bool) -> ConversationRecord:
        async with self.store.transaction() as tx:
            agent = await self.store.agents.get_visible(agent_id, owner, tx)
            if agent is None:
                raise NotFound("No such agent.", code="agent_not_found")
            now = utcnow()
            conv = m.Conversation(id=new_id(), owner=owner, agent_id=agent_id, title=title,
                                  shared=shared, audience_version=1, last_seq=0,
                                  last_position=0, created_at=now, updated_at=now)
            tx.session.add(conv)
            await tx.session.flush()
            tx.session.add(m.Participant(conversation_id=conv.id, member_id=owner, added_at=now))
            await tx.audit(owner, "conversation.created", {"agent_id": agent_id,
                                                           "shared": shared},
                           conversation_id=conv.id)
            await tx.session.flush()
            return await self._record(tx, conv)

    async def list_for(self, member: str) -> list[ConversationRecord]:
        async with self.store.transaction() as tx:
            convs = (await tx.session.execute(
                select(m.Conversation)
                .join(m.Participant, m.Participant.conversation_id == m.Conversation.id)
                .where(m.Participant.member_id == member)
                .order_by(m.Conversation.updated_at.desc(), m.Conversation.id)
            )).scalars().all()
            return [await self._record(tx, c) for c in convs]

    async def get_for(self, conversation_id: str, member: str,
                      tx: Tx | None = None) -> ConversationRecord:
        """The conversation if ``member`` is a participant; otherwise NotFound (never 403)."""
        if tx is None:
            record = await self.store.read(reads.conversation_record, conversation_id, member)
        else:
            record = await tx.run(reads.conversation_record(conversation_id, member))
        if record is None:
            raise NotFound("No such conversation.", code="conversation_not_found")
        return record

    async def add_participant(self, conversation_id: str, owner: str,
                              member: str) -> ConversationRecord:
        async with self.store.transaction() as tx:
            conv = await self._owned(tx, conversation_id, owner)
            if not conv.shared:
                raise Conflict("A private conversation has no other participants; "
                               "create a shared one.", code="conversation_private")
            await self.store.members.ensure(member, tx=tx)
            exists = await tx.session.get(m.Participant, (conversation_id, member))
            if exists is None:
                tx.session.add(m.Participant(conversation_id=conversation_id, member_id=member,
                                             added_at=utcnow()))
                await self._bump_audience(tx, conv, owner, "participant.added", member)
            return await self._record(tx, conv)

    async def remove_participant(self, conversation_id: str, owner: str,
                                 member: str) -> ConversationRecord:
        async with self.store.transaction() as tx:
            conv = await self._owned(tx, conversation_id, owner)
            if member == owner:
                raise Conflict("The owner cannot leave their own conversation.",
                               code="owner_cannot_leave")
            row = await tx.session.get(m.Participant, (conversation_id, member))
            if row is None:
                raise NotFound("That member is not a participant.",
                               code="participant_not_found")
            await tx.session.delete(row)
            await self._bump_audience(tx, conv, owner, "participant.removed", member)
            return await self._record(tx, conv)

    async def _owned(self, tx: Tx, conversation_id: str, owner: str) -> m.Conversation:
        await self.get_for(conversation_id, owner, tx)  # NotFound for non-participants
        conv = await tx.session.get(m.Conversation, conversation_id)
        assert conv is not None
        if conv.owner != owner:
            raise Forbidden("Only the conversation's owner can change its participants.",
                            code="owner_only")
        return conv

    async def _bump_audience(self, tx: Tx, conv: m.Conversation, actor: str, event: str,
                             member: str) -> None:
        version = (await tx.session.execute(
            update(m.Conversation).where(m.Conversation.id == conv.id)
            .values(audience_version=m.Conversation.audience_version + 1)
            .returning(m.Conversation.audience_version)
        )).scalar_one()
        await tx.append_event(conv.id, event, actor, {"member": member,
                                                      "audience_version": version})
        await tx.audit(actor, event, {"member": member, "audience_version": version},
                       conversation_id=conv.id)
        await tx.session.refresh(conv)

    async def _record(self, tx: Tx, conv: m.Conversation) -> ConversationRecord:
        await tx.session.refresh(conv)
        members = (await tx.session.execute(
            select(m.Participant.member_id)
            .where(m.Participant.conversation_id == conv.id)
            .order_by(m.Participant.added_at, m.Participant.member_id)
        )).scalars().all()
        active = (await tx.session.execute(
            select(m.Run.id, m.Run.status)
            .where(m.Run.conversation_id == conv.id,
                   m.Run.status.in_(m.ACTIVE_RUN_STATUSES))
        )).first()
        return ConversationRecord(
            id=conv.id, owner=conv.owner, agent_id=conv.agent_id, title=conv.title,
            shared=conv.shared, audience_version=conv.audience_version,
            last_seq=conv.last_seq, participants=tuple(members),
            created_at=conv.created_at, updated_at=conv.updated_at,
            active_run={"id": active[0], "status": active[1]} if active else None,
        )


class JournalRepository(_Repository):
    async def read(self, conversation_id: str, member: str, *, after: int = 0,
                   limit: int = 100) -> list[EventRecord]:
        """Events after ``after`` in ``seq`` order; participants only (checked here too:
        anyone else gets NotFound, not an empty page)."""
        return await self.store.read(_journal_page, conversation_id, member, after, limit)

    async def exchanges(self, conversation_id: str) -> list[EventRecord]:
        """Accepted inputs and committed answers, in order: what model context is built from.
        Trusted callers only (the lane); member reads go through :meth:`read`."""
        return await self.store.read(reads.exchanges, conversation_id, single_statement=True)


class InputRepository(_Repository):
    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._batcher: AcceptBatcher | None = None

    async def accept(self, conversation_id: str, member: str, text: str, *, kind: str,
                     idempotency_key: str | None,
                     attachments: Sequence[str] = ()) -> AcceptedInputRecord:
        """Append an accepted input, its queued run and the journal event, atomically.

        The same idempotency key with the same text answers the earlier acceptance and
        writes nothing; with different text (or from another member) it is a conflict.
        ``attachments`` (artifact ids) are resolved as ``member`` and pinned to exact versions
        in the same transaction; one the member may not read is NotFound and nothing is
        written (store/attachments.py).
        """
        from kaizen_server_extension.store.accept_batch import ALONE
        from kaizen_server_extension.store.inputs import NewInput

        digest = text_digest(text)
        new = NewInput(conversation_id, member, text, digest, kind, idempotency_key,
                       input_id=new_id(), run_id=new_id())
        if attachments or not self.store.notifies:
            return await self._accept_alone(new, tuple(attachments))
        # PostgreSQL, the common case: with the acceptances this process holds at once, in
        # one statement (store/accept_batch.py); it checks the key itself.
        outcome = await self.batcher().accept(new)
        if outcome is ALONE:
            return await self._accept_alone(new, ())
        if outcome is None:
            if idempotency_key is not None:
                # Not written: not a participant (NotFound here too), or the key is taken.
                earlier = await self._by_key(conversation_id, member, idempotency_key,
                                             digest)
                if earlier is not None:
                    return earlier
            raise NotFound("No such conversation.", code="conversation_not_found")
        return outcome

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()

    def batcher(self) -> AcceptBatcher:
        from kaizen_server_extension.store.accept_batch import AcceptBatcher

        if self._batcher is None:
            self._batcher = AcceptBatcher(self.store)
        return self._batcher

    async def _accept_alone(self, new: NewInput,
                            attachments: tuple[str, ...]) -> AcceptedInputRecord:
        """One acceptance, its own transaction (with ``attachments``, on SQLite, and for an
        input a batch could not take)."""
        from kaizen_server_extension.store.attachments import AttachmentStore
        from kaizen_server_extension.store.inputs import accept_input

        conversation_id, member, key = new.conversation_id, new.member, new.idempotency_key
        if key is not None:
            earlier = await self._by_key(conversation_id, member, key, new.text_digest,
                                         attachments)
            if earlier is not None:
                return earlier
        accepted: AcceptedInputRecord | None
        try:
            if attachments:
                async with self.store.transaction() as tx:
                    await self.store.conversations.get_for(conversation_id, member, tx)
                    pinned = await AttachmentStore(self.store).pin(tx, member, conversation_id,
                                                                   list(attachments))
                    accepted = await tx.run(accept_input(
                        dataclasses.replace(new, attachments=tuple(
                            r.identity() for r in pinned)),
                        now=utcnow(), notify=tx.notifies))
                    if accepted is not None:
                        AttachmentStore.record(tx, new.input_id, pinned)
            else:
                # One statement (PostgreSQL), the room's row locked only while it runs
                # (store/inputs.py).
                accepted = await self.store.run(
                    accept_input(new, now=utcnow(), notify=self.store.notifies),
                    single_statement=True)
        except IntegrityError:
            # Two requests with one key raced: the loser answers what the winner wrote.
            if key is None:
                raise
            earlier = await self._by_key(conversation_id, member, key, new.text_digest,
                                         attachments)
            if earlier is None:
                raise
            return earlier
        if accepted is None:
            raise NotFound("No such conversation.", code="conversation_not_found")
        return accepted

    async def _by_key(self, conversation_id: str, member: str, key: str, digest: str,
                      attachments: tuple[str, ...] = ()) -> AcceptedInputRecord | None:
        async with self.store.transaction() as tx:
            await self.store.conversations.get_for(conversation_id, member, tx)
            row = (await tx.session.execute(
                select(m.AcceptedInput, m.Run.id)
                .join(m.Run, m.Run.input_id == m.AcceptedInput.id)
                .where(m.AcceptedInput.conversation_id == conversation_id,
                       m.AcceptedInput.idempotency_key == key)
            )).first()
            if row is None:
                return None
            accepted, run_id = row
            from kaizen_server_extension.store.attachments import AttachmentStore

            attached = tuple(await AttachmentStore.ids_of(tx, accepted.id))
            if accepted.member != member or accepted.text_digest != digest or \
                    attached != attachments:
                raise Conflict("This idempotency key was already used for a different "
                               "message.", code="idempotency_key_reused")
            return AcceptedInputRecord(accepted.id, conversation_id, accepted.position,
                                       accepted.kind, member, run_id, digest, key,
                                       created=False)

    async def count(self, conversation_id: str) -> int:
        async with self.store.transaction() as tx:
            return int((await tx.session.execute(
                select(func.count()).select_from(m.AcceptedInput)
                .where(m.AcceptedInput.conversation_id == conversation_id)
            )).scalar_one())


class RunRepository(_Repository):
    async def admission_facts(self, run_id: str) -> AdmissionFacts:
        """A run with its input's text, the model fixed at acceptance and its posture
        (trusted callers)."""
        facts = await self.store.read(reads.admission_facts, run_id, single_statement=True)
        if facts is None:
            raise NotFound("No such run.", code="run_not_found")
        run, text, model, posture = facts
        return AdmissionFacts(run, text, model, CHAT_POSTURE if posture is None else posture)

    async def conversation_of(self, conversation_id: str) -> ConversationRecord:
        """A conversation without a member check (trusted callers only)."""
        record = await self.store.read(reads.conversation_record, conversation_id)
        if record is None:
            raise NotFound("No such conversation.", code="conversation_not_found")
        return record

    async def get_for(self, run_id: str, member: str) -> RunRecord:
        """A run of a conversation the member participates in; otherwise NotFound."""
        async with self.store.transaction() as tx:
            run = await tx.session.get(m.Run, run_id)
            if run is None:
                raise NotFound("No such run.", code="run_not_found")
            try:
                await self.store.conversations.get_for(run.conversation_id, member, tx)
            except NotFound:
                raise NotFound("No such run.", code="run_not_found") from None
            return run_record(run)


@dataclasses.dataclass(frozen=True, slots=True)
class AdmissionFacts:
    """What admitting a run starts from."""

    run: RunRecord
    text: str
    #: The model fixed when the input was accepted (a steering member's), if any.
    model: str | None
    #: ``chat``, or a task firing's ``task_run`` / ``task_test`` (R-053).
    posture: str


def _journal_page(conversation_id: str, member: str, after: int,
                  limit: int) -> Unit[list[EventRecord]]:
    """The membership check and the page, in one snapshot."""
    room = yield from reads.conversation_record(conversation_id, member)
    if room is None:
        raise NotFound("No such conversation.", code="conversation_not_found")
    return (yield from reads.journal_page(conversation_id, member, after, limit))


def run_record(run: m.Run) -> RunRecord:
    return RunRecord(
        id=run.id, conversation_id=run.conversation_id, input_id=run.input_id,
        input_position=run.input_position, member=run.member,
        agent_version_id=run.agent_version_id, audience_version=run.audience_version,
        resource_digest=run.resource_digest, catalog_digest=run.catalog_digest,
        model=run.model, status=run.status, reason=run.reason, fence=run.fence,
        steps=run.steps, tool_calls=run.tool_calls, lease_owner=run.lease_owner,
    )


def _member(row: m.Member) -> MemberRecord:
    return MemberRecord(row.id, row.display_name, row.approval_mode, row.model,
                        row.tool_result_compression)


def _agent(agent: m.Agent, version: m.AgentVersion) -> AgentRecord:
    return AgentRecord(
        id=agent.id, name=agent.name, owner=agent.owner, version=version.version,
        version_id=version.id, persona=version.persona,
        tool_ceiling=tuple(version.tool_ceiling), knowledge_scope=dict(version.knowledge_scope),
        mode=version.mode,
    )
