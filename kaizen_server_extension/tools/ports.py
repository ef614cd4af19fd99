"""What the tool pipeline needs from the trusted backend, as small Protocols.

The host (``host/store_ports.py``: runs, permissions, approvals, audit over the store; tool
contexts) implements these; the pipeline depends on nothing else, so its ordering and
fail-closed behaviour can be tested with in-memory fakes.

What one call's checks read at call time travels explicitly: the dispatcher hands the
pipeline a :class:`CallScope`, the authority check returns the call's :class:`CallFactsView`,
and the pipeline passes those facts to each later check of the same call. Nothing is ambient,
so a call started by another (a kernel's ``tools.call`` during run_code) cannot see or use
the facts of the call that started it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kaizen_server_extension.policy.approvals import ApprovalMode, ApprovalReceipt
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolOutcome
from kaizen_server_extension.tools.authorization import CallAuthorization
from kaizen_server_extension.tools.types import RegisteredTool, ResourceVerdict, ToolDescriptor


class CallFactsView(Protocol):
    """What one call's checks read at call time, in one transaction (R-005, R-204, R-222)."""

    @property
    def member(self) -> str: ...

    @property
    def approval_mode(self) -> str: ...

    @property
    def only_initiator(self) -> bool:
        """The room's roster is exactly the initiating member (R-218)."""
        ...

    def allowed(self, tool: str) -> bool | None:
        """The admin policy for ``tool``, or None when these facts did not read it."""
        ...

    def granted(self, tool: str) -> bool | None:
        """Whether the member allowed ``tool`` for the rest of the run's conversation, or None
        when these facts did not read it. Only facts read when the call was journaled carry
        it, so a re-run after an approval consumes its receipt as before."""
        ...

    def grant_approval(self, tool: str) -> str | None:
        """The approval decision that made the member's grant of ``tool`` here, when these
        facts read a grant and that approval is still on record; it tells a grant from a
        revoked-and-remade one in the audit (R-377)."""
        ...


@dataclass
class CallScope:
    """One call as its dispatcher hands it to the pipeline, passed on explicitly.

    ``facts`` were read when the call was journaled, just before dispatch: the call's first
    authority check uses them once instead of reading again (a re-run after an approval, and
    the write guard, read afresh). ``audit``, when set, takes the call's audit record instead
    of the pipeline's own sink (the run's host holds it for the settlement's transaction).
    """

    facts: CallFactsView | None = None
    audit: AuditSink | None = None

    def take_facts(self) -> CallFactsView | None:
        facts, self.facts = self.facts, None
        return facts


class AuthorityCheck(Protocol):
    async def verify(self, bundle: AuthorityBundle,
                     prefetched: CallFactsView | None = None) -> CallFactsView | None:
        """Raise ``AuthorityRejected`` unless ``bundle`` matches the admitted run in every field:
        the run row is active, its claim and fence are current, and the audience is unchanged
        (R-006, R-007, R-222). Returns the facts it checked against (``prefetched`` when they
        are this run's), for the call's later checks; None when it read none."""
        ...


class PermissionResolver(Protocol):
    async def allowed(self, member: str, tool_name: str,
                      facts: CallFactsView | None = None) -> bool:
        """The member's permission for this tool *now*: from this call's ``facts`` when they
        hold the tool's policy, else read; never cached across calls, so a mid-turn
        revocation bites on the next one (R-005, R-204)."""
        ...


class ApprovalModeResolver(Protocol):
    async def mode_for(self, member: str,
                       facts: CallFactsView | None = None) -> ApprovalMode:
        """The member's current approval mode (API.md ``members/me/settings``): this call's
        ``facts`` when given, else read."""
        ...


class ApprovalStore(Protocol):
    async def find_receipt(self, run_id: str, call_digest: str) -> ApprovalReceipt | None:
        """The newest approval record of this run for exactly this call digest, if any."""
        ...

    async def request(
        self,
        run_id: str,
        bundle: AuthorityBundle,
        tool: str,
        args_digest: str,
        redacted_args: Mapping[str, Any],
    ) -> str:
        """Persist a pending approval request durably and return its id. It is committed before
        the pipeline reports the wait, so no wait can begin without a record (R-224)."""
        ...

    async def consume_receipt(self, run_id: str, approval_id: str) -> bool:
        """Compare-and-set an approved receipt to consumed; True for the one caller that did
        (``… WHERE status = 'approved' AND consumed_at IS NULL``). One-shot (R-240)."""
        ...


class AuditSink(Protocol):
    async def record_tool_call(
        self,
        bundle: AuthorityBundle,
        request: ToolCallRequest,
        outcome: ToolOutcome,
        raw: object,
        authorization: CallAuthorization | None = None,
    ) -> None:
        """Keep the raw result for audit only; it never reaches the model or the member.
        ``authorization`` is what let the call run (R-377): None when it never ran."""
        ...


class ToolExecutor(Protocol):
    def __call__(
        self, tool: RegisteredTool, bundle: AuthorityBundle, arguments: Mapping[str, Any], /
    ) -> Awaitable[object]:
        """Run ``tool.impl`` as the member (the host builds the ``ToolContext``)."""
        ...


class ArgumentValidator(Protocol):
    def __call__(self, descriptor: ToolDescriptor, raw_json_text: str, /) -> Mapping[str, Any]:
        """Parse and validate raw argument text against the live schema (bounds stripped from
        the advertisement are still enforced here, R-336); raise on anything invalid."""
        ...


class RosterCheck(Protocol):
    async def __call__(self, bundle: AuthorityBundle,
                       facts: CallFactsView | None = None, /) -> bool:
        """True when the server-side roster is exactly the initiating member (R-218)."""
        ...


class ResourceAuthorizer(Protocol):
    async def __call__(
        self, tool: RegisteredTool, bundle: AuthorityBundle, arguments: Mapping[str, Any], /
    ) -> ResourceVerdict:
        """Run ``tool.authorize`` as the member against a read-only store (R-365): a write it
        attempts is refused by the database and leaves nothing behind."""
        ...


#: The descriptor key that makes a tool credential-backed; its value is a destination id
#: (docs/credentials.md). The pipeline then asks the :class:`CredentialPort` for the call.
CREDENTIAL_DESTINATION_KEY = "credential_destination"
#: The keyword a credential-backed tool's implementation receives its broker handle under.
CREDENTIAL_HANDLE_ARGUMENT = "credential"


class CallCredentialView(Protocol):
    """One call's credential as the pipeline sees it: the arguments the tool gets (its
    ``credential_ref`` swapped for an opaque broker handle) and the result's scrubber."""

    @property
    def arguments(self) -> Mapping[str, Any]: ...

    def scrub(self, body: object) -> object: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PausedCallFacts:
    """A call that may pause for a credential: its id, the digest of its exact argument text
    (the approval digest) and the one-shot approval it consumed (None when none authorized
    it)."""

    call_id: str
    args_digest: str
    approval_id: str | None = None
    #: What authorized the call (``AuthorizedBy`` value) before it may pause.
    authorized_by: str = "not_required"


class CredentialPort(Protocol):
    async def open_for_call(self, bundle: AuthorityBundle, descriptor: ToolDescriptor,
                            arguments: Mapping[str, Any], /) -> CallCredentialView:
        """Resolve the call's ``credential_ref`` for its member and destination now (live
        policy); raise a MemberSafeError (nothing sent) when it cannot be used (R-443)."""
        ...

    async def open_for_paused_call(self, bundle: AuthorityBundle, descriptor: ToolDescriptor,
                                   arguments: Mapping[str, Any], facts: PausedCallFacts,
                                   /) -> CallCredentialView:
        """For a call without a ``credential_ref``: the credential the member submitted on
        the form of this paused call, or raise ``CredentialPending`` having paused it (its
        form issued and journaled), or a MemberSafeError (its form expired or was cancelled,
        or no form can be issued for it; nothing sent)."""
        ...

    async def approval_resumes(self, bundle: AuthorityBundle, facts: PausedCallFacts,
                               approval_id: str, /) -> bool:
        """Whether the consumed ``approval_id`` was consumed by this same call before it
        paused for a credential (so its re-issue goes on under it, asking nothing)."""
        ...

    async def paused_under(self, bundle: AuthorityBundle, facts: PausedCallFacts,
                           /) -> str | None:
        """What authorized this same call before it paused for a credential, when its pause
        has settled and it was not resumed yet (an ``AuthorizedBy`` value), else None."""
        ...
