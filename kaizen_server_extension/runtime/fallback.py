"""Member-facing fallback text for a turn that ends without a committed answer (pure).

The one subtle rule (spec: Budgets and the synthesis grant, R-049, R-050): ask the member to
check the activity before retrying only when a call could have changed something — a write or
sensitive tool, a tool that declared no capability, a delegation to another agent (whose own
tools the parent run cannot see), or any call that failed (a failed delegation reports nothing
of what its agent did). A run whose calls were all read-only, all completed and none delegated
drops the suggestion.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kaizen_server_extension.protocol.model_facing import ECHO_REASON
from kaizen_server_extension.protocol.tools import Capability, ToolCallResult

_EFFECTFUL = frozenset({Capability.WRITE, Capability.SENSITIVE, Capability.UNDECLARED})

CHECK_ACTIVITY = (
    "Some of the actions taken may have changed something, so please check the activity "
    "before trying again."
)

_MESSAGES: dict[str, str] = {
    "answer_unavailable": "I couldn't produce an answer to this request with the tools I have.",
    "empty_response": (
        "I gathered information for this request but couldn't write an answer from it."
    ),
    "non_delivery": (
        "The tools ran, but no answer was produced, so this request was not completed."
    ),
    "correction_exhausted": "I couldn't produce an acceptable answer to this request.",
    "tool_discovery_exhausted": (
        "I searched for a suitable tool four times without being able to use one, so I stopped "
        "here. The capability this request needs may not be available to this agent."
    ),
    "required_tool_not_called": (
        "This request required a specific tool, and I didn't manage to call it, so the request "
        "was not completed."
    ),
    "staged_protocol_unavailable": (
        "I tried to continue writing an artifact with a step that wasn't available to me at "
        "that point, so I stopped here instead of trying again. Any draft already started was "
        "left as it was."
    ),
    "inactivity_budget_exhausted": "This turn stopped because it went quiet for too long.",
    "authority_rejected": "This turn was stopped because its authorization no longer holds.",
}
_DEFAULT = "Something went wrong and this turn ended without an answer."
#: How much of a failed call's own error text the plain statement quotes.
MAX_QUOTED_ERROR = 300


def failure_statement(results: Iterable[ToolCallResult]) -> str:
    """A plain, member-facing sentence on the last failed call of the run: which tool
    failed and, when its result names one, the error (run_code's ``error.name: value``).
    Used in place of an answer that could only have repeated model-facing text."""
    failed = [r for r in results if r.failed]
    if not failed:
        return "I couldn't write an answer for this request, so it was not completed."
    last = failed[-1]
    what = _error_of(last.content)
    subject = "The code I ran" if last.name == "run_code" else f"The {last.name} call"
    if what:
        return f"{subject} failed with {what}, so I could not complete this request."
    return f"{subject} failed, so I could not complete this request."


def _error_of(content: str) -> str:
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("name"), str):
        value = str(error.get("value") or "").strip().splitlines()
        text = error["name"] + (f": {value[0]}" if value else "")
    elif body.get("status") in ("timeout", "restarted"):
        text = "the time limit"
    elif isinstance(body.get("message"), str):
        text = body["message"].strip()
    else:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= MAX_QUOTED_ERROR else text[:MAX_QUOTED_ERROR] + "…"


def suggests_activity_check(results: Iterable[ToolCallResult]) -> bool:
    """True when any call could have changed something (R-049); False for all-read,
    all-completed, non-delegating runs and for runs that called nothing (R-050)."""
    return any(
        result.may_have_effect
        or result.delegated
        or result.failed
        or result.capability in _EFFECTFUL
        for result in results
    )


def fallback_message(reason: str, results: Iterable[ToolCallResult]) -> str:
    """The sentence(s) a member sees for a turn that settled without an answer; a failed
    call's operator reference ends it, so the member can quote it to an operator (R-362)."""
    results = tuple(results)
    if reason == ECHO_REASON:
        text = failure_statement(results)
    else:
        text = _MESSAGES.get(reason, _DEFAULT)
    if suggests_activity_check(results):
        text = f"{text} {CHECK_ACTIVITY}"
    references = [r.reference for r in results if r.failed and r.reference]
    if references:
        text = f"{text} Reference: {', '.join(dict.fromkeys(references))}."
    return text
