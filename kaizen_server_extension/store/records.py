"""Plain records the repositories return: no ORM objects leave the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: The posture of a run that is not a task's firing (a member's message): R-053.
CHAT_POSTURE = "chat"


@dataclass(frozen=True, slots=True)
class MemberRecord:
    id: str
    display_name: str
    approval_mode: str
    model: str | None
    tool_result_compression: bool = False


@dataclass(frozen=True, slots=True)
class AgentRecord:
    id: str
    name: str
    owner: str | None
    version: int
    version_id: str
    persona: str
    tool_ceiling: tuple[str, ...]
    knowledge_scope: dict[str, Any]
    mode: str

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "mode": self.mode,
            "version": self.version,
            "tools": list(self.tool_ceiling),
        }


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    id: str
    owner: str
    agent_id: str
    title: str
    shared: bool
    audience_version: int
    last_seq: int
    participants: tuple[str, ...]
    created_at: datetime
    updated_at: datetime
    # The room's running or approval-waiting run, if any: lets a client badge a busy room.
    active_run: dict[str, str] | None = None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "active_run": self.active_run,
            "agent_id": self.agent_id,
            "title": self.title,
            "shared": self.shared,
            "owner": self.owner,
            "audience_version": self.audience_version,
            "participants": list(self.participants),
            "last_seq": self.last_seq,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class EventRecord:
    conversation_id: str
    seq: int
    run_id: str | None
    type: str
    actor: str
    at: datetime
    data: dict[str, Any]

    def public(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "conversation_id": self.conversation_id,
            "run_id": self.run_id,
            "type": self.type,
            "actor": self.actor,
            "at": self.at.isoformat(),
            "data": self.data,
        }


@dataclass(frozen=True, slots=True)
class AcceptedInputRecord:
    input_id: str
    conversation_id: str
    position: int
    kind: str
    member: str
    run_id: str
    text_digest: str
    idempotency_key: str | None
    created: bool  # False when an idempotent replay returned the earlier acceptance

    def public(self) -> dict[str, Any]:
        return {"input_id": self.input_id, "position": self.position, "run_id": self.run_id}


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    conversation_id: str
    input_id: str
    input_position: int
    member: str
    agent_version_id: str | None
    audience_version: int | None
    resource_digest: str | None
    catalog_digest: str | None
    model: str | None
    status: str
    reason: str | None
    fence: int
    steps: int
    tool_calls: int
    #: Who holds the run's lease (``host:pid:nonce``, ``…:live`` when the database holds the
    #: holder's liveness too: store/runs.py).
    lease_owner: str | None = None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "conversation_id": self.conversation_id,
            "status": self.status,
            "outcome": self.reason,
            "input_position": self.input_position,
            "member": self.member,
            "agent_version": self.agent_version_id,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
        }
