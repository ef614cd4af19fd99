"""Completion notifications: one contract for chat, prompt and task-run producers.

A producer hands :meth:`CompletionInbox.notify` a typed :class:`Destination` (exact resource
ids, never a navigation URL: R-030) and an :class:`Attendance`. The common gate drops an
attended chat or foreground prompt stream *before* anything is inserted (R-031); everything
else lands in the durable inbox. A producer that cannot tell whether the member is watching
says ``UNKNOWN``, and unknown is delivered: a duplicate reminder is cheaper than a lost
completion (R-032).

Attendance of a chat is "this member has an events websocket of this conversation open on
this server" (:class:`PresenceRegistry`). A socket held on another replica is not seen here,
so that case is delivered too — the same fail-toward-delivery direction.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from sqlalchemy import bindparam, select

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.notifications import (
    NotificationRecord,
    NotificationRepository,
)
from kaizen_server_extension.store.units import Unit, select_rows

log = logging.getLogger("kaizen.lanes")

#: An exact resource id: what the store issues (hex ids, agent-style slugs). No ``/``, ``:``,
#: ``.`` or ``%`` can pass, so neither can a URL, a path or an encoded one.
RESOURCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


class InvalidDestination(ValueError):
    """A producer offered something other than a typed destination of exact ids."""


class DestinationKind(StrEnum):
    CHAT = "chat"
    PROMPT = "prompt"
    TASK_RUN = "task_run"


class Attendance(StrEnum):
    ATTENDED = "attended"      # the member is watching the foreground stream
    UNATTENDED = "unattended"  # known not to be watching
    UNKNOWN = "unknown"        # presence lookup failed: deliver


#: What the gate may suppress when attended: chat and foreground prompt streams.
FOREGROUND = frozenset({DestinationKind.CHAT, DestinationKind.PROMPT})
assert {k.value for k in FOREGROUND} == set(m.FOREGROUND_NOTIFICATION_KINDS)
assert {k.value for k in DestinationKind} == set(m.NOTIFICATION_KINDS)


def _exact_id(field: str, value: object) -> str:
    if not isinstance(value, str) or not RESOURCE_ID.fullmatch(value):
        raise InvalidDestination(f"destination {field} must be an exact resource id")
    return value


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a notice leads: a kind plus the exact ids of that resource.

    * ``chat``: ``resource_id`` = conversation id, ``run_id`` = the run that settled;
    * ``prompt``: ``resource_id`` = saved prompt id, ``run_id`` optional;
    * ``task_run``: ``resource_id`` = task id, ``run_id`` = that task run.
    """

    kind: DestinationKind
    resource_id: str
    run_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, DestinationKind):
            raise InvalidDestination("destination kind must be chat, prompt or task_run")
        _exact_id("resource_id", self.resource_id)
        if self.run_id is not None:
            _exact_id("run_id", self.run_id)
        elif self.kind is not DestinationKind.PROMPT:
            raise InvalidDestination(f"a {self.kind.value} destination names its run")

    @classmethod
    def chat(cls, conversation_id: str, run_id: str) -> Destination:
        return cls(DestinationKind.CHAT, conversation_id, run_id)

    @classmethod
    def prompt(cls, prompt_id: str, run_id: str | None = None) -> Destination:
        return cls(DestinationKind.PROMPT, prompt_id, run_id)

    @classmethod
    def task_run(cls, task_id: str, run_id: str) -> Destination:
        return cls(DestinationKind.TASK_RUN, task_id, run_id)

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> Destination:
        """From untyped producer input: exactly ``kind``, ``resource_id`` and optionally
        ``run_id``. Any other key (``url``, ``href``, ``path``…) is refused, not ignored."""
        extra = set(data) - {"kind", "resource_id", "run_id"}
        if extra:
            raise InvalidDestination("a destination carries only kind and resource ids")
        try:
            kind = DestinationKind(str(data.get("kind")))
        except ValueError:
            raise InvalidDestination("destination kind must be chat, prompt or task_run") \
                from None
        run_id = data.get("run_id")
        return cls(kind, _exact_id("resource_id", data.get("resource_id")),
                   None if run_id is None else _exact_id("run_id", run_id))


class PresenceLookup(Protocol):
    def is_attending(self, member: str, conversation_id: str) -> bool: ...


class PresenceRegistry:
    """Which members observe which conversations through this server's event websockets."""

    def __init__(self) -> None:
        self._open: Counter[tuple[str, str]] = Counter()

    def attend(self, member: str, conversation_id: str) -> Callable[[], None]:
        """Record one open observer; call the returned function (once) when it closes."""
        key = (member, conversation_id)
        self._open[key] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]

        return release

    def is_attending(self, member: str, conversation_id: str) -> bool:
        return self._open.get((member, conversation_id), 0) > 0


class CompletionInbox:
    """The producer API and the common gate in front of the durable inbox."""

    def __init__(self, repository: NotificationRepository, presence: PresenceLookup) -> None:
        self.repository = repository
        self.presence = presence

    def attendance(self, member: str, conversation_id: str) -> Attendance:
        """Whether ``member`` watches the conversation; a failing lookup is UNKNOWN."""
        try:
            watching = self.presence.is_attending(member, conversation_id)
        except Exception:
            log.warning("presence lookup failed for a completion notice; delivering it",
                        exc_info=True)
            return Attendance.UNKNOWN
        return Attendance.ATTENDED if watching else Attendance.UNATTENDED

    async def notify(self, *, member: str, destination: Destination, attendance: Attendance,
                     status: str, title: str, dedupe_key: str) -> NotificationRecord | None:
        """Gate, then insert durably. None when suppressed or already delivered."""
        if not isinstance(destination, Destination):
            raise InvalidDestination("a producer must supply a typed Destination")
        attendance = Attendance(attendance)
        if attendance is Attendance.ATTENDED and destination.kind in FOREGROUND:
            return None  # the member saw it happen: no inbox row
        return await self.repository.insert(
            member=member, kind=destination.kind.value, resource_id=destination.resource_id,
            run_id=destination.run_id, attendance=attendance.value, status=status,
            title=title[:300], dedupe_key=dedupe_key,
        )

    async def run_settled(self, run_id: str) -> NotificationRecord | None:
        """The chat producer, and the task-run producer for a task's firing: tell the
        initiating member (the task's owner) a run of theirs settled.

        A member's own cancel needs no reminder; a run not yet terminal has nothing to say.
        Safe to call from every process that saw the settlement (one row per run).
        """
        settled = await self.repository.store.read(settled_run, run_id,
                                                   single_statement=True)
        if settled is None:
            return None
        member, conversation_id, status, task_id, task_name = settled
        if status not in m.TERMINAL_RUN_STATUSES or status == "cancelled":
            return None
        if task_id is not None:
            # The task-run producer: unattended by nature, so always delivered.
            return await self.notify(
                member=member, destination=Destination.task_run(task_id, run_id),
                attendance=Attendance.UNATTENDED, status=status,
                title=_TASK_TITLES.get(status, "Your task finished.").format(name=task_name),
                dedupe_key=f"run:{run_id}")
        return await self.notify(
            member=member,
            destination=Destination.chat(conversation_id, run_id),
            attendance=self.attendance(member, conversation_id),
            status=status,
            title=_TITLES.get(status, "Your request finished."),
            dedupe_key=f"run:{run_id}",
        )


_RUNS = m.Base.metadata.tables[m.Run.__tablename__]
_FIRINGS = m.Base.metadata.tables[m.TaskFiring.__tablename__]
_TASKS = m.Base.metadata.tables[m.Task.__tablename__]
_SETTLED_RUN = (select(_RUNS.c.member, _RUNS.c.conversation_id, _RUNS.c.status,
                       _TASKS.c.id, _TASKS.c.name)
                .select_from(_RUNS.outerjoin(_FIRINGS, _FIRINGS.c.run_id == _RUNS.c.id)
                             .outerjoin(_TASKS, _TASKS.c.id == _FIRINGS.c.task_id))
                .where(_RUNS.c.id == bindparam("b_run_id")))


def settled_run(run_id: str) -> Unit[tuple[str, str, str, str | None, str | None] | None]:
    """(member, conversation, status, task id, task name) of a run; the task's are None
    for a run that is not a task's firing (or whose task is gone). A read unit."""
    rows = yield from select_rows(_SETTLED_RUN, {"b_run_id": run_id})
    if not rows:
        return None
    member, conversation_id, status, task_id, task_name = rows[0]
    return str(member), str(conversation_id), str(status), task_id, task_name


_TITLES = {
    "completed": "Your answer is ready.",
    "failed": "Your request could not be completed.",
    "answer_unavailable": "No answer could be given to your request.",
}

_TASK_TITLES = {
    "completed": "Your task \u201c{name}\u201d has an answer.",
    "failed": "Your task \u201c{name}\u201d could not be completed.",
    "answer_unavailable": "Your task \u201c{name}\u201d gave no answer.",
}
