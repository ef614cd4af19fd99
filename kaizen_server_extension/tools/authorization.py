"""What authorized one tool call to run: an execution-local fact of the call (R-377).

The approval gate (``tools/pipeline.py``) decides, under the member's resolved permission
mode, whether a call may run and why: it needed no decision, the member's explicitly chosen
Never ask mode stood in for one, the member's "allow for this conversation" grant answered
it, or a one-shot approval was consumed for exactly this call. The spec keeps a one-shot
approval and Never ask distinct "for receipts and audit", so the pipeline hands the fact to
the running call — and only to it — as a context variable set around the call's own task. A
tool whose effect is audited by its own store (``manage_openapi_sources``) records it next to
the change.

The fact is never taken from the model or the arguments, and it is set only by the pipeline.
"""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class AuthorizedBy(enum.StrEnum):
    #: The call needed no member decision under the resolved mode (a read, say).
    NOT_REQUIRED = "not_required"
    #: The member's explicitly selected Never ask mode allowed it without asking.
    NEVER_ASK = "never_ask"
    #: The member's standing "allow for this conversation" grant answered the gate.
    CONVERSATION_GRANT = "conversation_grant"
    #: A one-shot approval of exactly this call was consumed.
    ONE_SHOT_APPROVAL = "one_shot_approval"


@dataclass(frozen=True, slots=True)
class GrantRef:
    """Which standing "allow for this conversation" grant answered the gate.

    (member, conversation, tool) is the grant's key, but a grant can be revoked and made
    again; the approval decision that made it tells the two apart."""

    conversation_id: str
    tool: str
    #: The approval decided with scope "conversation" that made the grant; None once that
    #: approval row is gone (the grant keeps standing).
    approval_id: str | None

    def audit(self) -> dict[str, Any]:
        return {"conversation_id": self.conversation_id, "tool": self.tool,
                "approval_id": self.approval_id}


@dataclass(frozen=True, slots=True)
class CallAuthorization:
    by: AuthorizedBy
    #: The member's resolved permission mode when the gate decided.
    mode: str
    #: The consumed approval (``ONE_SHOT_APPROVAL`` only).
    approval_id: str | None = None
    #: The run the call belongs to.
    run_id: str | None = None
    #: The standing grant that answered the gate (``CONVERSATION_GRANT`` only).
    grant: GrantRef | None = None

    def __post_init__(self) -> None:
        if (self.by is AuthorizedBy.ONE_SHOT_APPROVAL) != (self.approval_id is not None):
            raise ValueError("an approval id goes with a one-shot approval, and only with it")
        if (self.by is AuthorizedBy.CONVERSATION_GRANT) != (self.grant is not None):
            raise ValueError("a grant goes with a conversation grant, and only with it")

    def audit(self) -> dict[str, Any]:
        """The fact as an audit field: no argument, value or result."""
        shown: dict[str, Any] = {"by": self.by.value, "mode": self.mode}
        if self.approval_id is not None:
            shown["approval_id"] = self.approval_id
        if self.run_id is not None:
            shown["run_id"] = self.run_id
        if self.grant is not None:
            shown["grant"] = self.grant.audit()
        return shown


_CURRENT: contextvars.ContextVar[CallAuthorization | None] = contextvars.ContextVar(
    "kaizen_call_authorization", default=None)


def current_authorization() -> CallAuthorization | None:
    """What authorized the tool call running in this task, or None outside a guarded call."""
    return _CURRENT.get()


@contextmanager
def authorized_as(authorization: CallAuthorization) -> Iterator[None]:
    """Within the block — and in a task created within it, which copies the context — the
    running call was authorized by ``authorization``. For the pipeline only."""
    token = _CURRENT.set(authorization)
    try:
        yield
    finally:
        _CURRENT.reset(token)


__all__ = ["AuthorizedBy", "CallAuthorization", "GrantRef", "authorized_as",
           "current_authorization"]
