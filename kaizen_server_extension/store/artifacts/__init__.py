"""Member artifacts: versioned, owner-scoped documents the tools and the panel write and read.

- :mod:`.repository`: :class:`ArtifactStore`, the versions, rooms and governed artifacts;
- :mod:`.content`: kinds, languages, the reserved renderable kind and its attestation;
- :mod:`.edit`: the line-hunk edit language of ``edit_artifact``;
- :mod:`.drafts`: staged creation (``begin/append/finalize/discard_artifact``);
- :mod:`.checkpoints`: ``update_artifact`` arguments checkpointed as they stream.

This package's own namespace is the artifact face tools use: the record and scope types,
refusal codes and the pure content and edit helpers. The services themselves reach a tool
built by the host (``ctx.services.artifacts``, tools/services.py); a tool constructs none.
"""

from kaizen_server_extension.store.artifacts.checkpoints import (
    FENCED_CHECKPOINT_CODES,
    CheckpointScope,
    UpdateCheckpoints,
)
from kaizen_server_extension.store.artifacts.content import MODEL_KINDS, is_reserved
from kaizen_server_extension.store.artifacts.drafts import (
    FENCED_DRAFT_CODES,
    DraftScope,
    DraftStore,
)
from kaizen_server_extension.store.artifacts.edit import (
    MAX_WINDOW_LINES,
    EditError,
    apply_hunks,
    content_tag,
    numbered_window,
    parse_hunks,
    split_lines,
)
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    ArtifactVersionRecord,
    WriteContext,
)
from kaizen_server_extension.store.library import LibraryStore

__all__ = [
    "FENCED_CHECKPOINT_CODES",
    "FENCED_DRAFT_CODES",
    "MAX_WINDOW_LINES",
    "MODEL_KINDS",
    "ArtifactStore",
    "ArtifactVersionRecord",
    "CheckpointScope",
    "DraftScope",
    "DraftStore",
    "EditError",
    "LibraryStore",
    "UpdateCheckpoints",
    "WriteContext",
    "apply_hunks",
    "content_tag",
    "is_reserved",
    "numbered_window",
    "parse_hunks",
    "split_lines",
]
