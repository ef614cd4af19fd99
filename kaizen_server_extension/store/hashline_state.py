"""Hashline's trusted state in the database: snapshots and named registers that outlive a
kernel lease, a worker and the server process that took them (R-159).

The Hashline engine stays pure and synchronous over its :class:`WorkspaceState` interface.
Each tool call here:

1. ``load``: one (actor, conversation) namespace is read into a fresh in-memory
   :class:`WorkspaceState` (paths in their stored recency order, newest version first);
2. the engine runs over that state as before (in a worker thread);
3. ``save``: what changed is written back in one transaction — each changed path's rows are
   replaced by its (at most four) current versions, paths the state evicted or dropped are
   deleted, and the registers are replaced when they changed.

The history bound is the database's as well: ``hashline_versions.slot`` is CHECKed to 0..3, so
a fifth version of one path cannot be stored, whatever the caller does. Calls on one namespace
are serialized in this process; across processes the room's single active run is what keeps
two writers of one (actor, conversation) apart.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store

if TYPE_CHECKING:
    # The Hashline engine is loaded by the first workspace read or edit, not at start-up.
    from kaizen_hashline.state import WorkspaceKey, WorkspaceState


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a namespace looked like when loaded: per path a fingerprint of its versions."""

    paths: dict[str, str]
    registers: str


def _fingerprint_versions(state: WorkspaceState, key: WorkspaceKey, path: str) -> str:
    digest = hashlib.sha256()
    for version in state.versions(key, path):
        digest.update(version.tag.encode())
        digest.update(hashlib.sha256(version.text.encode("utf-8")).digest())
        digest.update(",".join(map(str, sorted(version.seen))).encode())
        digest.update(b"|")
    return digest.hexdigest()


def _fingerprint_registers(state: WorkspaceState, key: WorkspaceKey) -> str:
    digest = hashlib.sha256()
    for name, rows in state.registers(key).items():
        digest.update(name.encode("utf-8") + b"\0")
        for row in rows:
            digest.update(row.encode("utf-8") + b"\n")
        digest.update(b"\1")
    return digest.hexdigest()


class StoredWorkspaceState:
    """``ctx.services.workspace_store``: the database-backed Hashline state."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._locks: dict[WorkspaceKey, asyncio.Lock] = {}

    @asynccontextmanager
    async def session(self, key: WorkspaceKey) -> AsyncIterator[WorkspaceState]:
        """A loaded namespace for one tool call; what changed is saved when it ends."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            state, before = await self.load(key)
            try:
                yield state
            finally:
                # Also after a refused edit: it recorded the live file under a fresh tag that
                # its message shows the model.
                await self.save(key, state, before)

    async def load(self, key: WorkspaceKey) -> tuple[WorkspaceState, _Snapshot]:
        from kaizen_hashline.state import WorkspaceState

        state = WorkspaceState()
        async with self.store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.HashlineVersion)
                .where(m.HashlineVersion.actor == key.actor,
                       m.HashlineVersion.conversation_id == key.conversation_id)
                .order_by(m.HashlineVersion.touched, m.HashlineVersion.path,
                          m.HashlineVersion.slot.desc()))).scalars().all()
            registers = (await tx.session.execute(
                select(m.HashlineRegister)
                .where(m.HashlineRegister.actor == key.actor,
                       m.HashlineRegister.conversation_id == key.conversation_id)
                .order_by(m.HashlineRegister.ordinal))).scalars().all()
        # Oldest slot first, so recording leaves slot 0 (the newest) at the front.
        for row in rows:
            state.record(key, row.path, row.text, seen=[int(n) for n in row.seen], tag=row.tag)
        state.publish_registers(key, {r.name: [str(x) for x in r.rows] for r in registers})
        return state, _Snapshot(
            {p: _fingerprint_versions(state, key, p) for p in state.paths(key)},
            _fingerprint_registers(state, key))

    async def save(self, key: WorkspaceKey, state: WorkspaceState, before: _Snapshot) -> None:
        now_paths = state.paths(key)
        changed = [p for p in now_paths
                   if before.paths.get(p) != _fingerprint_versions(state, key, p)]
        gone = [p for p in before.paths if p not in set(now_paths)]
        registers_changed = before.registers != _fingerprint_registers(state, key)
        if not changed and not gone and not registers_changed:
            return
        where = (m.HashlineVersion.actor == key.actor,
                 m.HashlineVersion.conversation_id == key.conversation_id)
        async with self.store.transaction() as tx:
            touched = int((await tx.session.execute(
                select(func.coalesce(func.max(m.HashlineVersion.touched), 0))
                .where(*where))).scalar_one())
            stale = changed + gone
            if stale:
                await tx.session.execute(
                    delete(m.HashlineVersion).where(*where,
                                                    m.HashlineVersion.path.in_(stale)))
            for path in changed:  # least recently used first: the newest gets the top
                touched += 1
                # PostgreSQL text cannot hold NUL; such a version is not kept, so its tag
                # fails closed on a later call instead of failing this one after its write.
                kept = [v for v in state.versions(key, path) if "\x00" not in v.text]
                for slot, version in enumerate(kept):
                    tx.session.add(m.HashlineVersion(
                        actor=key.actor, conversation_id=key.conversation_id, path=path,
                        slot=slot, tag=version.tag, text=version.text,
                        seen=sorted(version.seen), touched=touched))
            if registers_changed:
                await tx.session.execute(delete(m.HashlineRegister).where(
                    m.HashlineRegister.actor == key.actor,
                    m.HashlineRegister.conversation_id == key.conversation_id))
                for ordinal, (name, rows) in enumerate(state.registers(key).items()):
                    if any("\x00" in row for row in rows):
                        continue  # not storable on PostgreSQL (JSONB): dropped, not half-kept
                    tx.session.add(m.HashlineRegister(
                        actor=key.actor, conversation_id=key.conversation_id, name=name,
                        ordinal=ordinal, rows=list(rows)))
            await tx.session.flush()

    async def retained(self, key: WorkspaceKey, path: str) -> int:
        """How many versions of ``path`` are kept (tests, diagnostics)."""
        async with self.store.transaction() as tx:
            return int((await tx.session.execute(
                select(func.count()).select_from(m.HashlineVersion)
                .where(m.HashlineVersion.actor == key.actor,
                       m.HashlineVersion.conversation_id == key.conversation_id,
                       m.HashlineVersion.path == path))).scalar_one())
