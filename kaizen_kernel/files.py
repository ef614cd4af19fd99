"""Validate ``artifact_targets`` and capture the declared files from a lease workspace.

Names are bounded relative paths. Before and at capture the worker refuses absolute paths,
``..`` traversal, symlinks (any component — a symlink is refused even when it would resolve
inside the workspace), non-regular files and oversize files (R-086). Capture walks the path
with ``O_NOFOLLOW`` directory file descriptors, so a symlink swapped in between check and
open is still refused, and copies the bytes out of the workspace at once: a persistent
kernel that rewrites the file later cannot change what was captured.
"""

from __future__ import annotations

import errno
import hashlib
import mimetypes
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAX_TARGETS = 16
MAX_TARGET_CHARS = 200
MAX_COMPONENT_CHARS = 120
MAX_DEPTH = 8
DEFAULT_MAX_FILE_BYTES = 25 * 1024 * 1024
DEFAULT_MAX_TOTAL_BYTES = 64 * 1024 * 1024
_CHUNK = 1024 * 1024

_EXTRA_TYPES = {
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".md": "text/markdown",
    ".csv": "text/csv",
    ".json": "application/json",
    ".parquet": "application/vnd.apache.parquet",
}


class TargetRejected(ValueError):
    """An ``artifact_targets`` entry that can never be captured."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{reason}: {name[:MAX_TARGET_CHARS]!r}")
        self.name = name
        self.reason = reason


def validate_target(name: object) -> str:
    """The normalised relative name, or :class:`TargetRejected` with a reason code."""
    if not isinstance(name, str):
        raise TargetRejected(str(name), "not_a_string")
    if not name or not name.strip():
        raise TargetRejected(name, "empty")
    if len(name) > MAX_TARGET_CHARS:
        raise TargetRejected(name, "too_long")
    if "\x00" in name or any(ord(c) < 32 for c in name):
        raise TargetRejected(name, "control_character")
    if "\\" in name:
        raise TargetRejected(name, "backslash")
    if name.startswith("/") or name.startswith("~") or (len(name) > 1 and name[1] == ":"):
        raise TargetRejected(name, "absolute_path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts:
        raise TargetRejected(name, "empty")
    if any(p == ".." for p in parts):
        raise TargetRejected(name, "traversal")
    if len(parts) > MAX_DEPTH:
        raise TargetRejected(name, "too_deep")
    if any(len(p) > MAX_COMPONENT_CHARS for p in parts):
        raise TargetRejected(name, "too_long")
    return "/".join(parts)


def validate_targets(names: Sequence[object]) -> list[str]:
    if len(names) > MAX_TARGETS:
        raise TargetRejected(f"{len(names)} targets", "too_many")
    out: list[str] = []
    for name in names:
        normal = validate_target(name)
        if normal in out:
            raise TargetRejected(normal, "duplicate")
        out.append(normal)
    return out


def guess_mime(name: str) -> str:
    ext = os.path.splitext(name)[1].lower()
    if ext in _EXTRA_TYPES:
        return _EXTRA_TYPES[ext]
    guessed, _ = mimetypes.guess_type(name, strict=False)
    return guessed or "application/octet-stream"


@dataclass(frozen=True, slots=True)
class CapturedFile:
    name: str
    size: int
    sha256: str
    mime: str
    content: bytes = field(repr=False, compare=False)

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256,
                "mime": self.mime}


@dataclass(frozen=True, slots=True)
class RefusedFile:
    name: str
    reason: str  # missing | symlink | not_a_file | too_large | total_too_large | ...

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "reason": self.reason}


def _open_beneath(root_fd: int, parts: list[str]) -> int:
    """Open ``parts`` under ``root_fd`` refusing symlinks at every step. Returns a file fd."""
    dir_fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _classify_oserror(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink"
    if exc.errno == errno.ENOTDIR:
        return "not_a_file"
    if exc.errno == errno.ENOENT:
        return "missing"
    return "unreadable"


def capture(
    workspace: Path,
    targets: Sequence[str],
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
) -> tuple[list[CapturedFile], list[RefusedFile]]:
    """Copy each declared target out of ``workspace``; refusals carry a reason code."""
    files: list[CapturedFile] = []
    refused: list[RefusedFile] = []
    total = 0
    root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for raw in targets:
            try:
                name = validate_target(raw)
            except TargetRejected as exc:
                refused.append(RefusedFile(name=str(raw)[:MAX_TARGET_CHARS], reason=exc.reason))
                continue
            parts = name.split("/")
            # A final-component symlink opened with O_NOFOLLOW fails with ELOOP; an
            # intermediate one with O_DIRECTORY|O_NOFOLLOW fails with ELOOP or ENOTDIR.
            try:
                fd = _open_beneath(root_fd, parts)
            except OSError as exc:
                reason = _classify_oserror(exc)
                if reason == "not_a_file" and _is_symlink_path(workspace, parts):
                    reason = "symlink"
                refused.append(RefusedFile(name=name, reason=reason))
                continue
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    refused.append(RefusedFile(name=name, reason="not_a_file"))
                    continue
                if info.st_size > max_file_bytes:
                    refused.append(RefusedFile(name=name, reason="too_large"))
                    continue
                if total + info.st_size > max_total_bytes:
                    refused.append(RefusedFile(name=name, reason="total_too_large"))
                    continue
                digest = hashlib.sha256()
                chunks: list[bytes] = []
                size = 0
                while True:
                    chunk = os.read(fd, _CHUNK)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > max_file_bytes:  # grew while reading
                        break
                    digest.update(chunk)
                    chunks.append(chunk)
                if size > max_file_bytes:
                    refused.append(RefusedFile(name=name, reason="too_large"))
                    continue
                total += size
                files.append(CapturedFile(name=name, size=size, sha256=digest.hexdigest(),
                                          mime=guess_mime(name), content=b"".join(chunks)))
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)
    return files, refused


def _is_symlink_path(workspace: Path, parts: list[str]) -> bool:
    current = workspace
    for part in parts:
        current = current / part
        if current.is_symlink():
            return True
    return False
