"""Kernel-side helpers for kernels on a gateway. Its *source text* runs inside each kernel.

Like :mod:`kaizen_kernel.prelude_py` this module is stdlib-only and self-contained; it becomes
the private module ``_kaizen_gateway`` in the kernel. Results travel back as the JSON text of
a ``user_expressions`` value in the shell reply, never through the capped stdout.

* :func:`probe` — does this kernel see the server's filesystem? The server writes a random
  value to a transient file in the lease workspace; only a kernel on the same filesystem
  (same host or a shared mount at the same path) reads it back.
* :func:`private_workdir` — otherwise the kernel works in a private directory on its own host,
  removed when the kernel process exits.
* :func:`read_chunk` — one bounded, base64 chunk of a declared ``artifact_targets`` file,
  opened without following symlinks at any component (the same rule as the server's capture).

Before each call in transfer mode the server pushes files *to* the kernel in bounded base64
chunks (:func:`put_chunk`, held in memory here until used, so nothing half-sent is ever
visible on disk):

* :func:`workspace_write` / :func:`workspace_delete` — the lease workspace's new, changed and
  removed files, mirrored into the private working directory. Every component is opened with
  ``O_NOFOLLOW`` from a directory descriptor, names are relative and free of ``.``/``..``,
  and a file lands by an atomic rename inside its own directory: nothing is written outside
  the working directory, whatever the program left there. A symlink or file the program put
  where the workspace has a directory is replaced (unlinking a link never follows it); a
  directory where the workspace has a file is reported ``blocked``.
* :func:`resources_check` / :func:`resources_commit` / :func:`resources_clear` — the call's
  shared resources in a private directory of this kernel (outside the working directory).
  ``commit`` recomputes the sha256 and size of every file against the admitted values
  *before* the server exposes the manifest; one mismatch empties the directory, removes the
  two variables and answers ``mismatch``. Files are ``0444`` in a ``0555`` directory.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

_state: dict[str, str] = {}
# Uploads in progress (tag -> bytes so far); bounded by the server's per-file transfer cap.
_uploads: dict[str, bytearray] = {}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
_RESOURCE_ENV = ("KAIZEN_SHARED_RESOURCES_DIR", "KAIZEN_SHARED_RESOURCES_MANIFEST")


def probe(path: str, expected: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return json.dumps(False)
    try:
        data = os.read(fd, 256)
    finally:
        os.close(fd)
    return json.dumps(data.decode("ascii", "replace") == expected)


def private_workdir() -> str:
    """This kernel process's private working directory (created once, 0700)."""
    existing = _state.get("workdir")
    if existing and os.path.isdir(existing):
        return json.dumps(existing)
    path = tempfile.mkdtemp(prefix="kaizen-ws-")
    atexit.register(shutil.rmtree, path, True)
    _state["workdir"] = path
    return json.dumps(path)


def _open_nofollow(root: str, name: str) -> int:
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open(root, flags_dir)
    try:
        parts = name.split("/")
        for part in parts[:-1]:
            next_fd = os.open(part, flags_dir, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def read_chunk(root: str, name: str, offset: int, size: int, max_bytes: int) -> str:
    """``{"status": "ok", "total": n, "b64": ...}`` or a refusal status, as JSON text."""
    try:
        fd = _open_nofollow(root, name)
    except FileNotFoundError:
        return json.dumps({"status": "missing"})
    except NotADirectoryError:
        return json.dumps({"status": "missing"})
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            return json.dumps({"status": "symlink"})
        return json.dumps({"status": "unreadable"})
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return json.dumps({"status": "not_a_file"})
        if info.st_size > max_bytes:
            return json.dumps({"status": "too_large", "total": info.st_size})
        os.lseek(fd, offset, os.SEEK_SET)
        data = b""
        while len(data) < size:
            piece = os.read(fd, size - len(data))
            if not piece:
                break
            data += piece
    finally:
        os.close(fd)
    return json.dumps({"status": "ok", "total": info.st_size,
                       "b64": base64.b64encode(data).decode("ascii")})


def put_chunk(tag: str, offset: int, b64: str) -> str:
    """Append one chunk of an upload; ``offset`` must be where the last one ended."""
    if offset == 0:
        _uploads[tag] = bytearray()
    buffer = _uploads.get(tag)
    if buffer is None or len(buffer) != offset:
        _uploads.pop(tag, None)
        return json.dumps({"status": "out_of_order"})
    buffer += base64.b64decode(b64, validate=True)
    return json.dumps({"status": "ok", "size": len(buffer)})


def _take(entry: dict[str, Any]) -> bytes | None:
    """An entry's bytes (inline ``b64`` or an upload's ``tag``), or None when they are not
    exactly the announced size and sha256."""
    if "b64" in entry:
        data = base64.b64decode(entry["b64"], validate=True)
    else:
        data = bytes(_uploads.pop(str(entry.get("tag")), b""))
    if len(data) != int(entry["size"]) or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        return None
    return data


def _parts(name: str) -> list[str] | None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(
            p in ("", ".", "..") or "\x00" in p for p in parts):
        return None
    return parts


def _in_workdir(root: str) -> bool:
    # Only the directory this module created: the server cannot be made to write elsewhere.
    return bool(root) and root == _state.get("workdir")


def _parent_fd(root: str, parts: list[str], create: bool) -> int | None:
    """A descriptor of the name's directory under ``root``, following no symlink.

    ``create``: make missing directories, and replace a symlink or file standing where the
    workspace has a directory (unlinking a link never follows it). Otherwise None when the
    directory is not there.
    """
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if not create:
                    os.close(fd)
                    return None
                os.unlink(part, dir_fd=fd)
                os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_at(dir_fd: int, leaf: str, data: bytes, mode: int) -> None:
    """Write ``leaf`` atomically: a fresh temporary file in the same directory, renamed."""
    temp = f".kaizen-upload-{secrets.token_hex(6)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(temp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def workspace_write(root: str, entries: list[dict[str, Any]]) -> str:
    """Write workspace files (``name``, ``size``, ``sha256``, ``executable`` and ``b64`` or
    an upload ``tag``) under ``root``; per name ``ok`` | ``mismatch`` | ``blocked`` |
    ``refused``."""
    results: dict[str, str] = {}
    for entry in entries:
        name = str(entry.get("name", ""))
        data = _take(entry)
        parts = _parts(name)
        if not _in_workdir(root) or parts is None:
            results[name] = "refused"
            continue
        if data is None:
            results[name] = "mismatch"
            continue
        try:
            dir_fd = _parent_fd(root, parts, create=True)
            assert dir_fd is not None
        except OSError:
            results[name] = "blocked"
            continue
        try:
            _write_at(dir_fd, parts[-1], data, 0o700 if entry.get("executable") else 0o600)
            results[name] = "ok"
        except OSError:
            results[name] = "blocked"  # a directory (or something unwritable) is there
        finally:
            os.close(dir_fd)
    return json.dumps(results)


def workspace_delete(root: str, names: list[str], directories: list[str]) -> str:
    """Remove files the workspace no longer has, then the listed directories if empty
    (deepest first). A directory where a file was is left alone; nothing is followed."""
    if not _in_workdir(root):
        return json.dumps({"status": "refused"})
    for name, is_dir in [(n, False) for n in names] + [(d, True) for d in directories]:
        parts = _parts(name)
        if parts is None:
            continue
        try:
            dir_fd = _parent_fd(root, parts, create=False)
        except OSError:
            continue
        if dir_fd is None:
            continue
        try:
            with contextlib.suppress(OSError):
                if is_dir:
                    os.rmdir(parts[-1], dir_fd=dir_fd)  # only if empty; a link is ENOTDIR
                elif not stat.S_ISDIR(os.lstat(parts[-1], dir_fd=dir_fd).st_mode):
                    os.unlink(parts[-1], dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    return json.dumps({"status": "ok"})


# --- shared resources ---------------------------------------------------------------------


def _resources_fd() -> int:
    """The (writable for now) descriptor of this kernel's resources directory.

    Created once, private; if the program replaced it with something else a new one is made.
    """
    path = _state.get("resources")
    if path:
        try:
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                os.chmod(path, 0o700)
                return os.open(path, _DIR_FLAGS)
        except OSError:
            pass
    path = tempfile.mkdtemp(prefix="kaizen-res-")
    atexit.register(_remove_sealed, path)
    _state["resources"] = path
    return os.open(path, _DIR_FLAGS)


def _remove_sealed(path: str) -> None:
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    shutil.rmtree(path, True)


def _seal(fd: int) -> None:
    os.fchmod(fd, 0o555)


def _remove_entry(fd: int, name: str) -> None:
    """Remove one entry of ``fd``'s directory; a directory with everything in it."""
    with contextlib.suppress(OSError):
        if not stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
            os.unlink(name, dir_fd=fd)
            return
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            os.fchmod(sub, 0o700)
            _empty(sub)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=fd)


def _empty(fd: int) -> None:
    for name in os.listdir(fd):
        _remove_entry(fd, name)


def _digest_at(fd: int, name: str, *, seal: bool = False) -> tuple[int, str] | None:
    """(size, sha256) of a regular file in ``fd``'s directory, not following a link;
    ``seal`` makes it ``0444`` through the same descriptor."""
    try:
        file_fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC,
                          dir_fd=fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            return None
        digest = hashlib.sha256()
        size = 0
        while True:
            piece = os.read(file_fd, 1024 * 1024)
            if not piece:
                break
            size += len(piece)
            digest.update(piece)
        if seal:
            os.fchmod(file_fd, 0o444)
        return size, digest.hexdigest()
    finally:
        os.close(file_fd)


def _flat(filename: str) -> bool:
    return bool(filename) and "/" not in filename and "\x00" not in filename \
        and filename not in (".", "..")


def resources_check(entries: list[dict[str, Any]]) -> str:
    """The file names whose copy here is not (a regular file with) the admitted bytes."""
    fd = _resources_fd()
    try:
        needed = [e["filename"] for e in entries
                  if not _flat(e["filename"])
                  or _digest_at(fd, e["filename"]) != (int(e["size"]), e["sha256"])]
    finally:
        _seal(fd)
        os.close(fd)
    return json.dumps(needed)


def resources_commit(entries: list[dict[str, Any]], uploads: dict[str, str]) -> str:
    """Install the uploaded files, drop anything else, verify *every* file against its
    admitted sha256 and size, seal. ``{"status": "ok", "dir": path}`` or, with nothing
    exposed, ``{"status": "mismatch", "filename": ...}``."""
    fd = _resources_fd()
    try:
        wanted = {e["filename"]: e for e in entries}
        bad = next((name for name in wanted if not _flat(name)), None)
        staged: dict[str, bytes] = {}
        for name, tag in uploads.items():
            if bad is not None:
                break
            data = _take({**wanted.get(name, {"size": -1, "sha256": ""}), "tag": tag})
            if data is None:
                bad = name
            else:
                staged[name] = data
        if bad is None:
            for name in os.listdir(fd):
                if name not in wanted or name in staged:
                    _remove_entry(fd, name)
            for name, data in staged.items():
                _write_at(fd, name, data, 0o444)
            bad = next((name for name, entry in wanted.items()
                        if _digest_at(fd, name, seal=True)
                        != (int(entry["size"]), entry["sha256"])), None)
        if bad is not None:
            # Fail closed: nothing of this list stays exposed, nor the previous call's.
            _empty(fd)
            for variable in _RESOURCE_ENV:
                os.environ.pop(variable, None)
            return json.dumps({"status": "mismatch", "filename": bad})
        return json.dumps({"status": "ok", "dir": _state["resources"]})
    finally:
        for tag in uploads.values():
            _uploads.pop(tag, None)
        _seal(fd)
        os.close(fd)


def resources_clear() -> str:
    """This call has no shared files: the directory is emptied (and stays sealed)."""
    fd = _resources_fd()
    try:
        _empty(fd)
    finally:
        _seal(fd)
        os.close(fd)
    return json.dumps({"status": "ok"})


def install_source() -> str:
    """Code that creates ``_kaizen_gateway`` from this file's text."""
    source = Path(__file__).read_text(encoding="utf-8")
    return (
        "def __kaizen_gateway_boot(src):\n"
        "    import sys, types\n"
        "    mod = types.ModuleType('_kaizen_gateway')\n"
        "    sys.modules['_kaizen_gateway'] = mod\n"
        "    exec(compile(src, '<kaizen-gateway>', 'exec'), mod.__dict__)\n"
        f"__kaizen_gateway_boot({source!r})\n"
        "del __kaizen_gateway_boot\n"
    )


def call_expression(function: str, *args: object) -> str:
    """A user expression calling ``_kaizen_gateway.<function>(*args)`` (JSON-quoted args)."""
    encoded = json.dumps(list(args))
    return f"__import__('_kaizen_gateway').{function}(*__import__('json').loads({encoded!r}))"
