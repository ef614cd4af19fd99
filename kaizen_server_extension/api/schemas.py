"""Request bodies of the REST API (pydantic; also the source of the OpenAPI schemas)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from kaizen_server_extension.lanes.inbox import RESOURCE_ID
from kaizen_server_extension.resources import MAX_ATTACHMENTS

# U+0085 and U+FEFF are spelled out: the server's regex engine counts U+0085 as \s and
# ECMA-262 (the document's) does not, and the other way round for U+FEFF; named, both agree.
MemberName = Annotated[str, StringConstraints(min_length=1, max_length=200,
                                              pattern=r"^[^\s\u0085\ufeff/][^/]*$")]


class CreateConversation(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    agent_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    title: Annotated[str, StringConstraints(max_length=300)] | None = None
    shared: bool = False


class AddParticipant(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    member: MemberName


class PostMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # Length is checked in bytes against the configured bound (413), not here.
    text: Annotated[str, StringConstraints(min_length=1)]
    kind: Literal["message", "steering"] = "message"
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = (
        None
    )
    # Artifact ids the sender may read (owner, or bound to exactly this room); each is pinned
    # to its latest completed version and projected read-only for run_code. At most 8.
    attachments: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=64)]],
        Field(max_length=MAX_ATTACHMENTS, json_schema_extra={"uniqueItems": True},
              description="Artifact ids the sender may read (own, or bound to this exact "
                          "room). Each is pinned to its latest completed version and "
                          "projected read-only for run_code (KAIZEN_SHARED_RESOURCES_DIR)."),
    ] = []

    @field_validator("attachments")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("attachments must not repeat an artifact")
        return value


class MemberSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    approval_mode: Literal["always_ask", "ask_for_writes", "never_ask"]
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    tool_result_compression: bool = Field(
        False, description="Let the model read run_code's stdout and stderr compressed "
                           "(progress bars, repeated and look-alike lines shortened); the "
                           "activity and the audit keep the full output")


class ApprovalDecision(BaseModel):
    # The document says what the validator below holds: scope "conversation" only to approve.
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "if": {"required": ["scope"], "properties": {"scope": {"const": "conversation"}}},
        "then": {"properties": {"decision": {"const": "approve"}}}})

    decision: Literal["approve", "deny"]
    scope: Literal["call", "conversation"] = Field(
        "call", description="conversation (with approve only): also allow this tool for the "
                            "rest of this conversation, for you; revocable (DELETE "
                            "conversations/{id}/tool-grants/{tool}). Not for tools that ask "
                            "every time (422 grant_not_allowed).")

    @model_validator(mode="after")
    def _grant_only_with_approve(self) -> ApprovalDecision:
        if self.scope == "conversation" and self.decision != "approve":
            raise ValueError("scope 'conversation' goes with decision 'approve' only")
        return self


#: An exact resource id as the completion inbox issues them (``lanes.inbox.RESOURCE_ID``).
ExactResourceId = Annotated[str, StringConstraints(pattern=rf"^{RESOURCE_ID.pattern}$")]


class OpenDestination(BaseModel):
    """The destination the client has open: a kind and exact resource ids, nothing else (no
    URL, no prefix or pattern). Only notices of exactly this destination are acknowledged."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["chat", "prompt", "task_run"]
    resource_id: ExactResourceId
    run_id: ExactResourceId | None = None


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail
