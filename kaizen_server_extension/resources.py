"""A turn's shared resources: the member's attached files, pinned when the input is accepted.

Pure data shared by the store (which resolves and records them), the lane (which binds their
digest into the run's authority bundle at admission) and the sandbox (which projects exactly
these versions read-only for run_code). Bytes are never part of these records: only identity,
exact version, content digest, size, the server-chosen file name and media type (R-176).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: How many files one message may attach (API.md ``attachments``).
MAX_ATTACHMENTS = 8
#: The reference kind of an attached artifact in the manifest.
ARTIFACT_REFERENCE = "artifact"
#: The reference kind of an uploaded document version request_document projected.
DOCUMENT_REFERENCE = "document"


@dataclass(frozen=True, slots=True)
class SharedResource:
    """One authorized file of a turn, pinned to an exact immutable version."""

    reference_id: str
    kind: str
    version: int
    sha256: str
    filename: str
    media_type: str
    size: int

    def identity(self) -> dict[str, Any]:
        """The digest-bound fields, in manifest spelling (no path: that is per sandbox)."""
        return {"reference_id": self.reference_id, "kind": self.kind, "version": self.version,
                "sha256": self.sha256, "filename": self.filename,
                "media_type": self.media_type, "size": self.size}

    def audit(self) -> dict[str, Any]:
        """The bounded audit form: ids, versions, digests, sizes; never content (R-457)."""
        return {"reference_id": self.reference_id, "version": self.version,
                "sha256": self.sha256, "size": self.size}


def resources_digest(resources: Sequence[SharedResource]) -> str:
    """Digest of the ordered resource list; the admitted value and the sandbox's recomputed
    value must agree before anything is dispatched (R-455)."""
    payload = json.dumps([r.identity() for r in resources], sort_keys=True,
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class AdmittedResources:
    """What the run was admitted with: the pinned list and its digest (part of the bundle's
    ``resource_digest``)."""

    resources: tuple[SharedResource, ...] = ()
    digest: str = resources_digest(())

    @classmethod
    def of(cls, resources: Sequence[SharedResource]) -> AdmittedResources:
        pinned = tuple(resources)
        return cls(pinned, resources_digest(pinned))

    def __bool__(self) -> bool:
        return bool(self.resources)

    def audit(self) -> dict[str, Any]:
        return {"digest": self.digest, "resources": [r.audit() for r in self.resources]}


NO_RESOURCES = AdmittedResources()
