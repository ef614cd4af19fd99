"""inspect_notebook_kernel's refusals for a kernel that is dead, with the server's own
mapping kernel manager and a real ipykernel whose process was killed."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

from kaizen_server_extension.notebooks.service import NotebookRefused, NotebookService
from kaizen_server_extension.store import Store


class OneSession:
    """The session manager's one answer the service asks for: which kernel a path has."""

    def __init__(self, path: str, kernel_id: str) -> None:
        self._sessions = [{"path": path, "kernel": {"id": kernel_id}}]

    async def list_sessions(self) -> list[dict[str, Any]]:
        return self._sessions


@pytest.mark.timeout(120)
async def test_a_dead_kernel_is_refused_before_anything_is_sent(store: Store) -> None:
    await store.members.ensure("alice")
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=())
    room = await store.conversations.create("alice", "general", "t", False)
    kernels = AsyncMappingKernelManager()
    kernel_id = await kernels.start_kernel(kernel_name="python3")
    try:
        kernel = kernels.get_kernel(kernel_id)
        kernel.autorestart = False
        service = NotebookService(store, contents_manager=None,
                                  session_manager=OneSession("a.ipynb", kernel_id),
                                  kernel_manager=kernels)
        await service.records.allow_kernel_access("alice", room.id)
        os.kill(kernel.provisioner.process.pid, signal.SIGKILL)
        kernel.provisioner.process.wait()
        with pytest.raises(NotebookRefused) as refused:
            await service.inspect_kernel("alice", room.id, "a.ipynb")
        assert refused.value.code == "kernel_dead"
        with pytest.raises(NotebookRefused) as missing:
            await service.inspect_kernel("alice", room.id, "other.ipynb")
        assert missing.value.code == "kernel_not_running"
    finally:
        await kernels.shutdown_all(now=True)
