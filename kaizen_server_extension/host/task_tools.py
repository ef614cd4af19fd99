"""``ctx.services.tasks``: the member's tasks as the inspect_tasks / manage_tasks tools reach
them, always as the run's member and in the run's room.

The tools pass no identity: the member is the run's bundle member, and a task made by a tool
goes to the conversation the run is in (R-188). Firing wakes the room's lane, exactly as the
REST "run now" does (R-051).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kaizen_server_extension.store.tasks import FiringRecord, TaskRecord, TaskStore


class TaskTools:
    def __init__(self, tasks: TaskStore, wake: Callable[[str], None]) -> None:
        self._tasks = tasks
        self._wake = wake

    async def list_for(self, member: str) -> list[TaskRecord]:
        return await self._tasks.list_for(member)

    async def get_for(self, member: str, task_id: str) -> tuple[TaskRecord, list[FiringRecord]]:
        task = await self._tasks.get_for(member, task_id)
        return task, await self._tasks.firings_of(member, task_id, limit=5)

    async def create(self, member: str, conversation_id: str, *, name: str, prompt: str,
                     interval_seconds: int | None) -> TaskRecord:
        return await self._tasks.create(member, conversation_id=conversation_id, name=name,
                                        prompt=prompt, interval_seconds=interval_seconds)

    async def update(self, member: str, task_id: str, **changes: Any) -> TaskRecord:
        return await self._tasks.update(member, task_id, **changes)

    async def delete(self, member: str, task_id: str) -> None:
        await self._tasks.delete(member, task_id)

    async def fire(self, member: str, task_id: str, *, kind: str) -> FiringRecord:
        firing = await self._tasks.fire_now(member, task_id, kind=kind)
        if firing.run_id is not None and firing.conversation_id is not None:
            self._wake(firing.conversation_id)
        return firing
