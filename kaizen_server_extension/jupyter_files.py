"""The member's files in the Jupyter contents tree, read and written through the server's own
ContentsManager (never bytes a browser read and uploaded).

Path rules, checked before the ContentsManager is asked anything:

* an API path is relative to the server's root, ``/``-separated: an absolute path (``/etc``,
  ``~``, a drive letter), a ``.`` or ``..`` segment, an empty segment, a backslash or a
  control character is ``invalid_path``;
* a hidden file or folder is refused (``hidden_path``) unless the ContentsManager itself
  allows hidden files (``ContentsManager.allow_hidden``), with its own ``is_hidden`` rule;
* on a file-backed ContentsManager the path, resolved with every symlink followed, must stay
  inside the real root directory (``outside_root``). jupyter_server's own check compares
  unresolved paths, so a symlink under the root that points out of it would otherwise be read;
  the check runs again after the read, so a link swapped in meanwhile is caught too;
* a file larger than the bound (``KAIZEN_JUPYTER_FILE_MAX_BYTES``) is ``file_too_large``, by
  the size the ContentsManager reports before reading and by the bytes it returned.

Writing never replaces an existing file unless the caller says ``overwrite`` (``file_exists``),
and only into a folder that exists.
"""

from __future__ import annotations

import base64
import binascii
import logging
import mimetypes
import os
import posixpath
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from jupyter_server.services.contents.fileio import FileManagerMixin
from jupyter_server.utils import ensure_async
from tornado import web

from kaizen_server_extension.protocol.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    TooLarge,
)

log = logging.getLogger("kaizen.jupyter_files")

MAX_PATH_CHARS = 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_DRIVE = re.compile(r"^[A-Za-z]:")
T = TypeVar("T")


#: A file or folder name: at most 255 bytes (the file system's own bound; past it the OS
#: refuses the name with an error the ContentsManager does not turn into an answer).
MAX_NAME_BYTES = 255
# 63 characters of up to 4 UTF-8 bytes each stay within MAX_NAME_BYTES.
_SEGMENT = r"[^./:~\\\x00-\x1f\x7f][^/:\\\x00-\x1f\x7f]{0,62}"
#: The OpenAPI pattern of a path ``api_path`` takes: relative, no '.'/'..' or empty segment,
#: no backslash or control character. It documents no ':' and no leading '.' or '~' (a drive,
#: a hidden name, a home), which the server refuses or does not share, or simply has not.
PATH_PATTERN = rf"^{_SEGMENT}(?:/{_SEGMENT})*$"
_LAST = r"[^./:~\\\x00-\x1f\x7f][^/:\\\x00-\x1f\x7f]{0,56}\.ipynb"
NOTEBOOK_PATH_PATTERN = rf"^(?:{_SEGMENT}/)*{_LAST}$"


def _invalid(message: str) -> BadRequest:
    return BadRequest(message, code="invalid_path")


def api_path(raw: str) -> str:
    """``raw`` as a ContentsManager API path, or ``invalid_path``."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_PATH_CHARS:
        raise _invalid(f"A path is 1 to {MAX_PATH_CHARS} characters, relative to the "
                       "Jupyter server's root.")
    if raw.startswith(("/", "~")) or _DRIVE.match(raw):
        raise _invalid("Absolute paths are refused: give the path relative to the Jupyter "
                       "server's root (as the file browser shows it).")
    if _CONTROL.search(raw):
        raise _invalid("A path may not contain backslashes or control characters.")
    parts = raw.split("/")
    if any(part in (".", "..") for part in parts):
        raise _invalid("'.' and '..' are refused in a path: name the file from the Jupyter "
                       "server's root.")
    if any(not part for part in parts):
        raise _invalid("A path may not have empty segments (a doubled or trailing '/').")
    try:
        too_long = any(len(part.encode("utf-8")) > MAX_NAME_BYTES for part in parts)
    except UnicodeEncodeError:
        raise _invalid("A path must be valid Unicode text.") from None
    if too_long:
        raise _invalid(f"A file or folder name is at most {MAX_NAME_BYTES} bytes.")
    return "/".join(parts)


@dataclass(frozen=True, slots=True)
class JupyterFile:
    """One file's bytes as the ContentsManager returned them."""

    path: str
    name: str
    content: bytes
    media_type: str


@dataclass(frozen=True, slots=True)
class SavedFile:
    path: str
    name: str
    size: int
    overwritten: bool


class JupyterFiles:
    """Reads and writes of one ContentsManager under the rules of this module."""

    def __init__(self, contents_manager: Any, *, max_bytes: int,
                 bound: str = "KAIZEN_JUPYTER_FILE_MAX_BYTES") -> None:
        self._cm = contents_manager
        self.max_bytes = max_bytes
        #: What ``max_bytes`` is, named in a too-large refusal.
        self.bound = bound

    async def read(self, raw_path: str) -> JupyterFile:
        path = api_path(raw_path)
        await self._refuse_hidden(path)
        self._refuse_escape(path)
        model = await self._ask(self._cm.get, path, content=False)
        if model.get("type") == "directory":
            raise BadRequest("That is a folder, not a file.", code="not_a_file")
        size = model.get("size")
        if isinstance(size, int) and size > self.max_bytes:
            raise self._too_large(size)
        model = await self._ask(self._cm.get, path, content=True, type="file",
                                format="base64")
        try:
            # jupyter_server wraps its base64 in lines (encodebytes).
            encoded = "".join(str(model.get("content") or "").split())
            content = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            log.warning("the ContentsManager returned unreadable base64 for a file")
            raise Conflict("The Jupyter server returned that file in a form Kaizen cannot "
                           "read.", code="file_unreadable") from None
        if len(content) > self.max_bytes:
            raise self._too_large(len(content))
        self._refuse_escape(path)  # a symlink swapped in while it was read
        name = posixpath.basename(path)
        media_type = (model.get("mimetype") or mimetypes.guess_type(name)[0]
                      or "application/octet-stream")
        return JupyterFile(path, name, content, str(media_type))

    async def write(self, raw_path: str, content: bytes, *, overwrite: bool) -> SavedFile:
        path = api_path(raw_path)
        await self._refuse_hidden(path)
        folder = posixpath.dirname(path)
        if folder and not await self._ask(self._cm.dir_exists, folder):
            raise NotFound(f"There is no folder {folder!r} in the Jupyter server's root.",
                           code="folder_not_found")
        self._refuse_escape(path)
        if await self._ask(self._cm.dir_exists, path):
            raise Conflict("A folder of that name is already there.", code="not_a_file")
        exists = bool(await self._ask(self._cm.file_exists, path))
        if exists and not overwrite:
            raise Conflict(f"{path} already exists; choose another name, or overwrite it "
                           "explicitly.", code="file_exists")
        model = {"type": "file", "format": "base64",
                 "content": base64.b64encode(content).decode("ascii")}
        saved = await self._ask(self._cm.save, model, path)
        self._refuse_escape(path)
        return SavedFile(path=str(saved.get("path") or path),
                         name=str(saved.get("name") or posixpath.basename(path)),
                         size=len(content), overwritten=exists)

    # --- rules -----------------------------------------------------------------------------

    async def _refuse_hidden(self, path: str) -> None:
        if getattr(self._cm, "allow_hidden", False):
            return
        try:
            hidden = bool(await ensure_async(self._cm.is_hidden(path)))
        except (NotADirectoryError, FileNotFoundError):
            # A segment of the path is a file, not a folder: nothing can be there.
            raise NotFound("There is no such file or folder in the Jupyter server's root.",
                           code="file_not_found") from None
        except NotImplementedError:
            # A ContentsManager without the rule: a dot-name anywhere is hidden (Jupyter's).
            hidden = any(part.startswith(".") for part in path.split("/"))
        if hidden:
            raise Forbidden("Hidden files and folders are not shared with Kaizen (this Jupyter "
                            "server does not allow hidden files).", code="hidden_path")

    def _refuse_escape(self, path: str) -> None:
        """On a file-backed ContentsManager: the path with every symlink resolved stays under
        the real root (a missing tail resolves as far as it exists), and does not land on a
        hidden file either, unless hidden files are allowed."""
        if not isinstance(self._cm, FileManagerMixin):
            return
        root = os.path.realpath(str(getattr(self._cm, "root_dir", "")))
        resolved = os.path.realpath(os.path.join(root, *path.split("/")))
        if resolved != root and not resolved.startswith(root.rstrip(os.sep) + os.sep):
            raise Forbidden("That path leads outside the Jupyter server's root folder (through "
                            "a symbolic link), so it is refused.", code="outside_root")
        inside = os.path.relpath(resolved, root).split(os.sep)
        if not getattr(self._cm, "allow_hidden", False) and any(
                part.startswith(".") and part not in (".", "..") for part in inside):
            raise Forbidden("That path leads to a hidden file or folder (through a symbolic "
                            "link), which is not shared with Kaizen.", code="hidden_path")

    def _too_large(self, size: int) -> TooLarge:
        return TooLarge(f"The file is {_size(size)}; the limit is {_size(self.max_bytes)} "
                        f"({self.bound}).", code="file_too_large")

    @staticmethod
    async def _ask(call: Callable[..., T | Awaitable[T]], *args: Any, **kwargs: Any) -> Any:
        """One ContentsManager call; its HTTP errors become member-safe ones (its messages
        name server paths, so they are not relayed)."""
        try:
            return await ensure_async(call(*args, **kwargs))
        except web.HTTPError as exc:
            if exc.status_code == 404:
                raise NotFound("There is no such file in the Jupyter server's root.",
                               code="file_not_found") from None
            if exc.status_code == 403:
                raise Forbidden("The Jupyter server may not access that file (permission "
                                "denied).", code="contents_forbidden") from None
            if exc.status_code == 400:
                raise BadRequest("The Jupyter server refused that path.",
                                 code="invalid_path") from None
            raise


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
