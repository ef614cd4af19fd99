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
"""

from __future__ import annotations

import atexit
import base64
import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

_state: dict[str, str] = {}


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
