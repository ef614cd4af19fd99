"""The read-only projection of a turn's authorized files for run_code (R-175, R-454..R-456).

The run was admitted with a pinned list (:class:`AdmittedResources`: ids, exact versions,
content digests, sizes, server-chosen file names) whose digest is part of its authority
bundle. Before a call is dispatched the sandbox fetches exactly those versions through the
host's member-scoped fetcher, recomputes every digest and size *from the bytes it got*, and
compares the digest of that list with the admitted one: any difference — a version other
than the admitted one, other bytes, a missing or no-longer-readable file, a forged list —
refuses the call before any code runs (R-455). Nothing in the tool's arguments can name a
file (R-456): the list comes from the admission alone.

The verified bytes are written once per kernel into a directory the server assigns outside
the writable workspace (``<state>/resources/<kernel id>``), files ``0444`` in a ``0555``
directory; inside the bubblewrap jail the directory is bound read-only. The kernel learns the
directory and a manifest (path, reference id, kind, version, sha256, filename, media type,
size) through ``KAIZEN_SHARED_RESOURCES_DIR`` / ``KAIZEN_SHARED_RESOURCES_MANIFEST``, set at
binding time and removed again when a later call has no files. Bytes travel only through the
files themselves, never through arguments, the manifest, output or the audit (R-176).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kaizen_server_extension.resources import (
    AdmittedResources,
    SharedResource,
    resources_digest,
)

DIR_ENV = "KAIZEN_SHARED_RESOURCES_DIR"
MANIFEST_ENV = "KAIZEN_SHARED_RESOURCES_MANIFEST"


@dataclass(frozen=True, slots=True)
class FetchedVersion:
    """What the store holds for one pinned reference right now, as the acting member."""

    version: int
    media_type: str
    content: bytes


#: ``fetch(resource)``: the bytes of ``resource.reference_id`` at ``resource.version`` as the
#: acting member may read them; raises LookupError when they may not (or it is gone).
Fetcher = Callable[[SharedResource], Awaitable[FetchedVersion]]


@dataclass(frozen=True, slots=True)
class ResourceGrant:
    """The admitted list and how to fetch its bytes: handed to the sandbox by trusted code."""

    admitted: AdmittedResources
    fetch: Fetcher


class ResourcesRefused(Exception):
    """The projection cannot be proven to be the admitted one: nothing is dispatched."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class VerifiedFile:
    resource: SharedResource
    content: bytes


@dataclass(frozen=True, slots=True)
class VerifiedResources:
    files: tuple[VerifiedFile, ...]
    digest: str

    def audit(self) -> list[dict[str, Any]]:
        """The bounded list a result (and so the run's audit) carries: never content."""
        return [f.resource.audit() for f in self.files]


async def verify(grant: ResourceGrant) -> VerifiedResources:
    """Fetch the admitted versions and prove they are what the run was admitted with."""
    admitted = grant.admitted
    if resources_digest(admitted.resources) != admitted.digest:
        raise ResourcesRefused("resource_manifest_mismatch",
                               "the resource list does not match its admitted digest")
    files: list[VerifiedFile] = []
    for pinned in admitted.resources:
        try:
            found = await grant.fetch(pinned)
        except LookupError:
            raise ResourcesRefused("resource_unavailable",
                                   "an authorized file of this turn is no longer readable"
                                   ) from None
        # Identity as found now, digest and size from the very bytes that will be written.
        actual = dataclasses.replace(
            pinned, version=found.version, media_type=found.media_type,
            sha256=hashlib.sha256(found.content).hexdigest(), size=len(found.content))
        files.append(VerifiedFile(actual, found.content))
    digest = resources_digest([f.resource for f in files])
    if digest != admitted.digest:
        raise ResourcesRefused("resource_manifest_mismatch",
                               "an authorized file differs from the version this turn was "
                               "admitted with")
    return VerifiedResources(tuple(files), digest)


def _writable(directory: Path) -> None:
    directory.chmod(stat.S_IRWXU)


def _sealed(directory: Path) -> None:
    directory.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP
                    | stat.S_IROTH | stat.S_IXOTH)


def _empty(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def prepare_directory(directory: Path) -> Path:
    """Create the (empty, sealed) projection directory of one kernel."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.is_symlink() or not directory.is_dir():
        raise RuntimeError("the shared-resources directory is not a private directory")
    _sealed(directory)
    return directory.resolve()


def project(directory: Path, verified: VerifiedResources) -> str:
    """Replace the directory's files with ``verified``'s; returns the manifest JSON."""
    _writable(directory)
    try:
        _empty(directory)
        manifest: list[dict[str, Any]] = []
        for item in verified.files:
            path = directory / item.resource.filename
            if path.parent != directory:  # names are flat by construction; never trust it
                raise ResourcesRefused("resource_manifest_mismatch", "unsafe file name")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
            with os.fdopen(fd, "wb") as handle:
                handle.write(item.content)
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            manifest.append({"path": str(path), **item.resource.identity()})
    finally:
        _sealed(directory)
    return json.dumps(manifest, separators=(",", ":"))


def clear(directory: Path) -> None:
    """No files for this call: the directory is emptied (and stays sealed)."""
    _writable(directory)
    try:
        _empty(directory)
    finally:
        _sealed(directory)


def remove(directory: Path) -> None:
    if directory.exists():
        _writable(directory)
        shutil.rmtree(directory, ignore_errors=True)
