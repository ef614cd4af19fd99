"""Request bodies of the REST API (pydantic; also the source of the OpenAPI schemas)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints

MemberName = Annotated[str, StringConstraints(min_length=1, max_length=200,
                                              pattern=r"^[^\s/][^/]*$")]


class CreateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    title: Annotated[str, StringConstraints(max_length=300)] | None = None
    shared: bool = False


class AddParticipant(BaseModel):
    model_config = ConfigDict(extra="forbid")

    member: MemberName


class PostMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Length is checked in bytes against the configured bound (413), not here.
    text: Annotated[str, StringConstraints(min_length=1)]
    kind: Literal["message", "steering"] = "message"
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = (
        None
    )


class MemberSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    approval_mode: Literal["always_ask", "ask_for_writes", "never_ask"]
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None


class ApprovalDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "deny"]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail
