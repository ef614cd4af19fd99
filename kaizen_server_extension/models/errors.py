"""Classify provider failures into content-free :class:`ModelStepError` codes.

Every code comes from the fixed vocabulary below, so no provider response text and no
credential can ever travel in an error. Only structured fields of an error body
(``code``, ``type``, ``param``) are *inspected* to pick a finer code; they are never copied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kaizen_server_extension.protocol.model import ModelStepError

# Deterministic: replaying the same request cannot succeed.
INVALID_REQUEST: Final = "provider_invalid_request"
MODEL_NOT_FOUND: Final = "provider_model_not_found"
ENDPOINT_NOT_FOUND: Final = "provider_endpoint_not_found"
MISCONFIGURED: Final = "provider_misconfigured"
TOOL_SCHEMA_REJECTED: Final = "provider_tool_schema_rejected"
AUTH: Final = "provider_auth"
UNEXPECTED_STATUS: Final = "provider_unexpected_status"
# Transient: a bounded pre-commit retry may succeed.
RATE_LIMITED: Final = "provider_rate_limited"
UNAVAILABLE: Final = "provider_unavailable"
TIMEOUT: Final = "provider_timeout"
CONNECT_FAILED: Final = "provider_connect_failed"
STREAM_INTERRUPTED: Final = "provider_stream_interrupted"
MALFORMED_RESPONSE: Final = "provider_malformed_response"
STREAM_ERROR: Final = "provider_stream_error"

DETERMINISTIC_CODES: Final = frozenset(
    {
        INVALID_REQUEST,
        MODEL_NOT_FOUND,
        ENDPOINT_NOT_FOUND,
        MISCONFIGURED,
        TOOL_SCHEMA_REJECTED,
        AUTH,
        UNEXPECTED_STATUS,
    }
)
RETRYABLE_CODES: Final = frozenset(
    {
        RATE_LIMITED,
        UNAVAILABLE,
        TIMEOUT,
        CONNECT_FAILED,
        STREAM_INTERRUPTED,
        MALFORMED_RESPONSE,
        STREAM_ERROR,
    }
)
ALL_CODES: Final = DETERMINISTIC_CODES | RETRYABLE_CODES


def step_error(code: str) -> ModelStepError:
    return ModelStepError(code, retryable=code in RETRYABLE_CODES)


def classify_status(status: int, body: Any = None) -> ModelStepError:
    """A non-2xx HTTP answer; ``body`` is the parsed JSON error body when there was one."""
    if status in (401, 403):
        return step_error(AUTH)
    if status == 429:
        return step_error(RATE_LIMITED)
    if status == 408:
        return step_error(TIMEOUT)
    if status >= 500:
        return step_error(UNAVAILABLE)
    if status == 404 and not _looks_like_api_error(body):
        # A bare 404 means the URL is wrong (e.g. base_url without /v1), not the model.
        return step_error(ENDPOINT_NOT_FOUND)
    if 400 <= status < 500:
        return step_error(_refine_invalid_request(status, _error_fields(body)))
    return step_error(UNEXPECTED_STATUS)


def classify_stream_error(error: Any) -> ModelStepError:
    """An ``{"error": ...}`` object sent inside an HTTP 200 stream (e.g. by routers)."""
    fields = _error_fields({"error": error})
    status = fields.get("status")
    if isinstance(status, int):
        return classify_status(status, {"error": error})
    refined = _refine_invalid_request(400, fields)
    if refined != INVALID_REQUEST:
        return step_error(refined)
    if fields.get("code") in _DETERMINISTIC_ERROR_CODES:
        return step_error(INVALID_REQUEST)
    return step_error(STREAM_ERROR)


_MODEL_ERROR_CODES: Final = frozenset({"model_not_found", "invalid_model", "model_not_available"})
_DETERMINISTIC_ERROR_CODES: Final = frozenset(
    {"invalid_request_error", "invalid_request", "bad_request", "context_length_exceeded"}
)


def _refine_invalid_request(status: int, fields: Mapping[str, Any]) -> str:
    code = fields.get("code")
    param = fields.get("param")
    if status == 404 or code in _MODEL_ERROR_CODES or param == "model":
        return MODEL_NOT_FOUND
    if (isinstance(param, str) and param.startswith(("tools", "tool_choice"))) or (
        isinstance(code, str) and "tool" in code
    ):
        return TOOL_SCHEMA_REJECTED
    return INVALID_REQUEST


def _looks_like_api_error(body: Any) -> bool:
    return isinstance(body, Mapping) and ("error" in body or body.get("object") == "error")


def _error_fields(body: Any) -> dict[str, Any]:
    """The structured fields of an error body, for inspection only.

    Understands OpenAI's ``{"error": {...}}`` and vLLM's top-level ``{"object": "error"}``.
    """
    if not isinstance(body, Mapping):
        return {}
    error = body if body.get("object") == "error" else body.get("error")
    if not isinstance(error, Mapping):
        return {}
    fields: dict[str, Any] = {}
    for key in ("code", "type", "param"):
        value = error.get(key)
        if isinstance(value, str):
            fields[key] = value.strip().lower()
    code = error.get("code")
    if isinstance(code, int) and not isinstance(code, bool):
        fields["status"] = code
    return fields
