"""``ctx.services.notebooks``: the Jupyter server's notebooks and kernels, as Kaizen may
touch them on a member's behalf.

* ``attach`` reads a notebook through the server's ContentsManager (so the server's root and
  its checkpoints' view of the file apply), checks that it is an nbformat 4 notebook, and
  stores the exact bytes as the next version of the member's artifact for that path in this
  conversation (the same bytes reuse the same version). The message that names it pins that
  version (store/attachments.py); the model reads only the pinned version.
* ``current`` reads the file again, for the staleness check of a proposal.
* ``inspect_kernel`` finds the notebook's kernel through the session and kernel managers and
  runs the fixed probe (``probe.py``), only when the member allowed it in this conversation
  and the kernel is alive and idle.

The member-safe refusals are ``NotebookRefused`` with a stable code; the tools and the REST
handlers turn them into their own error shapes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from jupyter_core.utils import ensure_async

from kaizen_server_extension.jupyter_files import JupyterFiles
from kaizen_server_extension.notebooks.document import (
    NOTEBOOK_MEDIA_TYPE,
    NotebookDocument,
    NotebookFormatError,
)
from kaizen_server_extension.notebooks.probe import ProbeFailed, ProbeLimits, run_probe
from kaizen_server_extension.notebooks.store import NotebookStore
from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.store.artifacts.repository import MAX_FILE_BYTES
from kaizen_server_extension.store.jupyter_files import JupyterFileCopies
from kaizen_server_extension.store.store import Store

log = logging.getLogger("kaizen.notebooks")

#: The name the tools reach this service by (``ctx.services``).
NOTEBOOKS_SERVICE = "notebooks"
#: How long the whole probe exchange may take, the kernel's queue included.
PROBE_TIMEOUT_S = 10.0


class NotebookRefused(Exception):
    """A member-safe refusal: nothing was read, run or written."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class AttachedNotebook:
    artifact_id: str
    version: int
    path: str
    cells: int
    digest: str
    reused: bool

    def public(self) -> dict[str, Any]:
        return {"artifact_id": self.artifact_id, "version": self.version, "path": self.path,
                "cells": self.cells, "digest": self.digest, "reused": self.reused}


class NotebookService:
    def __init__(self, store: Store, *, contents_manager: Any, session_manager: Any,
                 kernel_manager: Any, probe_limits: ProbeLimits | None = None,
                 max_bytes: int = MAX_FILE_BYTES) -> None:
        self.store = store
        self._max_bytes = max_bytes
        self.records = NotebookStore(store)
        self._contents = contents_manager
        self._sessions = session_manager
        self._kernels = kernel_manager
        self._limits = probe_limits or ProbeLimits()
        # One probe per kernel at a time: a second waits rather than queueing in the kernel.
        self._probing: dict[str, asyncio.Lock] = {}

    # --- reading the file ---------------------------------------------------------------

    async def read(self, path: str) -> bytes:
        """The notebook's bytes as the ContentsManager has them now, read under the same
        rules as any Jupyter file a member attaches (jupyter_files.py: no path outside the
        root, no hidden file, no link out of the root, the size bound)."""
        if not path.endswith(".ipynb"):
            raise NotebookRefused("Only notebooks (.ipynb files) can be attached here.",
                                  "not_a_notebook")
        try:
            file = await JupyterFiles(self._contents, max_bytes=self._max_bytes).read(path)
        except MemberError as refused:
            if refused.status == 413:
                raise NotebookRefused(refused.message, "notebook_too_large") from None
            raise NotebookRefused("No such notebook.", "notebook_not_found") from None
        return file.content

    async def current(self, path: str) -> NotebookDocument:
        raw = await self.read(path)
        try:
            return NotebookDocument.parse(raw)
        except NotebookFormatError as exc:
            raise NotebookRefused(str(exc), "not_a_notebook") from None

    async def attach(self, member: str, conversation_id: str, path: str) -> AttachedNotebook:
        """Store the notebook's current bytes as the member's artifact version for ``path``
        in this conversation (reused when unchanged), and journal that it was read."""
        raw = await self.read(path)
        try:
            doc = NotebookDocument.parse(raw)
        except NotebookFormatError as exc:
            raise NotebookRefused(str(exc), "not_a_notebook") from None
        # The member's one copy of this Jupyter path, as "Attach to Kaizen" keeps it: a
        # notebook attached twice, or attached both ways, is versions of one artifact. Its
        # title is the whole path: the notebook tools find the notebook's kernel by it.
        record, reused = await JupyterFileCopies(self.store).keep(
            member, path, path, raw, NOTEBOOK_MEDIA_TYPE)
        attached = AttachedNotebook(record.artifact_id, record.version, path, len(doc.cells),
                                    record.digest, reused)
        async with self.store.transaction() as tx:
            await NotebookStore.journal_attached(tx, member, conversation_id, {
                "path": path, "artifact_id": record.artifact_id, "version": record.version,
                "cells": len(doc.cells), "digest": record.digest})
        return attached

    # --- the kernel ---------------------------------------------------------------------

    async def kernel_of(self, path: str) -> Any:
        """The kernel manager of the notebook's session, or a refusal."""
        sessions = await ensure_async(self._sessions.list_sessions())
        kernel_id = next((s.get("kernel", {}).get("id") for s in sessions
                          if s.get("path") == path and s.get("kernel")), None)
        if not kernel_id or kernel_id not in self._kernels:
            raise NotebookRefused(
                "The notebook has no running kernel. Open it in JupyterLab and start its "
                "kernel, then ask again.", "kernel_not_running")
        return self._kernels.get_kernel(kernel_id)

    async def inspect_kernel(self, member: str, conversation_id: str, path: str,
                             names: tuple[str, ...] = ()) -> dict[str, Any]:
        if await self.records.kernel_access(member, conversation_id) is None:
            raise NotebookRefused(
                "The member has not allowed Kaizen to inspect notebook kernels in this "
                "conversation. They can allow it in the Kaizen panel (Kernel access), then "
                "ask again.", "kernel_access_not_allowed")
        kernel = await self.kernel_of(path)
        language = _kernel_language(kernel)
        if language and language != "python":
            raise NotebookRefused(f"Only Python kernels can be inspected; this notebook's "
                                  f"kernel is {language[:40]}.", "kernel_not_python")
        state = getattr(kernel, "execution_state", None)
        if state == "dead" or not await ensure_async(kernel.is_alive()):
            raise NotebookRefused("The notebook's kernel is dead. Restart it in JupyterLab, "
                                  "then ask again.", "kernel_dead")
        if state in ("busy", "starting"):
            raise NotebookRefused("The notebook's kernel is busy running a cell; ask again "
                                  "when it is idle.", "kernel_busy")
        lock = self._probing.setdefault(kernel.kernel_id, asyncio.Lock())
        if lock.locked():
            raise NotebookRefused("The notebook's kernel is already being inspected.",
                                  "kernel_busy")
        async with lock:
            client = kernel.client()
            client.start_channels()
            try:
                result = await run_probe(client, dataclasses.replace(self._limits, names=names),
                                         timeout_s=PROBE_TIMEOUT_S)
            except ProbeFailed as failed:
                raise NotebookRefused(failed.reason, failed.code) from None
            finally:
                client.stop_channels()
        return {"kernel": {"name": getattr(kernel, "kernel_name", ""), "language": language},
                **result}


def _kernel_language(kernel: Any) -> str:
    try:
        spec = kernel.kernel_spec
    except Exception:  # a kernelspec that cannot be read: let the probe find out
        return ""
    return str(getattr(spec, "language", "") or "").lower()
