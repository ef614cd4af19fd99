"""inspect_tasks / manage_tasks: the member's durable tasks, owner-bound (R-059).

Shared capabilities of the runtime (R-058): no agent package may define its own. inspect_tasks
is a read of the member's own tasks. manage_tasks is the one reviewed write boundary for task
and background lifecycle: create, update, pause, resume, delete, run_now, and

* ``run_in_background``: exactly one durable attempt of a prompt, queued in this room after
  the current turn (R-185);
* ``create_loop``: the same prompt on a cadence. Cadence words in a background request
  ("every …", "interval") select create_loop: a run_in_background asking for repetition is
  refused with that instruction rather than run once (R-185).

A task's prompt is its goal. ``update_goal`` replaces it, and like any edit bumps the task's
version, which withdraws the authority of every run the task started before (R-186).
``steer_goal`` and ``answer_goal_input`` take no words from the model: the server binds the
member's own accepted message of this turn, as guidance kept with the goal or as the answer
the task then runs with (R-186). Both need a member's message, so a task's own run cannot use
them.

No argument names a member or a room: authority is the initiating member's, and new tasks go
to this conversation (R-188). There is no sleep, wait, poll or process-control operation
(R-187). In a task's own run these calls need the task's live authority, and a safe test
refuses them (policy/task_posture.py).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field

from kaizen_server_extension.protocol.errors import MemberError
from kaizen_server_extension.protocol.tasks import (
    MAX_TASK_INTERVAL_S,
    MAX_TASK_NAME_CHARS,
    MAX_TASK_PROMPT_CHARS,
    MIN_TASK_INTERVAL_S,
)
from kaizen_server_extension.tools import (
    Capability,
    MemberSafeError,
    RoomClass,
    ToolContext,
    WriteCategory,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

TaskId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
Name = Annotated[str, Field(min_length=1, max_length=MAX_TASK_NAME_CHARS)]
Prompt = Annotated[str, Field(min_length=1, max_length=MAX_TASK_PROMPT_CHARS)]
Interval = Annotated[int, Field(ge=MIN_TASK_INTERVAL_S, le=MAX_TASK_INTERVAL_S)]
#: Words that ask for repetition: they select create_loop (R-185).
CADENCE_WORDS = re.compile(r"\b(every|interval|hourly|daily|weekly|each (day|morning|week|"
                           r"hour|night))\b", re.IGNORECASE)


def _service(ctx: ToolContext) -> Any:
    service = ctx.services.tasks
    if service is None:
        raise MemberSafeError("Tasks are not available on this server.",
                              code="tasks_unavailable")
    return service


def _public(task: Any) -> dict[str, Any]:
    view: dict[str, Any] = task.public()
    view.pop("created_at", None)
    view.pop("updated_at", None)
    return view


@tool(name="inspect_tasks", capability=Capability.READ,
      room_class=RoomClass.ACTOR_BOUND_READ, surface="tasks", timeout_s=15)
async def inspect_tasks(ctx: ToolContext, task_id: TaskId | None = None) -> dict[str, Any]:
    """List your durable tasks (saved prompts that run now, on a cadence or in the
    background), or show one with its latest runs."""
    service = _service(ctx)
    try:
        if task_id is None:
            return {"tasks": [_public(t) for t in await service.list_for(ctx.member)]}
        task, firings = await service.get_for(ctx.member, task_id)
    except MemberError as exc:
        raise MemberSafeError(exc.message, code=exc.code) from None
    return {"task": _public(task), "latest_runs": [
        {"kind": f.kind, "posture": f.posture, "run_id": f.run_id, "status": f.run_status,
         "error": f.error, "at": f.created_at.isoformat()} for f in firings]}


@tool(name="manage_tasks", capability=Capability.WRITE,
      room_class=RoomClass.ACTOR_BOUND_WRITE, write_category=WriteCategory.MEMBER_STORE,
      surface="tasks", timeout_s=15)
async def manage_tasks(
    ctx: ToolContext,
    action: Literal["create", "update", "pause", "resume", "delete", "run_now",
                    "run_in_background", "create_loop", "update_goal", "steer_goal",
                    "answer_goal_input"],
    task_id: TaskId | None = None,
    name: Name | None = None,
    prompt: Prompt | None = None,
    interval_seconds: Interval | None = None,
) -> dict[str, Any]:
    """Manage your durable tasks in this conversation. create (name, prompt, optional
    interval_seconds), update / pause / resume / delete / run_now (task_id), run_in_background
    (prompt: one attempt after this turn), create_loop (prompt and interval_seconds: repeated
    on that cadence), update_goal (task_id, prompt: the new goal), steer_goal /
    answer_goal_input (task_id only: the member's message of this turn becomes guidance for
    the goal, or the answer the task runs with now)."""
    service = _service(ctx)
    room = ctx.bundle.conversation_id
    try:
        if action == "run_in_background" and prompt is not None \
                and CADENCE_WORDS.search(prompt):
            if interval_seconds is None:
                raise MemberSafeError(
                    "That asks for repeated work, which run_in_background does not do (it "
                    "runs once). Use create_loop with interval_seconds.",
                    code="use_create_loop")
            action = "create_loop"  # cadence words select the loop
        if action in ("create", "run_in_background", "create_loop"):
            if prompt is None:
                raise MemberSafeError(f"{action} needs a prompt.", code="invalid_arguments")
            if action == "create_loop" and interval_seconds is None:
                raise MemberSafeError("create_loop needs interval_seconds.",
                                      code="invalid_arguments")
            interval = None if action == "run_in_background" else interval_seconds
            task = await service.create(ctx.member, room, name=name or prompt[:80],
                                        prompt=prompt, interval_seconds=interval)
            result: dict[str, Any] = {"action": action, "task": _public(task)}
            if action == "run_in_background":
                firing = await service.fire(ctx.member, task.id, kind="background")
                result["run_id"] = firing.run_id
                result["summary"] = ("Queued once in this conversation; it runs after this "
                                     "turn and its answer appears here.")
            return result
        if task_id is None:
            raise MemberSafeError(f"{action} needs a task_id (see inspect_tasks).",
                                  code="invalid_arguments")
        if action == "delete":
            await service.delete(ctx.member, task_id)
            return {"action": action, "task_id": task_id, "deleted": True}
        if action == "run_now":
            firing = await service.fire(ctx.member, task_id, kind="run_now")
            return {"action": action, "task_id": task_id, "run_id": firing.run_id}
        if action in ("steer_goal", "answer_goal_input"):
            if name is not None or prompt is not None or interval_seconds is not None:
                raise MemberSafeError(
                    f"{action} takes only task_id: the member's own message of this turn is "
                    "used, never words from the call.", code="invalid_arguments")
            if ctx.bundle.posture != "chat":
                raise MemberSafeError(f"{action} needs a member's message; a task's own run "
                                      "has none.", code="no_member_input")
            words = await service.member_words(ctx.member, ctx.bundle.run_id)
            if action == "steer_goal":
                task = await service.steer(ctx.member, task_id, words)
                return {"action": action, "task": _public(task)}
            task, firing = await service.answer(ctx.member, task_id, words)
            return {"action": action, "task": _public(task), "run_id": firing.run_id}
        if action == "update_goal" and prompt is None:
            raise MemberSafeError("update_goal needs the new goal as prompt.",
                                  code="invalid_arguments")
        changes: dict[str, Any] = {"name": name, "prompt": prompt,
                                   "interval_seconds": interval_seconds}
        if action == "pause":
            changes = {"status": "paused"}
        elif action == "resume":
            changes = {"status": "active"}
        task = await service.update(ctx.member, task_id, **changes)
        return {"action": action, "task": _public(task)}
    except MemberError as exc:
        raise MemberSafeError(exc.message, code=exc.code) from None


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(inspect_tasks)
    register(manage_tasks)
