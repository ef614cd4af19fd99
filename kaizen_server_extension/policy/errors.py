"""Errors the policy layer raises. Their messages are member-safe by construction."""

from __future__ import annotations


class PolicyDenied(Exception):
    """A genuine policy or authorization block: the call does not run and the turn closes.

    ``code`` is snake_case and stable (it labels logs and close reasons); ``member_message`` is
    a sentence safe to show the member and the model. Neither carries argument or result text.
    """

    def __init__(self, code: str, member_message: str) -> None:
        super().__init__(f"{code}: {member_message}")
        self.code = code
        self.member_message = member_message


class ApprovalPending(Exception):
    """The call needs a member decision; its request is already persisted.

    Raised by the pipeline instead of a settled result: the host moves the run to
    ``awaiting_approval`` and re-issues the call once the member has decided (R-224, R-238).
    It is deliberately not a :class:`~kaizen_server_extension.protocol.tools.ToolCallResult`, so a
    pending approval can never be mistaken for a settled call or counted as one.
    """

    def __init__(self, approval_id: str, *, call_id: str, tool: str) -> None:
        super().__init__(f"approval {approval_id} pending for {tool}")
        self.approval_id = approval_id
        self.call_id = call_id
        self.tool = tool


class CredentialPending(Exception):
    """The call needs a credential the member has not given: a paused request and its signed
    form are already persisted and journaled (``credential.requested``).

    Raised by the pipeline, after the approval gate and the write guard, instead of a settled
    result, exactly like :class:`ApprovalPending`: the host keeps the run waiting until the
    member submits the form, cancels it, or it expires, then re-issues the call, which takes
    that outcome once (docs/credentials.md, "A call that needs a credential")."""

    def __init__(self, request_id: str, *, call_id: str, tool: str) -> None:
        super().__init__(f"credential request {request_id} pending for {tool}")
        self.request_id = request_id
        self.call_id = call_id
        self.tool = tool
