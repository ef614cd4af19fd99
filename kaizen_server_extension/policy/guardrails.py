"""The ordered guardrail chain: pluggable checks that allow, deny, or ask for approval.

Decisions come from this shared backend chain, never from the runtime's callback (R-237), and
the chain runs again on the resumed call that carries an approved receipt (R-240). Guardrails
are plain callables so a ``kaizen_register_guardrails`` hook can contribute them exactly as
first-party code does.

Evaluation order is registration order. The first ``Deny`` stops the chain; ``NeedsApproval``
is remembered and the chain keeps going, so a later guardrail can still deny outright. A
guardrail that raises or returns something that is not a verdict denies: a broken check must
fail closed, not open.

The same chain runs again before a result is published (R-070): a guardrail that also has a
``check_result`` method sees the call's bounded, redacted projection and may allow it, withhold
it (``Deny``) or replace it (``Redact``). Result checks run in registration order on the text
the previous one left; the first ``Deny`` stops them, and a broken check withholds the result.
:func:`result_guardrail` turns a plain result-check function into such a guardrail.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kaizen_server_extension.policy.approvals import ApprovalMode
from kaizen_server_extension.policy.declared import DeclaredTool
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolOutcome

log = logging.getLogger("kaizen.policy.guardrails")


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Deny:
    reason: str  # member-safe sentence
    code: str = "guardrail_denied"


@dataclass(frozen=True, slots=True)
class NeedsApproval:
    reason: str


GuardrailVerdict = Allow | Deny | NeedsApproval

ALLOW = Allow()


@dataclass(frozen=True, slots=True)
class GuardrailCall:
    """What a guardrail sees: validated arguments, never the tool's result."""

    bundle: AuthorityBundle
    request: ToolCallRequest
    descriptor: DeclaredTool
    arguments: Mapping[str, Any]
    approval_mode: ApprovalMode


Guardrail = Callable[[GuardrailCall], "GuardrailVerdict | Awaitable[GuardrailVerdict]"]


@dataclass(frozen=True, slots=True)
class Redact:
    """Publish ``content`` instead of the projected result (a member-safe replacement)."""

    content: str
    code: str = "guardrail_redacted"


ResultVerdict = Allow | Deny | Redact


@dataclass(frozen=True, slots=True)
class GuardrailResult:
    """What a result check sees: the projection the model and journal would get, never the
    raw result (which stays in audit)."""

    bundle: AuthorityBundle
    request: ToolCallRequest
    descriptor: DeclaredTool
    outcome: ToolOutcome
    content: str


ResultCheck = Callable[[GuardrailResult], "ResultVerdict | Awaitable[ResultVerdict]"]


@dataclass(frozen=True)
class _ResultOnly:
    check_result: ResultCheck

    def __call__(self, call: GuardrailCall) -> GuardrailVerdict:
        return ALLOW


def result_guardrail(check: ResultCheck) -> Guardrail:
    """A guardrail that allows every call and checks only its result."""
    return _ResultOnly(check)


class GuardrailChain:
    def __init__(self, guardrails: Iterable[Guardrail] = ()) -> None:
        self._guardrails = tuple(guardrails)
        for guardrail in self._guardrails:
            if not callable(guardrail):
                # Refused at start-up, not at the first call it would have silently skipped.
                raise TypeError(f"guardrail {guardrail!r} is not callable")
        checks = [getattr(g, "check_result", None) for g in self._guardrails]
        for guardrail, check in zip(self._guardrails, checks, strict=True):
            if check is not None and not callable(check):
                raise TypeError(f"guardrail {guardrail!r}: check_result is not callable")
        self._result_checks: tuple[ResultCheck, ...] = tuple(c for c in checks if c is not None)

    @property
    def checks_results(self) -> bool:
        """Whether any guardrail checks results (the pipeline skips the stage otherwise)."""
        return bool(self._result_checks)

    @classmethod
    def from_registrations(cls, registrations: Iterable[tuple[str, Any]]) -> GuardrailChain:
        """Build from ``(plugin name, item)`` pairs of ``kaizen_register_guardrails``, in
        plugin order (see ``tools.registry.collect_registrations``)."""
        return cls(item for _plugin, item in registrations)

    def __len__(self) -> int:
        return len(self._guardrails)

    async def evaluate(self, call: GuardrailCall) -> GuardrailVerdict:
        pending: NeedsApproval | None = None
        for guardrail in self._guardrails:
            verdict = await self._run_one(guardrail, call)
            if isinstance(verdict, Deny):
                return verdict
            if isinstance(verdict, NeedsApproval) and pending is None:
                pending = verdict
        return pending if pending is not None else ALLOW

    @staticmethod
    async def _run_one(guardrail: Guardrail, call: GuardrailCall) -> GuardrailVerdict:
        name = getattr(guardrail, "__qualname__", repr(guardrail))
        try:
            verdict = guardrail(call)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception:
            log.exception("guardrail %s raised; denying tool %s", name, call.descriptor.name)
            return Deny("A safety check could not complete, so the call was not run.",
                        code="guardrail_error")
        if not isinstance(verdict, Allow | Deny | NeedsApproval):
            log.error("guardrail %s returned %r; denying", name, type(verdict).__name__)
            return Deny("A safety check could not complete, so the call was not run.",
                        code="guardrail_error")
        return verdict

    async def evaluate_result(self, result: GuardrailResult) -> ResultVerdict:
        """Allow, withhold (``Deny``) or replace (``Redact``) a projected result."""
        current = result
        redacted: Redact | None = None
        for check in self._result_checks:
            verdict = await self._run_result_check(check, current)
            if isinstance(verdict, Deny):
                return verdict
            if isinstance(verdict, Redact):
                redacted = verdict
                current = GuardrailResult(current.bundle, current.request, current.descriptor,
                                          current.outcome, verdict.content)
        return redacted if redacted is not None else ALLOW

    @staticmethod
    async def _run_result_check(check: ResultCheck, result: GuardrailResult) -> ResultVerdict:
        name = getattr(check, "__qualname__", repr(check))
        withheld = Deny("A safety check on this result could not complete, so the result is "
                        "withheld.", code="guardrail_error")
        try:
            verdict = check(result)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception:
            log.exception("result check %s raised; withholding the result of %s", name,
                          result.descriptor.name)
            return withheld
        if not isinstance(verdict, Allow | Deny | Redact) or (
                isinstance(verdict, Redact) and not isinstance(verdict.content, str)):
            log.error("result check %s returned %r; withholding", name, type(verdict).__name__)
            return withheld
        return verdict
