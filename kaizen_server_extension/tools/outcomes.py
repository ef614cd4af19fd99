"""Whether a call failed, and whose failure it was: the runtime's decision, not the tool's.

A tool server can report failure as an ordinary successful value; Kaizen reads the body as
well as the envelope (R-274, R-275). A failure the tool relays on behalf of its caller (a user
program's traceback) is the caller's: it never counts towards the tool's health and is exempt
from every text-matching rule (R-271, R-272).

Body members this module understands (top level only — a listing whose *items* failed is not a
failed call):

* ``error`` truthy, ``errors`` non-empty; ``isError``/``is_error`` true (MCP-style envelopes);
* ``status`` / ``state`` / ``outcome`` in :data:`FAILED_VOCABULARY`;
* ``success`` / ``ok`` exactly false;
* ``failure_domain`` (``"caller"`` or ``"tool"``), ``exit_status`` / ``exit_code`` /
  ``returncode``, and ``code`` / ``reason`` (or ``error.code``) for the reason code.

JSON text — a whole string body, or ``{"type": "text", "text": ...}`` content blocks — is
parsed up to :data:`MAX_JSON_TEXT_CHARS`; anything larger or malformed is read as plain text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kaizen_server_extension.protocol.tools import FailureDomain

FAILED_VOCABULARY = frozenset({
    "error", "errored", "failed", "failure", "fail", "fatal", "exception", "aborted", "abort",
    "cancelled", "canceled", "rejected", "denied", "timeout", "timed_out", "unsuccessful",
    "crashed", "killed",
})
MAX_JSON_TEXT_CHARS = 1_000_000
_STATUS_KEYS = ("status", "state", "outcome")
_FLAG_KEYS = ("success", "ok")
_ENVELOPE_ERROR_KEYS = ("isError", "is_error")
_EXIT_KEYS = ("exit_status", "exit_code", "returncode")
_REASON_CODE = re.compile(r"^[a-z0-9][a-z0-9_.\-]{0,63}$")


@dataclass(frozen=True, slots=True)
class FailureDetails:
    """Content-free facts about a failed body: safe to log (R-268)."""

    reason_code: str
    domain: FailureDomain = FailureDomain.TOOL
    exit_status: int | None = None


def _norm(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    return value.strip().lower().replace("-", "_").replace(" ", "_")


def _parse_json_text(text: str) -> object | None:
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[" or len(stripped) > MAX_JSON_TEXT_CHARS:
        return None
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return None


def _members_report(body: Mapping[object, object]) -> str | None:
    """The reason the mapping's own members report failure, or None."""
    if any(body.get(k) is True for k in _ENVELOPE_ERROR_KEYS):
        return "envelope_error"
    if body.get("error"):
        return "body_error"
    errors = body.get("errors")
    if isinstance(errors, Sequence) and not isinstance(errors, str) and len(errors) > 0:
        return "body_errors"
    for key in _STATUS_KEYS:
        if _norm(body.get(key)) in FAILED_VOCABULARY:
            return f"body_{key}_failed"
    for key in _FLAG_KEYS:
        flag = body.get(key)
        if flag is False or _norm(flag) == "false":
            return f"body_{key}_false"
    return None


def _failure_mapping(body: object) -> Mapping[object, object] | None:
    """The mapping whose own members report failure: the body, its JSON text, or one of its
    JSON text content blocks. None when nothing in the body reports failure."""
    if isinstance(body, bytes | bytearray):
        body = bytes(body).decode("utf-8", errors="replace")
    if isinstance(body, str):
        body = _parse_json_text(body)
    if isinstance(body, Mapping):
        if _members_report(body):
            return body
        body = body.get("content")
    if isinstance(body, Sequence) and not isinstance(body, str):
        for block in body:
            if isinstance(block, Mapping) and block.get("type") == "text":
                text = block.get("text")
                parsed = _parse_json_text(text) if isinstance(text, str) else None
                if isinstance(parsed, Mapping) and _members_report(parsed):
                    return parsed
    return None


def failure_reason(body: object) -> str | None:
    """Why ``body`` reports failure (a content-free code), or None when it does not."""
    found = _failure_mapping(body)
    return _members_report(found) if found is not None else None


def reports_failure(body: object) -> bool:
    """A body that says it failed is a failure, whatever the envelope says (R-274)."""
    return _failure_mapping(body) is not None


def failure_domain(body: object) -> FailureDomain:
    """Whose failure a failed body reports: the caller's only when the tool says so."""
    details = failure_details(body)
    return details.domain if details is not None else FailureDomain.TOOL


def failure_details(body: object) -> FailureDetails | None:
    """Loggable facts of a failed body; None when the body does not report failure."""
    found = _failure_mapping(body)
    if found is None:
        return None
    reason = _members_report(found) or "body_failed"
    code = found.get("code") or found.get("reason")
    error = found.get("error")
    if code is None and isinstance(error, Mapping):
        code = error.get("code")
    exit_status = next(
        (v for k in _EXIT_KEYS if isinstance(v := found.get(k), int) and not isinstance(v, bool)),
        None,
    )
    # A tool-chosen code is logged only when it looks like a code, never free text.
    reason_code = code if isinstance(code, str) and _REASON_CODE.match(code) else reason
    domain = (FailureDomain.CALLER if _norm(found.get("failure_domain")) == "caller"
              else FailureDomain.TOOL)
    return FailureDetails(reason_code, domain, exit_status)


# --- Text-matching advice: only for the tool's own failures --------------------------------

_ADVICE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(timed? ?out|timeout|deadline exceeded)\b"),
     "The tool ran out of time; a narrower request may finish."),
    (re.compile(r"(?i)\b(rate.?limit\w*|too many requests|429)\b"),
     "The tool is being rate-limited; try again later or use another tool."),
    (re.compile(r"(?i)\b(permission denied|unauthori[sz]ed|forbidden|expired (token|credential)"
                r"|401|403)\b"),
     "The tool's access was refused; the member may need to re-authorize it."),
)


def advice_for(message: str, domain: FailureDomain) -> str | None:
    """Advice the runtime adds to a failure message it recognizes.

    A relayed caller failure gets none, whatever its text says: "PermissionError: permission
    denied" from a member's own script is not an expired credential (R-272).
    """
    if domain is FailureDomain.CALLER:
        return None
    for pattern, advice in _ADVICE:
        if pattern.search(message):
            return advice
    return None
