"""The attached notebooks of a turn, rendered into the message the run answers.

Called by the lane when it builds the run's model context (``lanes/service.py``), for the
turn's admitted resources only: each attached notebook, at its pinned version and as the
member may read it now, becomes one bounded outline (``document.render_outline``). A version
whose bytes no longer match the pin renders as a one-line note instead, so a prompt never
carries bytes the run was not admitted with. Other attached files are not rendered here.
"""

from __future__ import annotations

import hashlib
import logging

from kaizen_server_extension.notebooks.document import (
    DEFAULT_CONTEXT_CHARS,
    NOTEBOOK_MEDIA_TYPE,
    NotebookDocument,
    NotebookFormatError,
    render_outline,
)
from kaizen_server_extension.protocol.errors import NotFound
from kaizen_server_extension.resources import AdmittedResources
from kaizen_server_extension.store.artifacts import ArtifactStore
from kaizen_server_extension.store.store import Store

log = logging.getLogger("kaizen.notebooks")


async def notebook_context(store: Store, member: str, conversation_id: str,
                           resources: AdmittedResources,
                           budget: int = DEFAULT_CONTEXT_CHARS) -> str | None:
    notebooks = [r for r in resources.resources if r.media_type == NOTEBOOK_MEDIA_TYPE]
    if not notebooks:
        return None
    artifacts = ArtifactStore(store)
    share = max(1000, budget // len(notebooks))
    blocks: list[str] = []
    for resource in notebooks:
        try:
            record = await artifacts.resolve(member, resource.reference_id,
                                             version=resource.version, room=conversation_id)
        except NotFound:
            blocks.append(f"(An attached notebook, {resource.filename}, is no longer "
                          "available.)")
            continue
        if hashlib.sha256(record.content).hexdigest() != resource.sha256:
            blocks.append(f"(An attached notebook, {resource.filename}, does not match what "
                          "was attached and is left out.)")
            continue
        try:
            doc = NotebookDocument.parse(record.content)
        except NotebookFormatError as exc:
            blocks.append(f"(An attached file, {resource.filename}, is not a readable "
                          f"notebook: {exc})")
            continue
        blocks.append(render_outline(doc, path=record.source_name or resource.filename,
                                     reference=resource.reference_id,
                                     version=resource.version, budget=share))
    return "\n\n".join(blocks)
