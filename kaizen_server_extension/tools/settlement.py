"""How a tool call settles: the result the model and member get, and what bookkeeping needs.

The pipeline (``tools/pipeline.py``) decides *whether* a call runs; these builders say what a
call that ran, failed, timed out or was refused settles as — one outcome per invocation, the
failure's domain, whether the turn closes, and the operator record of an unknown outcome
(R-260, R-289, R-362..R-364).
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from kaizen_server_extension.policy.errors import PolicyDenied
from kaizen_server_extension.policy.redaction import redact_text
from kaizen_server_extension.protocol.model_facing import directives_in
from kaizen_server_extension.protocol.tools import (
    Capability,
    FailureDomain,
    ProtocolFailure,
    ToolCallRequest,
    ToolCallResult,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.tools.authorization import CallAuthorization
from kaizen_server_extension.tools.outcomes import advice_for, failure_details
from kaizen_server_extension.tools.types import ToolDescriptor, TrustedBody

log = logging.getLogger("kaizen.tools.pipeline")

MAX_MESSAGE_CHARS = 500
# Bound of the exception chain in an operator log line (spec: request-scoped platform tools).
OPERATOR_DETAIL_BYTES = 2048


def protocol_denial(reason: ProtocolFailure) -> PolicyDenied:
    """The denial of a protocol operation that was not callable when asked for (R-252): a
    policy block whose code is the typed reason, so it closes the turn and is journaled.
    The tool name is model-chosen text, so the message does not echo it."""
    return PolicyDenied(
        reason.value,
        "That artifact step was not available at this point of the turn, so it was not run "
        "and the turn stopped here. Any draft already started was left as it was.")


@dataclass(frozen=True, slots=True)


class Settlement:
    """A result plus what the bookkeeping after it needs to know."""

    result: ToolCallResult
    raw: object = None
    reason_code: str | None = None
    exit_status: int | None = None
    # Whether the ledger remembers it (validated or executed calls, not refusals/denials).
    remember: bool = False
    # A tool that raised is recorded as its outcome, not written to the failed-result log.
    log_failure: bool = True
    # What let the call run, for its audit row; None for a call that never ran.
    authorization: CallAuthorization | None = None


def may_have_effect(descriptor: ToolDescriptor) -> bool:
    return (descriptor.capability is not Capability.READ
            or descriptor.write_category is not WriteCategory.NONE)


def has_substance(body: object) -> bool:
    """Whether a successful body gives the synthesis step something to use."""
    if body is None:
        return False
    if isinstance(body, str | bytes | bytearray | Mapping | list | tuple):
        return len(body) > 0 and not (isinstance(body, str) and not body.strip())
    return True


def operator_detail(exc: BaseException) -> str:
    """The exception chain for an operator log line: credential-shaped values redacted and
    bounded to 2 KB, so a traceback cannot carry a secret or flood the log (R-369)."""
    text = redact_text("".join(traceback.format_exception(exc)).rstrip())
    encoded = text.encode("utf-8")
    if len(encoded) <= OPERATOR_DETAIL_BYTES:
        return text
    marker = " …[truncated]"
    keep = OPERATOR_DETAIL_BYTES - len(marker.encode("utf-8"))
    return encoded[:keep].decode("utf-8", errors="ignore") + marker


def bounded_message(exc: BaseException) -> str:
    text = redact_text(str(exc)) or type(exc).__name__
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"


def classify(request: ToolCallRequest, descriptor: ToolDescriptor, body: object,
             project: Callable[[object], str]) -> Settlement:
    """The settlement of a body the tool returned: ok, or the failure it reports."""
    content = project(body)
    details = failure_details(body)
    effect = may_have_effect(descriptor)
    # Files the tool stored travel beside the projection, as trusted data; they
    # are kept on a failed body too, since a failed program may still have saved some.
    files = body.stored_files if isinstance(body, TrustedBody) else ()
    # So does the rich output the tool moved to the chat canvas; the host materializes it
    # or drops it, and withdraws the payload's on-screen markers when it does.
    canvas = body.canvas if isinstance(body, TrustedBody) else ()
    # Text the body addresses to the model is marked as such, for the publication guard.
    directives = directives_in(body)
    if details is None:
        return Settlement(
            ToolCallResult(call_id=request.call_id, name=request.name,
                           outcome=ToolOutcome.OK, content=content,
                           capability=descriptor.capability,
                           evidence=has_substance(body),
                           may_have_effect=effect, delegated=delegates(descriptor),
                           files=files, canvas=canvas, model_facing=directives),
            raw=body, remember=True,
        )
    failed = error(request, descriptor, content, details.domain, raw=body,
                         reason_code=details.reason_code, exit_status=details.exit_status)
    if not (files or canvas or directives):
        return failed
    return replace(failed, result=replace(failed.result, files=files, canvas=canvas,
                                          model_facing=directives))


def error(
    request: ToolCallRequest,
    descriptor: ToolDescriptor,
    content: str,
    domain: FailureDomain,
    *,
    reason_code: str,
    raw: object = None,
    exit_status: int | None = None,
) -> Settlement:
    advice = advice_for(content, domain)
    if advice:
        content = f"{content}\n\n{advice}"
    return Settlement(
        ToolCallResult(call_id=request.call_id, name=request.name,
                       outcome=ToolOutcome.ERROR, content=content,
                       capability=descriptor.capability, failure_domain=domain,
                       may_have_effect=may_have_effect(descriptor),
                       delegated=delegates(descriptor)),
        raw=raw, reason_code=reason_code, exit_status=exit_status, remember=True,
    )


def raised(request: ToolCallRequest, descriptor: ToolDescriptor,
           exc: BaseException) -> Settlement:
    """A tool that raised: a read's message reaches the model, a write's outcome is unknown."""
    if not may_have_effect(descriptor):
        log.error("tool %s raised (run call %s): %s", request.name, request.call_id,
                  operator_detail(exc))
        # A read cannot have half-completed a change: the model learns the message and
        # the turn goes on.
        settled = error(request, descriptor,
                              f"{request.name} failed: {bounded_message(exc)}",
                              FailureDomain.TOOL, reason_code="raised")
        return replace(settled, log_failure=False)
    # A write without its own error projection: exception text may name an internal host,
    # so the model, the member and the audit row get a fixed sentence, the exception type
    # and a reference; one WARNING carries the same reference and the redacted, bounded
    # exception chain for operators. A tool can commit before it
    # raises, so the outcome is unknown.
    kind = type(exc).__name__
    return unknown_outcome(
        request, descriptor, outcome=ToolOutcome.RAISED, reason_code="raised",
        operator_event=f"raised {kind}", operator_detail=operator_detail(exc),
        failure="failed while running", exception_type=kind,
    )


def timed_out(request: ToolCallRequest, descriptor: ToolDescriptor, timeout: float, *,
              stopped: bool, grace: float) -> Settlement:
    """A tool that outran its timeout (``stopped``: it unwound within ``grace`` seconds)."""
    if may_have_effect(descriptor):
        # A call that may have an effect can have committed before its bound elapsed, so
        # a timeout is the same unknown outcome as a raise and is reported the same way:
        # one WARNING, whose reference also ends the answer and the audit row (R-362,
        # There is no exception text to withhold, only how the stop went.
        how = ("it stopped on cancellation" if stopped else
               f"it did not stop within {grace:.1f}s of cancellation")
        return unknown_outcome(
            request, descriptor, outcome=ToolOutcome.TIMEOUT, reason_code="timeout",
            operator_event=f"timed out after {timeout:g}s", operator_detail=how,
            failure=f"did not finish within {timeout:g} seconds and was stopped",
            facts={"timeout_s": timeout},
        )
    # A read cannot have half-completed a change: the model learns it was stopped and the
    # turn goes on.
    return Settlement(
        ToolCallResult(call_id=request.call_id, name=request.name,
                       outcome=ToolOutcome.TIMEOUT,
                       content=(f"{request.name} did not finish within {timeout:g} seconds "
                                "and was stopped."),
                       capability=descriptor.capability,
                       failure_domain=FailureDomain.TOOL, may_have_effect=False,
                       delegated=delegates(descriptor)),
        reason_code="timeout", remember=True,
    )


def unknown_outcome(
    request: ToolCallRequest,
    descriptor: ToolDescriptor,
    *,
    outcome: ToolOutcome,
    reason_code: str,
    operator_event: str,
    operator_detail: str,
    failure: str,
    exception_type: str | None = None,
    facts: Mapping[str, object] | None = None,
) -> Settlement:
    """A call that may have had an effect ended without saying whether it did (R-364).

    One operator WARNING carries a fresh reference with ``operator_event`` and
    ``operator_detail``; the model and member get the fixed ``failure`` clause, the
    exception type (never its text) and the same reference; the audit row gets that
    content, the reference and ``facts``. The WARNING is the operator record, so the
    content-free failed-result line is not written as well (R-362, R-363)."""
    reference = uuid.uuid4().hex[:12]
    log.warning("write tool %s %s (reference %s, run call %s): %s", request.name,
                operator_event, reference, request.call_id, operator_detail)
    label = f"{exception_type}, reference {reference}" if exception_type else (
        f"reference {reference}")
    content = (f"{request.name} {failure} ({label}), and whether its change was applied "
               "is unknown. Do not retry it; check the current state before anything "
               "else.")
    recorded: dict[str, object] = {"error": content, **(facts or {})}
    if exception_type:
        recorded["exception_type"] = exception_type
    return Settlement(
        ToolCallResult(call_id=request.call_id, name=request.name,
                       outcome=outcome, content=content,
                       capability=descriptor.capability,
                       failure_domain=FailureDomain.TOOL, closes_turn=True,
                       close_reason="ambiguous_write", may_have_effect=True,
                       delegated=delegates(descriptor), reference=reference),
        raw={**recorded, "reference": reference},
        reason_code=reason_code, remember=True, log_failure=False,
    )


def denied(request: ToolCallRequest, refusal: PolicyDenied,
           descriptor: ToolDescriptor | None = None) -> Settlement:
    """A genuine policy block: the only kind of refusal that closes the turn (R-289)."""
    capability = descriptor.capability if descriptor else Capability.UNDECLARED
    # A protocol that was not callable keeps its typed reason on the result, for the
    # journal's ``denied``; other blocks are told apart by ``close_reason``.
    protocol = next((f for f in ProtocolFailure if f.value == refusal.code), None)
    return Settlement(
        ToolCallResult(call_id=request.call_id, name=request.name,
                       outcome=ToolOutcome.ERROR, content=refusal.member_message,
                       capability=capability, failure_domain=FailureDomain.CALLER,
                       closes_turn=True, close_reason=refusal.code, denied=protocol),
        reason_code=refusal.code,
    )


def delegates(descriptor: ToolDescriptor) -> bool:
    """Whether the tool hands work to another agent (its result is delegated evidence)."""
    return bool(descriptor.extra.get("delegates", False))
