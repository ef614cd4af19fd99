"""A member's copies of files from the Jupyter contents tree, kept as artifacts they own.

One artifact per (member, Jupyter path), named by ``jupyter_file_sources``: the first read
makes it (kind ``file``, titled and projected under the file's own name), a read with other
bytes appends its next immutable version, and a read of unchanged bytes reuses the latest.
The artifact belongs to the member alone and to no room (no journal event, nothing another
participant can read) until a message attaches it, which pins one exact version like any
other attachment (``store/attachments.py``).
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from kaizen_server_extension.protocol.errors import Conflict
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    ArtifactVersionRecord,
    content_digest,
)
from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.store import Store


class JupyterFileCopies:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.artifacts = ArtifactStore(store)

    async def keep(self, owner: str, path: str, name: str, content: bytes,
                   media_type: str) -> tuple[ArtifactVersionRecord, bool]:
        """The member's artifact version holding these bytes of ``path``: (record, reused).
        The source row's key and the root's row lock serialize concurrent reads of one path
        (a second creator loses the insert and looks again)."""
        digest = content_digest(content)
        for _attempt in range(3):
            try:
                async with self.store.transaction() as tx:
                    source = (await tx.session.execute(
                        select(m.JupyterFileSource)
                        .where(m.JupyterFileSource.owner == owner,
                               m.JupyterFileSource.path == path)
                        .with_for_update())).scalar_one_or_none()
                    if source is None:
                        record = await self.artifacts.create(
                            owner, title=name, kind="file", content=content, mime=media_type,
                            source_name=name, tx=tx)
                        tx.session.add(m.JupyterFileSource(
                            owner=owner, path=path, artifact_id=record.artifact_id,
                            updated_at=utcnow()))
                        await tx.session.flush()
                        return record, False
                    root = await self.artifacts.lock_owned(tx, owner, source.artifact_id)
                    latest = await self.artifacts.resolve(owner, root.id, tx=tx)
                    if latest.digest == digest and latest.mime == media_type:
                        return latest, True
                    record = await self.artifacts.update(
                        owner, root.id, content=content, expected_version=root.current_version,
                        tx=tx)
                    await tx.session.execute(
                        update(m.JupyterFileSource)
                        .where(m.JupyterFileSource.owner == owner,
                               m.JupyterFileSource.path == path)
                        .values(updated_at=utcnow()))
                    return record, False
            except IntegrityError:
                continue  # another read of the same path created the source first
        raise Conflict("The file could not be stored; nothing was saved. Try again.",
                       code="artifact_busy")
