"""The guarded pipeline one tool call passes through on the trusted side of ``call_tool``.

Order (spec: What happens on a tool call; R-223), every step on every call:

1. authority bundle re-check (``AuthorityRejected`` propagates: nothing is settled);
2. the member's permissions, re-resolved now (R-204);
3. the agent's capability ceiling: the frozen catalog's names (R-001, R-098);
4. shared-room admission re-check for actor-private / undeclared tools (R-218);
5. argument validation against the live schema (R-336); for a source tool (anything not
   first-party) and any credential-backed tool, the arguments are then screened for
   credential-shaped keys, values and URL parts, and refused before anything else happens
   (R-349; ``policy/credential_arguments.py``). The arguments are fixed from here on (an
   approval's digest binds them), so this is the same check as one made at the instant of
   execution, and nobody is asked to approve a call that would be refused;
6. the turn ledger: cut-off tool, identical failed input, duplicate write (R-270..R-290);
6a. a task's run (``bundle.posture``): a safe test refuses any effect but isolated execution,
   a task run re-reads its task's authority, before the gate and again in step 8 (R-053,
   R-055..R-057; ``policy/task_posture.py``);
7. guardrail chain and approval mode; a call needing a decision is persisted before any wait
   and reported as :class:`ApprovalPending`; an approved receipt is consumed once (R-224,
   R-240..R-242). The member's "allow for this conversation" for a write tool, read with the
   call's facts, answers what their mode asks (never an operator guardrail's demand). What
   authorized the call — no decision needed, Never ask, the grant, or the one-shot approval
   consumed — goes with it to its audit row (R-377; ``tools/authorization.py``);
8. the write guard and the tool's own resource authorization, after any approval and
   immediately before execution (R-223, R-226): for every call that may have an effect, the
   run is re-checked live and the member's permission re-resolved at that instant; a tool
   declaring ``authorize`` has it answered against a read-only store (R-365). A denial is a
   definite refusal: nothing ran;
9. execution as the member, bounded by the declared timeout (capped at 240 s) and cancelled
   with the turn (R-291..R-294). A credential-backed tool's ``credential_ref`` is resolved
   by the credential port just before, and the tool receives an opaque broker handle in its
   place; its result (and any error text) is scrubbed of the credential with that same
   handle (R-443, R-396; ``credentials/``). An External OpenAPI call made without one
   **pauses** here, after its approval was consumed and the write guard passed: the port
   issues the signed form for this call and raises :class:`CredentialPending`, the host
   waits as for an approval and re-issues the call, which then goes on under the approval it
   consumed (step 7) and takes the submitted credential once, or settles a refusal when the
   form expired or was cancelled (R-387; ``credentials/paused_calls.py``);
10. outcome classification (the body is read, not only the envelope: R-274) and a bounded,
    redacted, member-safe projection (R-229, R-344), which the guardrail chain checks again
    before it is published (R-070). The raw result goes to audit only.

A call the controller marks ``refused`` (a staged artifact operation its step never offered,
R-252) is settled after step 1 as a denial with that typed reason and nothing else runs; a
staged operation outside the agent's ceiling is denied with the same typed reason
(``staged_protocol_unavailable``) instead of the generic ``over_ceiling``.

A genuine policy or authorization block settles as an error that closes the turn; everything
the model can repair (bad arguments, a refused repeat, a failed read) settles as an error the
turn survives (R-256, R-289). A write, sensitive or undeclared tool that raises or times out is
an ambiguous write and closes the turn (R-261, R-441).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from kaizen_server_extension.policy.approvals import (
    ApprovalMode,
    ApprovalStatus,
    arguments_digest,
    decide,
    grantable,
)
from kaizen_server_extension.policy.ceilings import CapabilityCeiling
from kaizen_server_extension.policy.credential_arguments import (
    CREDENTIAL_REF_ARGUMENT,
    find_credential,
)
from kaizen_server_extension.policy.errors import ApprovalPending, PolicyDenied
from kaizen_server_extension.policy.guardrails import (
    Deny,
    GuardrailCall,
    GuardrailChain,
    GuardrailResult,
    NeedsApproval,
    Redact,
)
from kaizen_server_extension.policy.redaction import redact, redact_text, withhold
from kaizen_server_extension.policy.task_posture import TaskPostureGate
from kaizen_server_extension.protocol.authority import AuthorityBundle, AuthorityRejected
from kaizen_server_extension.protocol.errors import MemberSafeError, RunCancelled
from kaizen_server_extension.protocol.tools import (
    STAGED_PROTOCOL_OPERATIONS,
    FailureDomain,
    ProtocolFailure,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.tools import settlement
from kaizen_server_extension.tools.authorization import (
    AuthorizedBy,
    CallAuthorization,
    GrantRef,
    authorized_as,
)
from kaizen_server_extension.tools.ledger import TurnLedger
from kaizen_server_extension.tools.metrics import (
    UNKNOWN_TOOL_LABEL,
    ToolMetrics,
    default_metrics,
    log_failed_result,
)
from kaizen_server_extension.tools.ports import (
    CREDENTIAL_DESTINATION_KEY,
    ApprovalModeResolver,
    ApprovalStore,
    ArgumentValidator,
    AuditSink,
    AuthorityCheck,
    CallCredentialView,
    CallFactsView,
    CallScope,
    CredentialPort,
    PausedCallFacts,
    PermissionResolver,
    ResourceAuthorizer,
    RosterCheck,
    ToolExecutor,
)
from kaizen_server_extension.tools.running_call import running_call
from kaizen_server_extension.tools.schema import validate_arguments
from kaizen_server_extension.tools.settlement import (
    MAX_MESSAGE_CHARS,
    Settlement,
    bounded_message,
    may_have_effect,
    operator_detail,
    protocol_denial,
)
from kaizen_server_extension.tools.types import (
    RegisteredTool,
    ResourceVerdict,
    RoomClass,
    ToolDescriptor,
)

log = logging.getLogger("kaizen.tools.pipeline")

# How long a cancelled tool gets to unwind before the pipeline stops waiting for it.
CANCEL_GRACE_S = 1.0

DEFAULT_PROJECTION_LIMIT = 16_000
# Tools that must re-check the roster at the callback: actor-private ones, and anything that
# declared no class (which may not be in a shared room at all).
_PRIVATE_ROOM_CLASSES = frozenset({RoomClass.ACTOR_PRIVATE_READ, RoomClass.UNKNOWN})



class ScrubbedToolError(Exception):
    """A credential-backed tool raised: its text, scrubbed of the credential, stands in for
    the original, whose chain is not kept (it may hold the value)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}" if message else kind)


def _needs_screening(descriptor: ToolDescriptor) -> bool:
    return not descriptor.first_party or CREDENTIAL_DESTINATION_KEY in descriptor.extra


class ToolPipeline:
    """Runs one tool call at a time for one run; create one per admitted run."""

    def __init__(
        self,
        *,
        tools: Mapping[str, RegisteredTool],
        ceiling: CapabilityCeiling | Iterable[str],
        authority: AuthorityCheck,
        permissions: PermissionResolver,
        approval_modes: ApprovalModeResolver,
        approvals: ApprovalStore | None,
        executor: ToolExecutor,
        roster_is_only_initiator: RosterCheck,
        audit: AuditSink,
        validator: ArgumentValidator = validate_arguments,
        guardrails: GuardrailChain | None = None,
        ledger: TurnLedger | None = None,
        metrics: ToolMetrics | None = None,
        projection_limit: int = DEFAULT_PROJECTION_LIMIT,
        cancelled: asyncio.Event | None = None,
        resources: ResourceAuthorizer | None = None,
        task_posture: TaskPostureGate | None = None,
        credentials: CredentialPort | None = None,
    ) -> None:
        if projection_limit < 1:
            raise ValueError("projection_limit must be positive")
        self._tools = tools
        self._ceiling = (ceiling if isinstance(ceiling, CapabilityCeiling)
                         else CapabilityCeiling.of(ceiling))
        self._authority = authority
        self._permissions = permissions
        self._modes = approval_modes
        self._approvals = approvals
        self._validator = validator
        self._executor = executor
        self._roster_is_only_initiator = roster_is_only_initiator
        self._audit = audit
        self._guardrails = guardrails if guardrails is not None else GuardrailChain()
        self.ledger = ledger if ledger is not None else TurnLedger()
        self._metrics = metrics if metrics is not None else default_metrics()
        self._projection_limit = projection_limit
        self._cancelled = cancelled
        self._resources = resources
        self._task_posture = task_posture
        self._credentials = credentials

    # --- entry point -----------------------------------------------------------------------

    async def run(self, bundle: AuthorityBundle, request: ToolCallRequest,
                  scope: CallScope | None = None) -> ToolCallResult:
        """Settle one call, or raise ``AuthorityRejected`` / ``RunCancelled`` /
        :class:`ApprovalPending` (none of which is a settled result).

        ``scope`` is what the dispatcher read for this call and where its audit goes; the
        facts the authority check returns are handed to this call's later checks, and to
        no other call's."""
        scope = scope if scope is not None else CallScope()
        audit = scope.audit if scope.audit is not None else self._audit
        try:
            if self._cancelled is not None and self._cancelled.is_set():
                raise RunCancelled()
            facts = await self._authority.verify(bundle, scope.take_facts())
            settled = await self._decide_and_execute(bundle, request, facts, audit)
            return await self._finish(bundle, request, settled, audit)
        except asyncio.CancelledError as exc:
            # The turn is over (member stop or inactivity budget): never settled.
            raise RunCancelled() from exc

    async def _decide_and_execute(
        self, bundle: AuthorityBundle, request: ToolCallRequest,
        facts: CallFactsView | None, audit: AuditSink,
    ) -> Settlement:
        known = self._tools.get(request.name)
        if request.refused is not None:
            # The controller never offered this call on its step. A refusal can only
            # stop a call, so it is honoured before anything else is resolved.
            return settlement.denied(request, protocol_denial(request.refused),
                                known.descriptor if known else None)
        try:
            registered = await self._admit(bundle, request.name, known, facts)
        except PolicyDenied as denied:
            return settlement.denied(request, denied, known.descriptor if known else None)
        descriptor = registered.descriptor

        arguments, invalid = self._validate(descriptor, request)
        if invalid is not None:
            return invalid
        carrying = self._screen(descriptor, request, arguments)
        if carrying is not None:
            return carrying

        decision = self.ledger.check(descriptor, request)
        if decision is not None:
            suppressed = decision.outcome is ToolOutcome.SUPPRESSED
            return Settlement(
                ToolCallResult(
                    call_id=request.call_id, name=request.name, outcome=decision.outcome,
                    content=decision.content, capability=descriptor.capability,
                    failure_domain=FailureDomain.NONE if suppressed else FailureDomain.CALLER,
                    evidence=suppressed,
                ),
                reason_code=decision.reason_code,
            )

        try:
            # A task's posture decides before any approval is asked for.
            posture_refusal = await self._check_task_posture(bundle, request, descriptor)
            if posture_refusal is not None:
                return posture_refusal
            gate = await self._gate(bundle, request, descriptor, arguments, facts)
        except PolicyDenied as denied:
            return settlement.denied(request, denied, descriptor)
        if isinstance(gate, Settlement):
            return gate
        authorization = replace(gate, run_id=bundle.run_id)
        try:
            refused = await self._guard_write(bundle, request, registered, arguments)
        except PolicyDenied as denied:
            return settlement.denied(request, denied, descriptor)
        if refused is not None:
            return refused
        credential: CallCredentialView | None = None
        if CREDENTIAL_DESTINATION_KEY in descriptor.extra:
            credential, unusable = await self._open_credential(bundle, request, descriptor,
                                                               arguments, gate)
            if unusable is not None:
                return unusable
        settled = await self._execute(bundle, request, registered, arguments, audit,
                                      credential, authorization)
        return await self._check_result(bundle, request, descriptor,
                                        replace(settled, authorization=authorization))

    # --- steps 2-4: permissions, ceiling, room ---------------------------------------------

    async def _admit(
        self, bundle: AuthorityBundle, name: str, registered: RegisteredTool | None,
        facts: CallFactsView | None,
    ) -> RegisteredTool:
        await self._check_permission(bundle, name, facts)
        try:
            self._ceiling.check(name)
        except PolicyDenied:
            if name in STAGED_PROTOCOL_OPERATIONS:
                # The agent has no staged writer: a protocol failure with its typed reason,
                # not an ordinary unknown tool.
                raise protocol_denial(ProtocolFailure.STAGED_PROTOCOL_UNAVAILABLE) from None
            raise
        if registered is None:
            # In the frozen catalog but no longer registered: fail closed like the ceiling.
            raise PolicyDenied("over_ceiling",
                               "That tool is not available to this agent in this conversation.")
        descriptor = registered.descriptor
        if descriptor.room_class in _PRIVATE_ROOM_CLASSES:
            try:
                private = await self._roster_is_only_initiator(bundle, facts)
            except Exception:
                log.exception("roster check failed; denying %s", name)
                private = False
            if not private:
                raise PolicyDenied(
                    "room_admission",
                    "That tool is private to the member who started this turn and this "
                    "conversation is shared, so it was not run.",
                )
        return registered

    async def _check_permission(self, bundle: AuthorityBundle, name: str,
                                facts: CallFactsView | None) -> None:
        try:
            allowed = await self._permissions.allowed(bundle.member, name, facts)
        except Exception as exc:
            # A failed access check is an internal error in that check, with no claim about
            # the tool's outcome; it fails closed.
            reference = uuid.uuid4().hex[:12]
            log.warning("permission check for %s failed (reference %s): %s", name, reference,
                        operator_detail(exc))
            raise PolicyDenied(
                "permission_check_failed",
                f"Checking permission to use {name} failed with an internal error "
                f"(reference {reference}).") from None
        if not allowed:
            raise PolicyDenied("permission_denied",
                               "You do not currently have permission to use that tool.")

    # --- step 5: arguments -----------------------------------------------------------------

    def _validate(
        self, descriptor: ToolDescriptor, request: ToolCallRequest
    ) -> tuple[Mapping[str, Any], Settlement | None]:
        try:
            arguments = self._validator(descriptor, request.arguments)
            if not isinstance(arguments, Mapping):
                raise TypeError("arguments must be a JSON object")
            return arguments, None
        except MemberSafeError as exc:
            # The schema module's message already names the tool and the failing paths.
            message = bounded_message(exc)
        except Exception as exc:
            message = f"The arguments for {descriptor.name} are not valid: {bounded_message(exc)}"
        content = f"{message}. Fix the arguments and call the tool again."
        # The model's mistake, not the tool's: it never counts towards the tool's health.
        return {}, Settlement(
            ToolCallResult(call_id=request.call_id, name=request.name,
                           outcome=ToolOutcome.ERROR, content=content,
                           capability=descriptor.capability,
                           failure_domain=FailureDomain.CALLER),
            reason_code="invalid_arguments", remember=True,
        )

    def _screen(self, descriptor: ToolDescriptor, request: ToolCallRequest,
                arguments: Mapping[str, Any]) -> Settlement | None:
        """A source tool's arguments carry no credential: refused before anything (R-349).
        The refusal names where and what shape, never the value."""
        if not _needs_screening(descriptor):
            return None
        finding = find_credential(arguments)
        if finding is None:
            return None
        log.warning("refused %s (run call %s): credential-shaped argument at %s (%s)",
                    request.name, request.call_id, finding.path, finding.reason)
        return Settlement(
            ToolCallResult(call_id=request.call_id, name=request.name,
                           outcome=ToolOutcome.ERROR, content=finding.message(request.name),
                           capability=descriptor.capability,
                           failure_domain=FailureDomain.CALLER),
            raw={"refused": "credential_in_arguments", "path": finding.path,
                 "shape": finding.reason},
            reason_code="credential_in_arguments", remember=True,
        )

    async def _open_credential(
        self, bundle: AuthorityBundle, request: ToolCallRequest, descriptor: ToolDescriptor,
        arguments: Mapping[str, Any], gate: CallAuthorization | None = None,
    ) -> tuple[CallCredentialView | None, Settlement | None]:
        """The call's broker handle, or the definite refusal (nothing was sent). Without a
        ``credential_ref`` the call may pause for the member's form (raises
        :class:`CredentialPending`, which is not a settled result)."""
        if self._credentials is None:
            refusal = MemberSafeError(f"Credentials are not available here, so {request.name} "
                                      "was not run.", code="credentials_unavailable")
        else:
            try:
                if CREDENTIAL_REF_ARGUMENT not in arguments:
                    return await self._credentials.open_for_paused_call(
                        bundle, descriptor, arguments, self._paused_facts(request, gate)), None
                return await self._credentials.open_for_call(bundle, descriptor,
                                                             arguments), None
            except MemberSafeError as exc:
                refusal = exc
        return None, Settlement(
            ToolCallResult(call_id=request.call_id, name=request.name,
                           outcome=ToolOutcome.ERROR, content=bounded_message(refusal),
                           capability=descriptor.capability,
                           failure_domain=FailureDomain.CALLER),
            raw={"refused": refusal.code, "stage": "credential"},
            reason_code=refusal.code, remember=True,
        )

    @staticmethod
    def _paused_facts(request: ToolCallRequest,
                      gate: CallAuthorization | None) -> PausedCallFacts:
        digest = arguments_digest(request.name, request.arguments)
        if gate is None:
            return PausedCallFacts(request.call_id, digest)
        return PausedCallFacts(request.call_id, digest, gate.approval_id, gate.by.value)

    # --- step 7: guardrails and approvals --------------------------------------------------

    async def _gate(
        self,
        bundle: AuthorityBundle,
        request: ToolCallRequest,
        descriptor: ToolDescriptor,
        arguments: Mapping[str, Any],
        facts: CallFactsView | None,
    ) -> Settlement | CallAuthorization:
        """Raise PolicyDenied/ApprovalPending, return a declined result, or what authorizes
        the call to execute (R-377): no decision needed, the member's Never ask mode, their
        conversation grant, or the one-shot approval consumed for it."""
        try:
            mode = await self._modes.mode_for(bundle.member, facts)
        except Exception:
            log.exception("approval mode resolution failed; asking for everything")
            mode = ApprovalMode.ALWAYS_ASK
        verdict = await self._guardrails.evaluate(
            GuardrailCall(bundle, request, descriptor, arguments, mode))
        if isinstance(verdict, Deny):
            raise PolicyDenied(verdict.code, verdict.reason)
        # An operator guardrail's demand for approval holds under every member mode.
        demanded = isinstance(verdict, NeedsApproval)
        if not (decide(mode, descriptor).needs_approval or demanded):
            # Never ask is a distinct, explicitly chosen authorization, not "no decision":
            # it is what let a call run that another mode would have asked about. Always ask
            # asks for everything the default asks for and more (a member-store write too),
            # so it is the mode to compare with.
            asked_otherwise = any(decide(other, descriptor).needs_approval
                                  for other in ApprovalMode if other is not mode)
            by = (AuthorizedBy.NEVER_ASK if mode is ApprovalMode.NEVER_ASK and asked_otherwise
                  else AuthorizedBy.NOT_REQUIRED)
            return CallAuthorization(by, str(mode))
        # The member's own standing answer for this tool here stands in for their decision,
        # never for an operator's. It comes only from this call's journaled facts, so a re-run
        # after an approval (fresh facts, no grant read) consumes its one-shot receipt.
        if (not demanded and grantable(descriptor.capability) and facts is not None
                and facts.member == bundle.member and facts.granted(request.name) is True):
            return CallAuthorization(
                AuthorizedBy.CONVERSATION_GRANT, str(mode),
                grant=GrantRef(bundle.conversation_id, request.name,
                               facts.grant_approval(request.name) or None))
        # The re-issue of a call the grant answered before it paused for a credential (a
        # re-issue's facts carry no grant read): the member's form for this very call stands
        # with that answer (docs/credentials.md).
        if not demanded and grantable(descriptor.capability) \
                and CREDENTIAL_DESTINATION_KEY in descriptor.extra \
                and await self._paused_under(bundle, request) \
                == AuthorizedBy.CONVERSATION_GRANT.value:
            # The grant's own approval is not read on a re-issue: the audit names the grant by
            # its key only.
            return CallAuthorization(AuthorizedBy.CONVERSATION_GRANT, str(mode),
                                     grant=GrantRef(bundle.conversation_id, request.name, None))
        consumed = await self._approval(bundle, request, descriptor, arguments)
        if isinstance(consumed, Settlement):
            return consumed
        return CallAuthorization(AuthorizedBy.ONE_SHOT_APPROVAL, str(mode), consumed)

    async def _approval(
        self,
        bundle: AuthorityBundle,
        request: ToolCallRequest,
        descriptor: ToolDescriptor,
        arguments: Mapping[str, Any],
    ) -> Settlement | str:
        """The id of the one-shot approval consumed for this call, or a declined result
        (raises ApprovalPending while it is asked, PolicyDenied when it cannot be used)."""
        store = self._approvals
        if store is None:
            raise PolicyDenied("approval_unavailable",
                               "This action needs the member's approval and approvals are "
                               "unavailable, so it was not run.")
        digest = arguments_digest(request.name, request.arguments)
        try:
            receipt = await store.find_receipt(bundle.run_id, digest)
            if receipt is not None and receipt.status is ApprovalStatus.CONSUMED \
                    and CREDENTIAL_DESTINATION_KEY in descriptor.extra \
                    and await self._resumes_paused(bundle, request, receipt.approval_id):
                # This call consumed it before it paused for a credential: its re-issue goes
                # on under that approval, and no other call can.
                return receipt.approval_id
            if receipt is None or receipt.status is ApprovalStatus.CONSUMED:
                # The request shows what is decided on, except what the tool keeps in the
                # backend until that exact request is approved; the digest binds it all.
                approval_id = await store.request(
                    bundle.run_id, bundle, request.name, digest,
                    redact(withhold(dict(arguments), descriptor.withheld_arguments)))
                raise ApprovalPending(approval_id, call_id=request.call_id, tool=request.name)
            if receipt.status is ApprovalStatus.PENDING:
                raise PolicyDenied("approval_pending",
                                   "This action is still waiting for the member's decision, "
                                   "so it was not run.")
            if receipt.status is ApprovalStatus.DENIED:
                return Settlement(
                    ToolCallResult(call_id=request.call_id, name=request.name,
                                   outcome=ToolOutcome.ERROR,
                                   content=f"The member declined this {request.name} call; it "
                                           "was not run. Do not ask again in this turn.",
                                   capability=descriptor.capability,
                                   failure_domain=FailureDomain.CALLER),
                    reason_code="approval_declined",
                )
            if not await store.consume_receipt(bundle.run_id, receipt.approval_id):
                raise PolicyDenied("approval_replayed",
                                   "That approval was already used, so the call was not run.")
        except (ApprovalPending, PolicyDenied):
            raise
        except Exception:
            log.exception("approval store failed; denying %s", request.name)
            raise PolicyDenied("approval_unavailable",
                               "This action needs the member's approval and approvals are "
                               "unavailable, so it was not run.") from None
        return receipt.approval_id

    async def _paused_under(self, bundle: AuthorityBundle,
                            request: ToolCallRequest) -> str | None:
        if self._credentials is None:
            return None
        try:
            return await self._credentials.paused_under(bundle,
                                                        self._paused_facts(request, None))
        except Exception:
            log.exception("paused call lookup failed for %s; asking as usual", request.name)
            return None

    async def _resumes_paused(self, bundle: AuthorityBundle, request: ToolCallRequest,
                              approval_id: str) -> bool:
        if self._credentials is None:
            return False
        return await self._credentials.approval_resumes(
            bundle, self._paused_facts(request, None), approval_id)

    # --- a task's posture ------------------------------------------------------------------

    async def _check_task_posture(self, bundle: AuthorityBundle, request: ToolCallRequest,
                                  descriptor: ToolDescriptor) -> Settlement | None:
        """For a task's run and a call that may have an effect: None to go on, a repairable
        safe-test refusal, or PolicyDenied when the task's authority is gone (R-057)."""
        if bundle.posture == "chat" or not may_have_effect(descriptor):
            return None
        if self._task_posture is None:
            raise PolicyDenied("task_authority_unavailable",
                               f"Task authority cannot be checked here, so {request.name} "
                               "was not run.")
        refusal = await self._task_posture.check(bundle, request.name,
                                                 descriptor.write_category)
        if refusal is None:
            return None
        return Settlement(
            ToolCallResult(call_id=request.call_id, name=request.name,
                           outcome=ToolOutcome.ERROR, content=refusal.message,
                           capability=descriptor.capability,
                           failure_domain=FailureDomain.CALLER),
            raw={"refused": refusal.code, "stage": "task_posture"},
            reason_code=refusal.code, remember=True,
        )

    # --- step 8: write guard and the tool's own resource authorization ----------------------

    async def _guard_write(
        self,
        bundle: AuthorityBundle,
        request: ToolCallRequest,
        registered: RegisteredTool,
        arguments: Mapping[str, Any],
    ) -> Settlement | None:
        """Raise PolicyDenied / AuthorityRejected, return a refusal, or None to execute.

        Runs after the approval gate, so whatever an approval wait let change (a cancelled or
        taken-over run, a revoked permission) is seen here, at the last instant before the
        tool runs (R-223, R-226)."""
        descriptor = registered.descriptor
        if may_have_effect(descriptor):
            # The run is still ours and the room unchanged; a lost run is not settled.
            fresh = await self._authority.verify(bundle)
            await self._check_permission(bundle, request.name, fresh)
            # A task's authority again, after whatever the approval wait let change.
            refused = await self._check_task_posture(bundle, request, descriptor)
            if refused is not None:
                return refused
        if registered.authorize is None:
            return None
        if self._resources is None:
            raise PolicyDenied("resource_check_unavailable",
                               f"{request.name} checks access to what it changes and that "
                               "check is unavailable here, so it was not run.")
        try:
            verdict = await self._resources(registered, bundle, arguments)
            if not isinstance(verdict, ResourceVerdict):
                raise TypeError(f"authorize returned {type(verdict).__name__}")
        except (RunCancelled, AuthorityRejected):
            raise
        except Exception as exc:
            # An internal error in the access check (a write it attempted included): nothing
            # ran, and no claim is made about an outcome.
            reference = uuid.uuid4().hex[:12]
            log.warning("resource authorization of %s failed (reference %s, run call %s): %s",
                        request.name, reference, request.call_id, operator_detail(exc))
            raise PolicyDenied(
                "resource_check_failed",
                f"Checking access for {request.name} failed with an internal error "
                f"(reference {reference}); it was not run.") from None
        if verdict.allowed:
            return None
        reason = redact_text(verdict.reason.strip())[:MAX_MESSAGE_CHARS] or (
            "You cannot change that.")
        # The model can repair a wrong target, so the turn goes on; the refusal is definite.
        return Settlement(
            ToolCallResult(call_id=request.call_id, name=request.name,
                           outcome=ToolOutcome.ERROR,
                           content=f"{reason} {request.name} was not run.",
                           capability=descriptor.capability,
                           failure_domain=FailureDomain.CALLER),
            raw={"refused": verdict.code, "stage": "resource_authorization"},
            reason_code=verdict.code, remember=True,
        )

    # --- step 9: execution -----------------------------------------------------------------

    async def _execute(
        self,
        bundle: AuthorityBundle,
        request: ToolCallRequest,
        registered: RegisteredTool,
        arguments: Mapping[str, Any],
        audit: AuditSink,
        credential: CallCredentialView | None = None,
        authorization: CallAuthorization | None = None,
    ) -> Settlement:
        descriptor = registered.descriptor
        timeout = descriptor.effective_timeout_s
        running = (self._executor(registered, bundle, arguments) if credential is None
                   else self._with_credential(registered, bundle, credential))
        # The call's own task carries its call id (a call-scoped attestation names it) and
        # what authorized it, and no other task does.
        with running_call(request.call_id):
            if authorization is None:
                task: asyncio.Future[object] = asyncio.ensure_future(running)
            else:
                with authorized_as(authorization):
                    task = asyncio.ensure_future(running)
        waiters: set[asyncio.Future[Any]] = {task}
        stop = asyncio.ensure_future(self._cancelled.wait()) if self._cancelled else None
        if stop is not None:
            waiters.add(stop)
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._abandon(bundle, request, descriptor, task, audit, authorization)
            raise
        finally:
            if stop is not None:
                stop.cancel()
        if task not in done:
            if stop is not None and stop in done:
                await self._abandon(bundle, request, descriptor, task, audit, authorization)
                raise RunCancelled()
            # A call that may have had an effect reports a tool that would not stop in its one
            # operator WARNING, so the unknown outcome stays one line an operator can join.
            stopped = await self._stop(task, report=not may_have_effect(descriptor))
            return settlement.timed_out(request, descriptor, timeout, stopped=stopped,
                                          grace=CANCEL_GRACE_S)
        try:
            body = task.result()
        except (RunCancelled, AuthorityRejected):
            raise
        except MemberSafeError as exc:
            # An anticipated failure: the tool vouches that nothing was committed.
            domain = (FailureDomain.CALLER if exc.domain == FailureDomain.CALLER.value
                      else FailureDomain.TOOL)
            return settlement.error(request, descriptor, bounded_message(exc), domain,
                               reason_code=exc.code)
        except PolicyDenied as denied:
            return settlement.denied(request, denied, descriptor)
        except (Exception, asyncio.CancelledError) as exc:
            return settlement.raised(request, descriptor, exc)
        return settlement.classify(request, descriptor, body, self._project)

    async def _with_credential(self, registered: RegisteredTool, bundle: AuthorityBundle,
                               credential: CallCredentialView) -> object:
        """Run a credential-backed tool with its handle; whatever comes back, body or error
        text, is scrubbed of the credential before the pipeline (and its logs) see it."""
        try:
            return credential.scrub(
                await self._executor(registered, bundle, credential.arguments))
        except (RunCancelled, AuthorityRejected, PolicyDenied):
            raise
        except MemberSafeError as exc:
            raise MemberSafeError(str(credential.scrub(str(exc))), code=exc.code,
                                  domain=exc.domain) from None
        except Exception as exc:
            raise ScrubbedToolError(type(exc).__name__,
                                    str(credential.scrub(str(exc)))) from None
        finally:
            credential.close()

    async def _stop(self, task: asyncio.Future[object], *, report: bool = True) -> bool:
        """Cancel a running tool, which releases its sessions and leases (R-291); whether it
        stopped within the grace period. ``report`` logs a tool that did not."""
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
        if not task.done():
            if report:
                log.warning("tool did not stop within %.1fs of cancellation", CANCEL_GRACE_S)
            return False
        if not task.cancelled():
            task.exception()  # retrieved so asyncio does not report it as unhandled
        return True

    async def _abandon(
        self,
        bundle: AuthorityBundle,
        request: ToolCallRequest,
        descriptor: ToolDescriptor,
        task: asyncio.Future[object],
        audit: AuditSink,
        authorization: CallAuthorization | None,
    ) -> None:
        """The turn was cancelled under a running tool: stop it and count it, settle nothing."""
        await self._stop(task)
        self._metrics.record(request.name, descriptor.capability, ToolOutcome.ABANDONED)
        await self._audit_safely(audit, bundle, request, ToolOutcome.ABANDONED, None,
                                 authorization)

    # --- step 10: classification, projection and the result guardrails ---------------

    async def _check_result(
        self,
        bundle: AuthorityBundle,
        request: ToolCallRequest,
        descriptor: ToolDescriptor,
        settled: Settlement,
    ) -> Settlement:
        """The guardrails again, on the projection about to be published (R-070)."""
        if not self._guardrails.checks_results:
            return settled
        result = settled.result
        verdict = await self._guardrails.evaluate_result(GuardrailResult(
            bundle, request, descriptor, result.outcome, result.content))
        # The guardrail judged the text alone, so a canvas it never saw is not shown (the host
        # then withdraws any on-screen claim left in the text, R-278).
        if isinstance(verdict, Redact):
            return replace(settled, result=replace(
                result, content=self._project(verdict.content), canvas=()))
        if not isinstance(verdict, Deny):
            return settled
        log.warning("a result guardrail withheld the result of %s (run call %s, code %s)",
                    request.name, request.call_id, verdict.code)
        reason = redact_text(verdict.reason.strip())[:MAX_MESSAGE_CHARS]
        content = (f"The result of {request.name} was withheld by a safety check"
                   f"{': ' + reason if reason else '.'} Do not call it again for the same "
                   "thing; answer with what you have.")
        if result.may_have_effect:
            content += " It did run, so any change it made stands."
        # The tool ran: its raw result stays in audit only; the model, the member and the
        # journal get the refusal, and the turn goes on as for an error.
        # A failed result keeps its own outcome (a raised write still closes the turn).
        was_ok = result.outcome is ToolOutcome.OK
        withheld = replace(result, content=content, evidence=False, canvas=(),
                           outcome=ToolOutcome.ERROR if was_ok else result.outcome,
                           failure_domain=(FailureDomain.TOOL if was_ok
                                           else result.failure_domain))
        return replace(settled, result=withheld,
                       raw={"result_withheld": verdict.code, "raw": settled.raw},
                       reason_code=verdict.code if was_ok else settled.reason_code,
                       log_failure=was_ok or settled.log_failure)

    def _project(self, body: object) -> str:
        """Redact, serialize and bound a result for the model and the member."""
        if body is None:
            text = ""
        elif isinstance(body, str):
            text = redact_text(body)
        elif isinstance(body, bytes | bytearray):
            text = redact_text(bytes(body).decode("utf-8", errors="replace"))
        else:
            redacted = redact(body)
            try:
                text = json.dumps(redacted, ensure_ascii=False,
                                  default=lambda o: redact_text(str(o)))
            except (TypeError, ValueError):
                text = redact_text(str(redacted))
        limit = self._projection_limit
        if len(text) <= limit:
            return text
        return (f"{text[:limit]}\n[truncated: showing the first {limit} of {len(text)} "
                "characters of this result]")

    # --- bookkeeping -----------------------------------------------------------------------

    async def _finish(
        self, bundle: AuthorityBundle, request: ToolCallRequest, settled: Settlement,
        audit: AuditSink,
    ) -> ToolCallResult:
        result = settled.result
        registered = self._tools.get(request.name)
        if settled.remember and registered is not None:
            self.ledger.record(registered.descriptor, request, result)
        label = request.name if registered is not None else UNKNOWN_TOOL_LABEL
        self._metrics.record(label, result.capability, result.outcome)
        if result.failed and settled.log_failure:
            log_failed_result(
                run_id=bundle.run_id, call_id=request.call_id, tool=label,
                outcome=result.outcome, reason_code=settled.reason_code or "failed",
                domain=result.failure_domain, exit_status=settled.exit_status,
            )
        await self._audit_safely(audit, bundle, request, result.outcome, settled.raw,
                                 settled.authorization)
        return result

    @staticmethod
    async def _audit_safely(
        audit: AuditSink, bundle: AuthorityBundle, request: ToolCallRequest,
        outcome: ToolOutcome, raw: object, authorization: CallAuthorization | None,
    ) -> None:
        # The call has already happened; a failing audit sink must not turn a settled write
        # into an unknown one, so it is reported to operators and the result still returns.
        try:
            await audit.record_tool_call(bundle, request, outcome, raw,
                                         authorization=authorization)
        except Exception:
            log.exception("audit sink failed for tool %s", request.name)
