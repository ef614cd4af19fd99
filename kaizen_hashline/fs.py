"""The only I/O of the Hashline package: a no-follow view of one workspace directory.

Every path is a validated relative path (:func:`canonical_path`) walked component by component
from a directory file descriptor opened with ``O_NOFOLLOW``: an absolute path, ``..``, or a
symlink anywhere on the path (even one that would resolve inside the workspace) is refused, and
a symlink swapped in between check and use still fails the open (R-086, R-155).

:class:`Transaction` stages every write of an edit as a temporary file in the destination
directory, then renames them into place (atomic per file) and removes sources; if any step
fails, every step already taken is undone in reverse order, so the batch lands whole or not at
all (R-087, R-156). Tests inject faults by subclassing :class:`WorkspaceFS`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kaizen_hashline.errors import HashlineError
from kaizen_hashline.limits import MAX_PATH_CHARS as MAX_PATH_CHARS

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_DEPTH = 32
MAX_COMPONENT_CHARS = 255
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = ".kaizen-hl-"


def _refused(path: str, reason: str, detail: str) -> HashlineError:
    return HashlineError(f"path {path[:200]!r} refused ({reason}): {detail}",
                         code="path_refused")


def canonical_path(raw: str) -> str:
    """The normalized workspace-relative path, or ``path_refused``."""
    if not isinstance(raw, str) or not raw.strip():
        raise HashlineError("a path is required", code="path_refused")
    path = raw.strip()
    if len(path) > MAX_PATH_CHARS:
        raise _refused(path, "too_long", f"paths are at most {MAX_PATH_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise _refused(path, "control_character", "control characters are not allowed")
    if "\\" in path:
        raise _refused(path, "backslash", "use '/' as the separator")
    if path.startswith(("/", "~")) or (len(path) > 1 and path[1] == ":"):
        raise _refused(path, "absolute_path",
                       "use a path relative to the workspace, e.g. src/app.py")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise _refused(path, "not_a_file", "the workspace root is not a file")
    if ".." in parts:
        raise _refused(path, "traversal", "'..' is not allowed; paths stay inside the workspace")
    if len(parts) > MAX_DEPTH:
        raise _refused(path, "too_deep", f"at most {MAX_DEPTH} directory levels")
    if any(len(p) > MAX_COMPONENT_CHARS for p in parts):
        raise _refused(path, "too_long", "a path component is too long")
    if any(p.startswith(_TEMP_PREFIX) for p in parts):
        raise _refused(path, "reserved", "this name is reserved for staging files")
    return "/".join(parts)


@dataclass(frozen=True, slots=True)
class Identity:
    """What a file was when it was read: a changed file is not overwritten."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> Identity:
        return cls(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class FileData:
    path: str
    data: bytes
    mode: int
    identity: Identity


class WorkspaceFS:
    def __init__(self, root: Path | str, *, max_file_bytes: int = MAX_FILE_BYTES) -> None:
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes

    # --- low-level primitives (fault-injection points) ------------------------------------

    def _open_root(self) -> int:
        return os.open(self.root, _DIR_FLAGS)

    def _open_dir(self, dir_fd: int, name: str) -> int:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)

    def _mkdir(self, dir_fd: int, name: str) -> None:
        os.mkdir(name, 0o755, dir_fd=dir_fd)

    def _write_temp(self, dir_fd: int, name: str, data: bytes, mode: int) -> None:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode & 0o7777 or 0o644, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode & 0o7777 or 0o644)
        finally:
            os.close(fd)

    def _rename(self, src_fd: int, src: str, dst_fd: int, dst: str) -> None:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)

    def _unlink(self, dir_fd: int, name: str) -> None:
        os.unlink(name, dir_fd=dir_fd)

    def _rmdir(self, dir_fd: int, name: str) -> None:
        os.rmdir(name, dir_fd=dir_fd)

    # --- walking --------------------------------------------------------------------------

    @contextlib.contextmanager
    def parent(self, path: str, *, create: bool = False,
               created: list[str] | None = None) -> Iterator[int | None]:
        """A no-follow fd of ``path``'s directory; None when a directory is missing."""
        parts = path.split("/")
        fd = self._open_root()
        try:
            walked: list[str] = []
            for part in parts[:-1]:
                walked.append(part)
                try:
                    nxt = self._open_dir(fd, part)
                except FileNotFoundError:
                    if not create:
                        yield None
                        return
                    self._mkdir(fd, part)
                    if created is not None:
                        created.append("/".join(walked))
                    nxt = self._open_dir(fd, part)
                except OSError as exc:
                    raise self._classify(fd, part, "/".join(walked), exc) from None
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def _classify(self, dir_fd: int, name: str, shown: str, exc: OSError) -> HashlineError:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            info = None
        if (info is not None and stat.S_ISLNK(info.st_mode)) or exc.errno == errno.ELOOP:
            return _refused(shown, "symlink", "symlinks are not followed in the workspace")
        if exc.errno == errno.ENOTDIR:
            return _refused(shown, "not_a_directory", "a path component is not a directory")
        return HashlineError(f"{shown!r} cannot be opened ({exc.strerror})", code="io_error",
                             domain="tool")

    def lstat(self, path: str) -> os.stat_result | None:
        """No-follow stat of ``path`` (None when missing); a symlinked directory is refused."""
        with self.parent(path) as dir_fd:
            if dir_fd is None:
                return None
            try:
                return os.stat(path.rsplit("/", 1)[-1], dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return None

    def read(self, path: str) -> FileData | None:
        """The bytes of a regular file (None when missing), bounded by ``max_file_bytes``."""
        name = path.rsplit("/", 1)[-1]
        with self.parent(path) as dir_fd:
            if dir_fd is None:
                return None
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise self._classify(dir_fd, name, path, exc) from None
            try:
                info = os.fstat(fd)
                if stat.S_ISDIR(info.st_mode):
                    raise _refused(path, "not_a_file", "it is a directory")
                if not stat.S_ISREG(info.st_mode):
                    raise _refused(path, "not_a_file", "only regular files can be read")
                if info.st_size > self.max_file_bytes:
                    raise _too_large(path, self.max_file_bytes)
                chunks: list[bytes] = []
                size = 0
                while True:
                    chunk = os.read(fd, 1024 * 1024)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > self.max_file_bytes:
                        raise _too_large(path, self.max_file_bytes)
                    chunks.append(chunk)
                return FileData(path, b"".join(chunks), info.st_mode, Identity.of(info))
            finally:
                os.close(fd)

    def identity(self, path: str) -> Identity | None:
        info = self.lstat(path)
        if info is None:
            return None
        return Identity.of(info)


def _too_large(path: str, limit: int) -> HashlineError:
    return HashlineError(f"{path} is larger than {limit // (1024 * 1024)} MiB; Hashline edits "
                         "text files up to that size (use run_code for bigger files)",
                         code="file_too_large")


# --- transactions -------------------------------------------------------------------------

@dataclass(slots=True)
class Write:
    """Replace or create ``path`` with ``data``; ``expect`` is the identity read (None: new)."""

    path: str
    data: bytes
    mode: int
    expect: Identity | None
    backup: FileData | None = None  # the bytes being replaced, for rollback


@dataclass(slots=True)
class Remove:
    path: str
    expect: Identity
    backup: FileData


Step = Write | Remove


class CommitFailed(HashlineError):
    def __init__(self, message: str, *, rolled_back: bool) -> None:
        super().__init__(message, code="commit_failed" if rolled_back else "rollback_failed",
                         domain="tool")
        self.rolled_back = rolled_back


@dataclass(slots=True)
class Transaction:
    fs: WorkspaceFS
    steps: Sequence[Step]
    _temps: list[tuple[str, str]] = field(default_factory=list)  # (final path, temp name)
    _created_dirs: list[str] = field(default_factory=list)
    _done: list[Step] = field(default_factory=list)

    def commit(self) -> None:
        """Stage every write, then apply all steps in order; undo everything on failure."""
        try:
            self._stage()
            for step in self.steps:
                self._check(step)
                if isinstance(step, Write):
                    temp = self._temp_for(step.path)
                    self._move_into_place(step.path, temp)
                    self._temps = [t for t in self._temps if t[1] != temp]
                else:
                    with self.fs.parent(step.path) as dir_fd:
                        if dir_fd is None:
                            raise FileNotFoundError(step.path)
                        self.fs._unlink(dir_fd, _leaf(step.path))
                self._done.append(step)
        except Exception as exc:
            clean = self._rollback()
            if isinstance(exc, HashlineError) and exc.code == "concurrent_change" and clean:
                raise
            detail = exc.args[0] if isinstance(exc, HashlineError) else type(exc).__name__
            if clean:
                raise CommitFailed(f"writing the edit failed ({detail}); every file was "
                                   "restored and nothing changed", rolled_back=True) from exc
            raise CommitFailed(f"writing the edit failed ({detail}) and restoring some files "
                               "also failed; re-read the files before editing again",
                               rolled_back=False) from exc

    def _temp_for(self, path: str) -> str:
        for final, temp in self._temps:
            if final == path:
                return temp
        raise RuntimeError("unstaged write")

    def _stage(self) -> None:
        for step in self.steps:
            if not isinstance(step, Write):
                continue
            temp = f"{_TEMP_PREFIX}{secrets.token_hex(6)}"
            with self.fs.parent(step.path, create=True, created=self._created_dirs) as dir_fd:
                assert dir_fd is not None
                self.fs._write_temp(dir_fd, temp, step.data, step.mode)
            self._temps.append((step.path, temp))

    def _check(self, step: Step) -> None:
        current = self.fs.identity(step.path)
        if current != step.expect:
            raise HashlineError(f"{step.path} changed while the edit was being written; nothing "
                                "was changed. Re-read it and edit again",
                                code="concurrent_change")

    def _move_into_place(self, path: str, temp: str) -> None:
        with self.fs.parent(path) as dir_fd:
            if dir_fd is None:
                raise FileNotFoundError(path)
            self.fs._rename(dir_fd, temp, dir_fd, _leaf(path))

    def _rollback(self) -> bool:
        clean = True
        for step in reversed(self._done):
            try:
                if isinstance(step, Write):
                    if step.backup is None:
                        with self.fs.parent(step.path) as dir_fd:
                            if dir_fd is not None:
                                self.fs._unlink(dir_fd, _leaf(step.path))
                    else:
                        self._restore(step.backup)
                else:
                    self._restore(step.backup)
            except Exception:
                clean = False
                log.warning("hashline rollback of %s failed", step.path, exc_info=True)
        for final, temp in self._temps:
            try:
                with self.fs.parent(final) as dir_fd:
                    if dir_fd is not None:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(temp, dir_fd=dir_fd)
            except Exception:
                log.warning("hashline temp cleanup failed", exc_info=True)
        for directory in reversed(self._created_dirs):
            try:
                with self.fs.parent(directory) as dir_fd:
                    if dir_fd is not None:
                        self.fs._rmdir(dir_fd, _leaf(directory))
            except OSError:
                log.warning("hashline rollback could not remove %s", directory, exc_info=True)
        self._temps.clear()
        return clean

    def _restore(self, backup: FileData) -> None:
        temp = f"{_TEMP_PREFIX}{secrets.token_hex(6)}"
        with self.fs.parent(backup.path, create=True) as dir_fd:
            assert dir_fd is not None
            self.fs._write_temp(dir_fd, temp, backup.data, backup.mode)
            self.fs._rename(dir_fd, temp, dir_fd, _leaf(backup.path))


def _leaf(path: str) -> str:
    return path.rsplit("/", 1)[-1]
