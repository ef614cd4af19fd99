"""The task scheduler: every replica looks for due tasks; the database lets one fire each.

It only ever *accepts inputs*: a due task becomes the owner's message in the task's room
(``store/tasks.py``) and the room lane runs it like any other (R-051). Nothing here holds
authority: the lane admits the run under the owner as they are now, and the pipeline re-reads
the task's authority before every action with an effect (R-052, R-056).

Each look also finishes firings whose writer crashed between committing the firing and
accepting its input; the input's idempotency key makes that at most one input (R-054).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from kaizen_server_extension.store.core import utcnow
from kaizen_server_extension.store.tasks import TaskStore

log = logging.getLogger("kaizen.tasks")


class TaskScheduler:
    def __init__(self, tasks: TaskStore, wake: Callable[[str], None], *,
                 interval_s: float) -> None:
        self._tasks = tasks
        self._wake = wake
        self._interval_s = interval_s
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="kaizen-task-scheduler")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop

    async def tick(self) -> int:
        """Fire what is due now and finish what a crash left half-fired; how many inputs
        this replica accepted."""
        accepted = 0
        for firing in await self._tasks.unfinished_firings():
            done = await self._tasks.complete(firing)
            if done.run_id is not None and done.conversation_id is not None:
                self._wake(done.conversation_id)
                accepted += 1
        for task_id, due_at in await self._tasks.due(utcnow()):
            fired = await self._tasks.fire_due(task_id, due_at)
            if fired is not None and fired.run_id is not None \
                    and fired.conversation_id is not None:
                self._wake(fired.conversation_id)
                accepted += 1
        return accepted

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the task scheduler's look failed; retrying")
            await asyncio.sleep(self._interval_s)
