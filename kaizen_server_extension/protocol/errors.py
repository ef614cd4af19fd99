"""Errors whose message is safe to show: to the member who caused them (STYLE.md), to the model.

``MemberError`` and its subclasses are REST answers (status, code, sentence). A tool raises
``MemberSafeError`` for an anticipated failure the model may repair. ``RunCancelled`` tells the
controller the run is over."""

from __future__ import annotations

from typing import ClassVar


class MemberError(Exception):
    """An error with a stable snake_case ``code`` and a member-safe sentence."""

    status: ClassVar[int] = 400
    default_code: ClassVar[str] = "bad_request"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code


class BadRequest(MemberError):
    status = 400
    default_code = "bad_request"


class NotFound(MemberError):
    """Also what another member's resource looks like: never 403 (API.md)."""

    status = 404
    default_code = "not_found"


class Conflict(MemberError):
    status = 409
    default_code = "conflict"


class TooLarge(MemberError):
    status = 413
    default_code = "too_large"


class SchemaViolation(MemberError):
    status = 422
    default_code = "schema_violation"


class UnstorableText(SchemaViolation):
    """A value holds U+0000 or an unpaired surrogate, which neither database can store as
    text (store/storable.py): refused, nothing written (422)."""

    default_code = "unstorable_text"

    def __init__(self, field: str | None = None) -> None:
        where = f"The field {field!r}" if field else "A text value"
        super().__init__(f"{where} holds a character that cannot be stored (U+0000 or an "
                         "unpaired surrogate); nothing was saved.")
        self.field = field


class Forbidden(MemberError):
    """Only for actions on a resource the member can already see (e.g. non-owner edits)."""

    status = 403
    default_code = "forbidden"


class MemberSafeError(Exception):
    """A tool's anticipated failure, whose message is safe to hand to the model and member."""

    def __init__(self, message: str, *, code: str = "tool_error",
                 domain: str = "tool") -> None:
        super().__init__(message)
        self.code = code
        self.domain = domain


class RunCancelled(Exception):
    """The run was cancelled (member stop or inactivity budget); nothing more is settled."""
