"""REST for the caller's durable tasks (docs/tasks.md): create, edit, pause, delete, inspect,
run now and safe test.

Only ever the caller's own: another member's task is 404, indistinguishable from a missing
one (R-059). "Run now" and "safe test" accept the owner's input into the task's room and
answer 202 with the firing; the run goes through the room's queue like a message (R-051).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)
from tornado import web

from kaizen_server_extension.api.base import KaizenHandler, whole_number
from kaizen_server_extension.api.openapi_parts import answer, body, error_answers, path_param, ref
from kaizen_server_extension.api.params import TASK_ID
from kaizen_server_extension.context import KaizenContext
from kaizen_server_extension.protocol.tasks import MIN_TASK_INTERVAL_S
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.tasks import (
    MAX_INTERVAL_S,
    MAX_NAME_CHARS,
    MAX_PROMPT_CHARS,
    TaskStore,
)

#: Not blank (store/tasks.py: check_text), as the document says: some character that is not
#: whitespace to Python's str.strip().
_NOT_BLANK = {"pattern": r"[^\s\x1c-\x1f\x85]"}
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS),
                 Field(json_schema_extra=_NOT_BLANK)]
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROMPT_CHARS),
                   Field(json_schema_extra=_NOT_BLANK)]
Interval = Annotated[int, Field(ge=MIN_TASK_INTERVAL_S, le=MAX_INTERVAL_S,
                                description="Seconds between due times (60 s to a year)"),
                     BeforeValidator(whole_number)]


class CreateTask(BaseModel):
    # The document says what the store holds: a first due time goes with a cadence.
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "if": {"required": ["first_run_at"], "properties": {"first_run_at": {"type": "string"}}},
        "then": {"required": ["interval_seconds"],
                 "properties": {"interval_seconds": {"type": "integer"}}}})

    name: Name
    prompt: Prompt
    conversation_id: Annotated[str, StringConstraints(min_length=1, max_length=64)] = Field(
        description="The room the task's runs go to: one the caller takes part in")
    interval_seconds: Interval | None = None
    # A date-time is a JSON string: parsed from one (the body's other fields are strict).
    first_run_at: AwareDatetime | None = Field(
        None, strict=False,
        description="First due time (with a timezone); default: one interval from now")


class UpdateTask(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name | None = None
    prompt: Prompt | None = None
    interval_seconds: Interval | None = None
    #: True removes the cadence (the task then fires only when run by hand).
    clear_interval: bool = False
    status: Literal["active", "paused"] | None = None
    version: Annotated[int, Field(ge=1, le=2**31 - 1),
                       BeforeValidator(whole_number)] | None = Field(
        None, description="The version this edit is based on; a different current one is 409")


class RunTask(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    #: ``run``: a normal run (task_run posture); ``test``: a safe test (task_test), in which
    #: no action that changes anything outside the sandbox is performed (R-055).
    mode: Literal["run", "test"] = "run"
    idempotency_key: Annotated[str, StringConstraints(
        min_length=1, max_length=160, pattern=r"^[A-Za-z0-9._:-]+$")] | None = None


def checked_tasks(kaizen: KaizenContext) -> TaskStore:
    """The task store whose saves check a prompt's step attachments (R-207)."""
    return TaskStore(kaizen.store, check_prompt=kaizen.tools.check_task_prompt)


class TasksHandler(KaizenHandler):
    @web.authenticated
    async def get(self) -> None:
        tasks = await TaskStore(self.kaizen.store).list_for(self.member)
        self.write_json([t.public() for t in tasks])

    @web.authenticated
    async def post(self) -> None:
        body = self.parse_body(CreateTask)
        task = await checked_tasks(self.kaizen).create(
            self.member, conversation_id=body.conversation_id, name=body.name,
            prompt=body.prompt, interval_seconds=body.interval_seconds,
            first_run_at=body.first_run_at)
        self.write_json(task.public(), status=201)


class TaskHandler(KaizenHandler):
    @web.authenticated
    async def get(self, task_id: str) -> None:
        tasks = TaskStore(self.kaizen.store)
        task = await tasks.get_for(self.member, task_id)
        firings = await tasks.firings_of(self.member, task_id)
        self.write_json({**task.public(), "firings": [f.public() for f in firings]})

    @web.authenticated
    async def patch(self, task_id: str) -> None:
        body = self.parse_body(UpdateTask)
        task = await checked_tasks(self.kaizen).update(
            self.member, task_id, expected_version=body.version, name=body.name,
            prompt=body.prompt, interval_seconds=body.interval_seconds,
            clear_interval=body.clear_interval, status=body.status)
        self.write_json(task.public())

    @web.authenticated
    async def delete(self, task_id: str) -> None:
        await TaskStore(self.kaizen.store).delete(self.member, task_id)
        self.set_status(204)
        self.finish()


class TaskRunHandler(KaizenHandler):
    @web.authenticated
    async def post(self, task_id: str) -> None:
        body = self.parse_body(RunTask) if self.request.body else RunTask()
        firing = await TaskStore(self.kaizen.store).fire_now(
            self.member, task_id, kind="safe_test" if body.mode == "test" else "run_now",
            key=body.idempotency_key)
        if firing.run_id is not None and firing.conversation_id is not None:
            self.kaizen.lanes.wake(firing.conversation_id)
        self.write_json(firing.public(), status=202)


def task_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    return [(rf"{prefix}/tasks", TasksHandler),
            (rf"{prefix}/tasks/({TASK_ID})", TaskHandler),
            (rf"{prefix}/tasks/({TASK_ID})/run", TaskRunHandler)]


#: What each error status means on these routes, in the OpenAPI document.
_ERROR_TEXT = {400: "Malformed JSON", 401: "Not authenticated",
               404: "No such task of yours (or no such conversation of yours)",
               409: "The task changed meanwhile (version), or the key names another firing",
               422: "The body breaks the schema (names the field)"}


def _errors(*codes: int) -> dict[str, Any]:
    return error_answers(_ERROR_TEXT, *codes)


def tasks_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) for ``api/openapi.py``."""
    # Imported here: openapi.py imports this module's routes' documents when it builds.
    from kaizen_server_extension.api.openapi import _model_schemas

    task = ref("Task")
    firing = ref("TaskFiring")
    task_id = path_param("task_id", {"type": "string", "pattern": f"^{TASK_ID}$"})

    paths = {
        "/kaizen/api/tasks": {
            "get": {"summary": "The caller's tasks", "operationId": "listTasks",
                    "responses": {**answer("The caller's tasks, oldest first",
                                           {"type": "array", "items": task}), **_errors()}},
            "post": {"summary": "Create a task: a saved prompt fired into one of the caller's "
                                "rooms, by hand or on a cadence",
                     "operationId": "createTask", "requestBody": body("CreateTask"),
                     "responses": {**answer("Created", task, 201), **_errors(400, 404, 422)}},
        },
        "/kaizen/api/tasks/{task_id}": {
            "get": {"summary": "One task of the caller's, with its latest firings",
                    "operationId": "getTask", "parameters": [task_id],
                    "responses": {**answer("The task", {"allOf": [task, {
                        "type": "object", "required": ["firings"], "properties": {
                            "firings": {"type": "array", "items": firing}}}]}),
                        **_errors(404)}},
            "patch": {"summary": "Edit, pause or resume. Any edit withdraws the authority of "
                                 "the task's runs still in flight",
                      "operationId": "updateTask", "parameters": [task_id],
                      "requestBody": body("UpdateTask"),
                      "responses": {**answer("The task as stored", task),
                                    **_errors(400, 404, 409, 422)}},
            "delete": {"summary": "Delete the task; its runs in flight lose its authority",
                       "operationId": "deleteTask", "parameters": [task_id],
                       "responses": {"204": {"description": "Deleted"}, **_errors(404)}},
        },
        "/kaizen/api/tasks/{task_id}/run": {"post": {
            "summary": "Run now (mode 'run') or as a safe test (mode 'test'): the owner's "
                       "input in the task's room, queued like a message",
            "operationId": "runTask", "parameters": [task_id],
            "requestBody": {**body("RunTask"), "required": False},
            "responses": {**answer("Fired: the firing and its queued run", firing, 202),
                          **_errors(400, 404, 422)}}},
    }
    string = {"type": "string"}
    nullable_time = {"type": ["string", "null"], "format": "date-time"}
    components = {
        "Task": {"type": "object", "required": [
            "id", "conversation_id", "name", "prompt", "interval_seconds", "next_due_at",
            "status", "version", "missed_firings", "created_at", "updated_at"],
            "properties": {
                "id": string, "conversation_id": string, "name": string, "prompt": string,
                "interval_seconds": {"type": ["integer", "null"]},
                "next_due_at": nullable_time, "status": {"enum": list(m.TASK_STATUSES)},
                "version": {"type": "integer"},
                "missed_firings": {"type": "integer", "description":
                                   "Due times that passed while no server ran, each "
                                   "coalesced into the next firing"},
                "created_at": {"type": "string", "format": "date-time"},
                "updated_at": {"type": "string", "format": "date-time"}}},
        "TaskFiring": {"type": "object", "required": [
            "id", "task_id", "kind", "posture", "due_at", "run_id", "run_status", "error",
            "conversation_id", "created_at"],
            "properties": {
                "id": string, "task_id": {"type": ["string", "null"]},
                "kind": {"enum": list(m.TASK_FIRING_KINDS)},
                "posture": {"enum": list(m.TASK_POSTURES)},
                "due_at": {"type": "string", "format": "date-time"},
                "run_id": {"type": ["string", "null"]},
                "run_status": {"type": ["string", "null"]},
                "error": {"type": ["string", "null"]},
                "conversation_id": {"type": ["string", "null"]},
                "created_at": {"type": "string", "format": "date-time"}}},
        **_model_schemas(CreateTask, UpdateTask, RunTask),
    }
    return paths, components

