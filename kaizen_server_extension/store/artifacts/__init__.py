"""Member artifacts: versioned, owner-scoped documents the tools and the panel write and read.

- :mod:`.repository`: :class:`ArtifactStore`, the versions, rooms and governed artifacts;
- :mod:`.content`: kinds, languages, the reserved renderable kind and its attestation;
- :mod:`.edit`: the line-hunk edit language of ``edit_artifact``;
- :mod:`.drafts`: staged creation (``begin/append/finalize/discard_artifact``);
- :mod:`.checkpoints`: ``update_artifact`` arguments checkpointed as they stream.
"""

from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    ArtifactVersionRecord,
    WriteContext,
)

__all__ = ["ArtifactStore", "ArtifactVersionRecord", "WriteContext"]
