"""The member's Library: collections and projects over their artifacts.

Discovery returns identity only (id, name, one short hint) through the same repositories the
member's own screen uses (R-141). Organizing re-resolves everything inside the write: the
destination must be the caller's, the item must be visible to the caller; a foreign
destination, an invisible item and a missing id are one indistinguishable refusal with no
partial write (R-146, R-147). A kind the destination cannot hold keeps its own wording (R-148).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import and_, select

from kaizen_server_extension.agents import UNSCOPED, KnowledgeScope
from kaizen_server_extension.protocol.errors import MemberError, NotFound
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, ArtifactVersionRecord
from kaizen_server_extension.store.core import Tx, new_id, utcnow
from kaizen_server_extension.store.store import Store

Surface = Literal["artifacts", "collections", "projects"]
ItemKind = Literal["artifact", "collection", "project"]
# A collection references documents: prose and native files, not live canvases.
DOCUMENT_KINDS = ("markdown", "file")
_REFUSAL = ("Nothing was changed: the destination or the item does not exist or is not "
            "available to you.")


@dataclass(frozen=True, slots=True)
class ScopeReach:
    """The part of one member's Library an agent's knowledge scope reaches: the scoped
    collections and projects the member owns, the projects and collections those projects
    link (transitively, each again the member's own), and the artifacts filed or linked in
    any of them. Computed under the member, so it never holds what they cannot open (R-002).
    """

    collections: frozenset[str]
    projects: frozenset[str]
    artifacts: frozenset[str]


class LibraryRefused(NotFound):
    default_code = "library_not_found"


class LibraryKindRefused(MemberError):
    """A statement about shape, not existence; retrying will not help."""

    status = 422
    default_code = "library_wrong_kind"


class LibraryStore:
    def __init__(self, store: Store, artifacts: ArtifactStore | None = None) -> None:
        self.store = store
        self.artifacts = artifacts or ArtifactStore(store)

    async def create_collection(self, owner: str, name: str) -> str:
        async with self.store.transaction() as tx:
            row = m.LibraryCollection(id=new_id(), owner=owner, name=name,
                                      created_at=utcnow())
            tx.session.add(row)
            return row.id

    async def create_project(self, owner: str, name: str) -> str:
        async with self.store.transaction() as tx:
            row = m.LibraryProject(id=new_id(), owner=owner, name=name, created_at=utcnow())
            tx.session.add(row)
            return row.id

    async def inspect(self, member: str, surface: Surface, limit: int = 100, *,
                      scope: KnowledgeScope = UNSCOPED) -> list[dict[str, Any]]:
        """One surface of ``member``'s Library, identity only. A narrowing ``scope`` (an
        agent's) keeps only the listed items it reaches: the listing is the member's own,
        intersected with the scope, never the scope's ids on their own (R-002)."""
        if surface == "artifacts" and not scope.narrows:
            return [{"id": r.artifact_id, "name": r.title,
                     "hint": f"{r.kind}, version {r.version}"}
                    for r in await self.artifacts.list_for(member, limit=limit)]
        async with self.store.transaction() as tx:
            reach = await self.reach(tx, member, scope) if scope.narrows else None
            if surface == "artifacts" and reach is not None:
                return await self._own_artifacts_within(tx, member, reach.artifacts, limit)
            if surface == "collections":
                query = select(m.LibraryCollection.id, m.LibraryCollection.name,
                               m.LibraryCollection.created_at).where(
                    m.LibraryCollection.owner == member)
                if reach is not None:
                    query = query.where(m.LibraryCollection.id.in_(reach.collections))
            else:
                query = select(m.LibraryProject.id, m.LibraryProject.name,
                               m.LibraryProject.created_at).where(
                    m.LibraryProject.owner == member)
                if reach is not None:
                    query = query.where(m.LibraryProject.id.in_(reach.projects))
            rows = (await tx.session.execute(query.order_by(query.selected_columns[2].desc())
                                             .limit(limit))).all()
            return [{"id": i, "name": n, "hint": f"{surface[:-1]} created {c.date()}"}
                    for i, n, c in rows]

    async def reach(self, tx: Tx, member: str, scope: KnowledgeScope) -> ScopeReach:
        """What ``scope`` reaches of ``member``'s Library (see :class:`ScopeReach`).

        Every step keeps only the member's own collections and projects: a scoped id that is
        another member's (or nothing) reaches nothing, not even which items it holds."""
        collections = set((await tx.session.execute(
            select(m.LibraryCollection.id).where(
                m.LibraryCollection.id.in_(scope.collections),
                m.LibraryCollection.owner == member))).scalars().all())
        frontier = set((await tx.session.execute(
            select(m.LibraryProject.id).where(
                m.LibraryProject.id.in_(scope.projects),
                m.LibraryProject.owner == member))).scalars().all())
        projects: set[str] = set()
        artifacts: set[str] = set()
        while frontier:  # a project may link projects; links were checked, owners re-checked
            projects |= frontier
            links = (await tx.session.execute(
                select(m.LibraryProjectItem.item_kind, m.LibraryProjectItem.item_id)
                .where(m.LibraryProjectItem.project_id.in_(frontier)))).all()
            artifacts.update(i for k, i in links if k == "artifact")
            linked_collections = {i for k, i in links if k == "collection"}
            collections.update((await tx.session.execute(
                select(m.LibraryCollection.id).where(
                    m.LibraryCollection.id.in_(linked_collections),
                    m.LibraryCollection.owner == member))).scalars().all())
            linked_projects = {i for k, i in links if k == "project"} - projects
            frontier = set((await tx.session.execute(
                select(m.LibraryProject.id).where(
                    m.LibraryProject.id.in_(linked_projects),
                    m.LibraryProject.owner == member))).scalars().all())
        artifacts.update((await tx.session.execute(
            select(m.LibraryCollectionItem.artifact_id)
            .where(m.LibraryCollectionItem.collection_id.in_(collections)))).scalars().all())
        return ScopeReach(frozenset(collections), frozenset(projects), frozenset(artifacts))

    async def may_retrieve(self, member: str, scope: KnowledgeScope,
                           record: ArtifactVersionRecord, *, room: str,
                           attached: Collection[str] = ()) -> bool:
        """Whether an agent with ``scope`` may read ``record``, a version the store already
        resolved as visible to ``member`` (so this only ever narrows, R-002).

        Unscoped: yes. Scoped: the artifact is in the scope's reach, or it is this
        conversation's own material rather than Library knowledge: attached to this turn, a
        root the member created in this conversation, or another participant's version bound
        to this room. A member's own root made elsewhere does not count even if a version was
        later written here, so writing into the room cannot pull an artifact into reach."""
        if not scope.narrows or record.artifact_id in attached:
            return True
        async with self.store.transaction() as tx:
            if record.owner == member:
                created_here = (await tx.session.execute(
                    select(m.Artifact.id).where(m.Artifact.id == record.artifact_id,
                                                m.Artifact.conversation_id == room)
                )).scalar_one_or_none() is not None
                if created_here:
                    return True
            elif record.room_id == room:
                return True
            return record.artifact_id in (await self.reach(tx, member, scope)).artifacts

    @staticmethod
    async def _own_artifacts_within(tx: Tx, member: str, within: frozenset[str],
                                    limit: int) -> list[dict[str, Any]]:
        """The unscoped artifact listing (the member's own roots, latest version each, newest
        first) kept to ``within``, filtered in the query so the limit counts only those."""
        rows = (await tx.session.execute(
            select(m.Artifact.id, m.Artifact.title, m.ArtifactVersion.kind,
                   m.ArtifactVersion.version)
            .join(m.ArtifactVersion, and_(
                m.ArtifactVersion.artifact_id == m.Artifact.id,
                m.ArtifactVersion.version == m.Artifact.current_version))
            .where(m.Artifact.owner == member, m.Artifact.id.in_(within))
            .order_by(m.Artifact.updated_at.desc(), m.Artifact.id).limit(limit))).all()
        return [{"id": i, "name": title, "hint": f"{kind}, version {version}"}
                for i, title, kind, version in rows]

    async def file_into_collection(self, member: str, collection_id: str,
                                   artifact_id: str) -> bool:
        """Idempotent; True when a membership row was added, False when it existed."""
        async with self.store.transaction() as tx:
            collection = await self._owned(tx, m.LibraryCollection, collection_id, member)
            item = await self._visible_artifact(tx, member, artifact_id)
            if item.kind not in DOCUMENT_KINDS:
                raise LibraryKindRefused(
                    "A collection holds documents, and this artifact is a live canvas, not a "
                    "document, so it cannot be filed there. Do not retry; link it into a "
                    "project instead if that helps.")
            key = (collection.id, item.artifact_id)
            if await tx.session.get(m.LibraryCollectionItem, key) is not None:
                return False
            tx.session.add(m.LibraryCollectionItem(collection_id=collection.id,
                                                   artifact_id=item.artifact_id,
                                                   added_by=member, added_at=utcnow()))
            await tx.audit(member, "member.collection.doc_added",
                           {"collection_id": collection.id, "artifact_id": item.artifact_id})
            return True

    async def link_into_project(self, member: str, project_id: str, item_kind: ItemKind,
                                item_id: str) -> bool:
        """A non-owning pointer; refuses a composition cycle. True when newly linked."""
        async with self.store.transaction() as tx:
            project = await self._owned(tx, m.LibraryProject, project_id, member)
            if item_kind == "artifact":
                item_id = (await self._visible_artifact(tx, member, item_id)).artifact_id
            elif item_kind == "collection":
                item_id = (await self._owned(tx, m.LibraryCollection, item_id, member)).id
            else:
                item_id = (await self._owned(tx, m.LibraryProject, item_id, member)).id
                if await self._reaches(tx, item_id, project.id):
                    raise LibraryKindRefused("Linking that project here would make a project "
                                             "contain itself.", code="library_cycle")
            key = (project.id, item_kind, item_id)
            if await tx.session.get(m.LibraryProjectItem, key) is not None:
                return False
            tx.session.add(m.LibraryProjectItem(project_id=project.id, item_kind=item_kind,
                                                item_id=item_id, added_by=member,
                                                added_at=utcnow()))
            await tx.audit(member, "member.project.item_linked",
                           {"project_id": project.id, "kind": item_kind, "item_id": item_id})
            return True

    async def owns_destination(self, member: str, kind: Literal["collection", "project"],
                               destination_id: str) -> bool:
        """Whether ``member`` owns the collection or project ``destination_id``."""
        model = m.LibraryCollection if kind == "collection" else m.LibraryProject
        async with self.store.transaction() as tx:
            owner = (await tx.session.execute(
                select(model.owner).where(model.id == destination_id))).scalar_one_or_none()
        return owner == member

    async def collection_items(self, member: str, collection_id: str) -> list[str]:
        async with self.store.transaction() as tx:
            await self._owned(tx, m.LibraryCollection, collection_id, member)
            return list((await tx.session.execute(
                select(m.LibraryCollectionItem.artifact_id)
                .where(m.LibraryCollectionItem.collection_id == collection_id)
            )).scalars().all())

    async def project_items(self, member: str, project_id: str) -> list[tuple[str, str]]:
        async with self.store.transaction() as tx:
            await self._owned(tx, m.LibraryProject, project_id, member)
            rows = (await tx.session.execute(
                select(m.LibraryProjectItem.item_kind, m.LibraryProjectItem.item_id)
                .where(m.LibraryProjectItem.project_id == project_id))).all()
            return [(str(k), str(i)) for k, i in rows]

    async def _owned(self, tx: Tx, model: type[m.LibraryCollection | m.LibraryProject],
                     ident: str, member: str) -> Any:
        row: Any = await tx.session.get(model, ident) if len(ident) <= 64 else None
        if row is None or row.owner != member:
            raise LibraryRefused(_REFUSAL)
        return row

    async def _visible_artifact(self, tx: Tx, member: str, artifact_id: str) -> Any:
        try:
            return await self.artifacts.resolve(member, artifact_id, tx=tx)
        except NotFound:
            raise LibraryRefused(_REFUSAL) from None

    @staticmethod
    async def _reaches(tx: Tx, start: str, target: str) -> bool:
        """Whether project ``start`` is ``target`` or (transitively) links to it."""
        seen, frontier = set(), [start]
        while frontier:
            current = frontier.pop()
            if current == target:
                return True
            if current in seen:
                continue
            seen.add(current)
            frontier.extend((await tx.session.execute(
                select(m.LibraryProjectItem.item_id)
                .where(m.LibraryProjectItem.project_id == current,
                       m.LibraryProjectItem.item_kind == "project"))).scalars().all())
        return False
