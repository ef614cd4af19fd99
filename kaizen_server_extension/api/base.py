"""The base of every Kaizen handler: authentication, member, errors, bodies."""

from __future__ import annotations

import json
import logging
import re
import uuid
from itertools import accumulate
from typing import Any, TypeVar

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import StatementError
from tornado import web

from kaizen_server_extension.api.params import allow_header, refuse_undeclared_method
from kaizen_server_extension.context import KaizenContext
from kaizen_server_extension.protocol.errors import (
    BadRequest,
    MemberError,
    SchemaViolation,
    TooLarge,
)
from kaizen_server_extension.store.storable import (
    UNSTORABLE,
    UnstorableText,
    unstorable_field,
)

log = logging.getLogger("kaizen.api")

Body = TypeVar("Body", bound=BaseModel)

AUTH_RESOURCE = "kaizen"

#: Arrays and objects a request body may nest. No body of this API needs more than a few;
#: Python's parser would recurse (and fail as a server error) long before a deep body ends.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``raw`` nests arrays and objects deeper than ``limit``, found without parsing:
    strings are skipped (a bracket inside one is text), then the depth is the running count of
    the brackets left. Linear in the body, and free for a body with few brackets at all."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", raw).translate(None, delete=_NOT_BRACKETS)
    steps = (1 if c in b"[{" else -1 for c in brackets)
    return max(accumulate(steps), default=0) > limit


def whole_number(value: Any) -> Any:
    """JSON has one number type: 2.0 is the integer 2 (JSON Schema says so too), which
    pydantic's strict mode would refuse. Anything else is left to the field's own check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


async def admit_member(handler: JupyterHandler, kaizen: KaizenContext, user: Any,
                       action: str) -> None:
    """The Jupyter authorizer's word on ``action`` over Kaizen's resource (403 when it says
    no), then the member's row, created the first time this process sees them."""
    if not handler.authorizer.is_authorized(handler, user, action, AUTH_RESOURCE):
        raise web.HTTPError(403)
    member = user.username
    if member not in kaizen.known_members:
        await kaizen.store.members.ensure(member, user.display_name or member)
        kaizen.known_members.add(member)


class KaizenHandler(APIHandler):
    """Authenticated JSON handler. XSRF is enforced by jupyter_server for cookie clients."""

    auth_resource = AUTH_RESOURCE
    #: Refuse a method the route does not have before anything else (405); a handler whose
    #: existence must not show (admin routes) refuses after its own check instead.
    refuse_methods_first = True

    @property
    def kaizen(self) -> KaizenContext:
        ctx: KaizenContext = self.settings["kaizen"]
        return ctx

    def check_xsrf_cookie(self) -> None:
        # Say "who are you" before "where is your XSRF token": an anonymous write is a 401.
        if hasattr(self, "_jupyter_current_user") and self._jupyter_current_user is None:
            raise web.HTTPError(401)
        super().check_xsrf_cookie()

    async def prepare(self) -> None:  # type: ignore[override]
        if self.refuse_methods_first:
            refuse_undeclared_method(self)
        await super().prepare()
        user = self.current_user
        if user is None:
            raise web.HTTPError(401)
        action = "read" if self.request.method in ("GET", "HEAD", "OPTIONS") else "write"
        await admit_member(self, self.kaizen, user, action)
        if self._finished:
            return
        self.check_route()
        self._refuse_unstorable_request()

    def check_route(self) -> None:
        """Whether this member may know the route exists at all (admin routes: 404 to
        everyone else); runs before anything about the request itself is answered."""

    def _refuse_unstorable_request(self) -> None:
        """A path segment or query value the store could not hold is refused before anything
        reads or writes it (store/storable.py): 422 ``unstorable_text`` naming where."""
        for value in (*self.path_args, *self.path_kwargs.values()):
            if isinstance(value, str) and UNSTORABLE.search(value):
                raise UnstorableText("path")
        for name, values in self.request.query_arguments.items():
            for raw in values:
                if b"\x00" in raw:
                    raise UnstorableText(name)

    @property
    def member(self) -> str:
        name: str = self.current_user.username
        return name

    def body_bytes(self, limit: int) -> bytes:
        body: bytes = self.request.body or b""
        if len(body) > limit:
            raise TooLarge("The request body is too large.", code="body_too_large")
        return body

    def parse_body(self, model: type[Body], *, limit: int = 1024 * 1024) -> Body:
        """Malformed JSON is 400, and so is JSON nested deeper than ``MAX_JSON_DEPTH`` (checked
        before parsing); a body that breaks the schema is 422 (API.md)."""
        raw = self.body_bytes(limit)
        if json_too_deep(raw):
            raise BadRequest(f"The request body nests arrays or objects deeper than "
                             f"{MAX_JSON_DEPTH} levels.", code="json_too_deep")
        try:
            data = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("The request body is not valid JSON.",
                             code="malformed_json") from None
        # U+0000 or an unpaired surrogate (a JSON "\\ud800" escape) cannot be stored on
        # either database: refused here naming the field, nothing written (store/storable.py).
        field = unstorable_field(data)
        if field is not None:
            raise UnstorableText(field)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise SchemaViolation(_describe(exc), code="schema_violation") from None

    def write_json(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        exc = exc_info[1] if exc_info else None
        if isinstance(exc, StatementError) and isinstance(exc.orig, MemberError):
            exc = exc.orig  # a column type's refusal (store/storable.py), not a fault
        self.set_header("Content-Type", "application/json")
        allow_header(self, status_code)
        if isinstance(exc, MemberError):
            self.set_status(exc.status)
            self.finish(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
            return
        if isinstance(exc, web.HTTPError) and status_code < 500:
            code, message = _HTTP_ERRORS.get(status_code, ("bad_request", "Bad request."))
            self.finish(json.dumps({"error": {"code": code, "message": message}}))
            return
        reference = uuid.uuid4().hex[:12]
        log.error("kaizen request failed (ref %s)", reference, exc_info=exc_info)
        self.finish(json.dumps({"error": {
            "code": "internal_error",
            "message": f"Something went wrong on the server (reference {reference}).",
        }}))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # Member errors and 4xx are expected outcomes, not faults; a 5xx is logged exactly
        # once, with its reference, by write_error.
        return


_HTTP_ERRORS = {
    400: ("bad_request", "Bad request."),
    401: ("unauthenticated", "Authentication is required."),
    403: ("forbidden", "You are not allowed to do that."),
    404: ("not_found", "Not found."),
    405: ("method_not_allowed", "That method is not allowed here."),
}


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "The request does not match the schema (" + "; ".join(parts) + ")."
