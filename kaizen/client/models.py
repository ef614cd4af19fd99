"""Typed views of the Kaizen REST API's bodies, matching the served OpenAPI document
(``kaizen/api/openapi.json``; ``tests/client/test_openapi_models.py`` holds the two equal:
every required property of a component is a field here, and every field is a property).

Unknown extra properties are kept (``extra="allow"``): a newer server may add some."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class Me(_Body):
    member: str
    admin: bool


class Agent(_Body):
    id: str
    name: str
    mode: str
    version: int
    tools: list[str] = Field(default_factory=list)


class ActiveRun(_Body):
    id: str | None = None
    status: str | None = None


class Conversation(_Body):
    id: str
    agent_id: str
    title: str
    shared: bool
    owner: str
    audience_version: int
    participants: list[str] = Field(default_factory=list)
    last_seq: int = 0
    active_run: ActiveRun | None = None


class Accepted(_Body):
    input_id: str
    position: int
    run_id: str


RunStatus = Literal["queued", "running", "awaiting_approval", "completed", "failed",
                    "answer_unavailable", "cancelled"]
TERMINAL_STATUSES = frozenset({"completed", "failed", "answer_unavailable", "cancelled"})


class Run(_Body):
    id: str
    conversation_id: str
    status: RunStatus
    input_position: int
    member: str
    outcome: str | None = None
    agent_version: str | None = None
    steps: int = 0
    tool_calls: int = 0

    @property
    def settled(self) -> bool:
        return self.status in TERMINAL_STATUSES


#: The flag of event data journaled escaped (text the databases cannot store: U+0000,
#: unpaired surrogates). The server's side of this is ``store/storable.py``.
ESCAPED_FLAG = "text_escaped"
_UNESCAPE = re.compile(r"\\(\\|u[0-9a-f]{4})")


def _unescape(text: str) -> str:
    return _UNESCAPE.sub(lambda m: "\\" if m.group(1) == "\\" else chr(int(m.group(1)[1:], 16)),
                         text)


def _unescaped(value: Any) -> Any:
    if isinstance(value, str):
        return _unescape(value)
    if isinstance(value, dict):
        return {(_unescape(k) if isinstance(k, str) else k): _unescaped(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_unescaped(v) for v in value]
    return value


class Event(_Body):
    """One durable journal event."""

    seq: int
    conversation_id: str
    type: str
    actor: str
    at: datetime
    data: dict[str, Any]
    run_id: str | None = None

    def original_data(self) -> dict[str, Any]:
        """``data`` as it was before the server escaped text it could not store (a tool's
        output, arguments or a model's answer holding U+0000 or an unpaired surrogate:
        ``data["text_escaped"]`` is then true); ``data`` itself otherwise."""
        if self.data.get(ESCAPED_FLAG) is not True:
            return self.data
        restored: dict[str, Any] = _unescaped(
            {k: v for k, v in self.data.items() if k != ESCAPED_FLAG})
        return restored


class JournalPage(_Body):
    events: list[Event]
    next: int


class EventFrame(Event):
    """A durable event as the events websocket sends it."""

    live: Literal[False] = False


class LiveFrame(_Body):
    """A live-only event (``answer.delta``, ``thinking.delta``): never stored, never
    replayed on reconnect."""

    type: str
    live: Literal[True] = True
    conversation_id: str
    run_id: str | None
    data: dict[str, Any]


Frame = EventFrame | LiveFrame


class Approval(_Body):
    """``ApprovalView``: one approval request of the member's."""

    id: str
    run_id: str
    tool: str
    status: str
    arguments: dict[str, Any]
    conversation_id: str | None = None
    capability: str | None = None
    args_digest: str | None = None
    created_at: str | None = None


class Artifact(_Body):
    id: str
    owner: str
    version: int
    latest_version: int
    kind: str
    title: str
    digest: str
    size: int
    #: The title this version was created with; ``title`` is the artifact's current one.
    version_title: str | None = None
    language: str | None = None
    mime: str | None = None
    author: str | None = None
    conversation_id: str | None = None
    room_id: str | None = None
    governed: bool = False
    derived_from: str | None = None
    created_at: datetime | None = None


class AttachedNotebook(_Body):
    artifact_id: str
    version: int
    path: str
    cells: int
    digest: str
    reused: bool


class UploadedFile(_Body):
    artifact_id: str
    version: int
    filename: str
    media_type: str
    size: int
    reused: bool = False


class NotebookKernelAccess(_Body):
    allowed: bool
    granted_at: datetime | None


class NotebookEditCell(_Body):
    ordinal: int
    op: Literal["insert", "replace", "delete"]
    cell_id: str
    cell_type: Literal["code", "markdown", "raw"]
    decision: Literal["pending", "accepted", "rejected"]
    run_after: bool
    after_cell_id: str | None = None
    base_source: str | None = None
    source: str | None = None
    outcome: Literal["applied", "stale", "failed", "undone"] | None = None


class NotebookEditProposal(_Body):
    id: str
    member: str
    conversation_id: str
    run_id: str
    artifact_id: str
    version: int
    path: str
    created_at: datetime
    cells: list[NotebookEditCell]


#: OpenAPI component name -> the model that reads it (what the conformance test checks).
COMPONENTS: dict[str, type[BaseModel]] = {
    "Me": Me, "Agent": Agent, "Conversation": Conversation, "Accepted": Accepted,
    "Run": Run, "Event": Event, "JournalPage": JournalPage, "LiveFrame": LiveFrame,
    "ApprovalView": Approval, "Artifact": Artifact, "AttachedNotebook": AttachedNotebook,
    "UploadedFile": UploadedFile, "NotebookKernelAccess": NotebookKernelAccess,
    "NotebookEditCell": NotebookEditCell, "NotebookEditProposal": NotebookEditProposal,
}
