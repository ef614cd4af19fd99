"""``ctx.services.tasks``: the member's tasks as the inspect_tasks / manage_tasks tools reach
them, always as the run's member and in the run's room.

The tools pass no identity: the member is the run's bundle member, and a task made by a tool
goes to the conversation the run is in (R-188). Firing wakes the room's lane, exactly as the
REST "run now" does (R-051).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kaizen_server_extension.protocol.errors import SchemaViolation
from kaizen_server_extension.protocol.tasks import MAX_TASK_PROMPT_CHARS
from kaizen_server_extension.store.tasks import CHAT_POSTURE, FiringRecord, TaskRecord, TaskStore

GUIDANCE = "\n\nThe owner's guidance: {words}"
ANSWER = "\n\nThe owner's answer: {words}"


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

    async def member_words(self, member: str, run_id: str) -> str:
        """The member's own accepted message that started ``run_id``, read on the server:
        what steer_goal and answer_goal_input bind (R-186)."""
        facts = await self._tasks.store.runs.admission_facts(run_id)
        if facts.run.member != member or facts.posture != CHAT_POSTURE:
            raise SchemaViolation("This turn has no message of yours to use.",
                                  code="no_member_input")
        return facts.text

    async def steer(self, member: str, task_id: str, words: str) -> TaskRecord:
        """Keep the member's words with the task's goal (an edit: the version moves on)."""
        return await self.steer_with(member, task_id, GUIDANCE, words)

    async def answer(self, member: str, task_id: str,
                     words: str) -> tuple[TaskRecord, FiringRecord]:
        """Run the task now with the member's words as its answer, kept with the goal."""
        task = await self.steer_with(member, task_id, ANSWER, words)
        return task, await self.fire(member, task_id, kind="run_now")

    async def steer_with(self, member: str, task_id: str, form: str,
                         words: str) -> TaskRecord:
        task = await self._tasks.get_for(member, task_id)
        # At the version read: an edit meanwhile is a conflict, never a lost update.
        return await self._tasks.update(member, task_id, expected_version=task.version,
                                        prompt=_extended(task.prompt, form, words))


def _extended(goal: str, form: str, words: str) -> str:
    extended = goal + form.format(words=words.strip())
    if len(extended) > MAX_TASK_PROMPT_CHARS:
        raise SchemaViolation(f"The task's goal would be longer than {MAX_TASK_PROMPT_CHARS} "
                              "characters; edit it (update_goal) first.", code="goal_too_long")
    return extended
