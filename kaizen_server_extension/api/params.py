"""Path and query parameters: the route patterns and the one parser of integers (API.md).

Route patterns are ASCII: a path segment that is not one of them is not a route, so it is the
same JSON 404 as any unknown path (``UnknownPathHandler``), before any handler runs. Integers
are parsed here and only here: ASCII digits (``str.isdigit()`` and ``int()`` also take other
scripts' digits, and superscripts that ``int()`` then refuses), within explicit bounds, so
nothing out of range reaches the database (a sequence past a 64-bit integer is a 400, not a
driver overflow).
"""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import JupyterHandler
from tornado import web

from kaizen_server_extension.protocol.errors import BadRequest

#: Every id the store issues (uuid4 hex), an agent id ([a-z0-9][a-z0-9_.-]*), a notice's
#: resource id: letters, digits, ``_ . -``, starting with a letter or digit.
ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
#: A scheduled task's id (api/tasks.py).
TASK_ID = r"[A-Za-z0-9_-]{1,64}"
#: A tool name in a route (registry names, and ``server:tool`` names of configured servers).
TOOL = r"[A-Za-z0-9_.:-]{1,200}"
#: A member name is the identity provider's, not ours: any characters but ``/``; bounded on
#: its percent-encoded form (200 characters of up to 4 UTF-8 bytes, 3 characters a byte).
MEMBER = r"[^/]{1,2400}"
#: A version or an ordinal in a route: a short ASCII token (no ``%``, so nothing percent-encoded
#: such as a superscript digit), which ``path_int`` then takes only when it is ASCII digits in
#: range: ``x`` or ``-1`` is the route's own 400, not an unknown path.
NUMBER = r"[A-Za-z0-9_.+-]{1,12}"

MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")


def query_value(handler: web.RequestHandler, name: str) -> str | None:
    """A query parameter exactly as sent: tornado's ``get_query_argument`` turns control
    characters into spaces and strips them, so ``?after=%1B7`` would read as 7. Given more
    than once, or not UTF-8, is 400 ``invalid_query``."""
    values = handler.request.query_arguments.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"Query parameter {name!r} is given more than once.",
                         code="invalid_query")
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"Query parameter {name!r} is not UTF-8.",
                         code="invalid_query") from None


def parse_int(raw: str, *, minimum: int, maximum: int) -> int | None:
    """``raw`` as an int when it is 1-19 ASCII digits within ``[minimum, maximum]``; else None."""
    if not _DIGITS.fullmatch(raw):
        return None
    value = int(raw)
    return value if minimum <= value <= maximum else None


def query_int(raw: str | None, name: str, fallback: int, *, minimum: int,
              maximum: int = MAX_INT64) -> int:
    """A query parameter that is an integer: absent is ``fallback``, anything else that is not
    an ASCII integer within the bounds is 400 ``invalid_query``."""
    if raw is None:
        return fallback
    value = parse_int(raw, minimum=minimum, maximum=maximum)
    if value is None:
        raise BadRequest(f"Query parameter {name!r} must be an integer from {minimum} to "
                         f"{maximum}.", code="invalid_query")
    return value


def path_int(raw: str, *, minimum: int, maximum: int, message: str, code: str) -> int:
    """A path segment that is an integer, else 400 with ``code``."""
    value = parse_int(raw, minimum=minimum, maximum=maximum)
    if value is None:
        raise BadRequest(message, code=code)
    return value


def integer_schema(minimum: int, maximum: int) -> dict[str, Any]:
    """The OpenAPI schema of an integer parameter parsed with these bounds."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


def id_schema() -> dict[str, Any]:
    """The OpenAPI schema of an ``ID`` path parameter."""
    return {"type": "string", "pattern": f"^{ID}$"}


#: The schema of each path parameter by name, as its route pattern and parser take it: the
#: OpenAPI document (``openapi.py``) gives every path parameter its schema from here.
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    **{name: id_schema() for name in (
        "conversation_id", "run_id", "agent_id", "approval_id", "notification_id",
        "artifact_id", "proposal_id", "collection_id", "project_id", "document_id",
        "source_id", "request_id")},
    "task_id": {"type": "string", "pattern": f"^{TASK_ID}$"},
    "tool": {"type": "string", "pattern": f"^{TOOL}$"},
    # Any name but "/" (the identity provider's); one that is no member is a 404 or 422.
    "member": {"type": "string", "minLength": 1, "maxLength": 200,
               "pattern": "^[^/\\s\\x00-\\x1f\\x7f]+$"},
    "version": integer_schema(1, MAX_INT32),
}


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


_ALLOWED: dict[type[web.RequestHandler], tuple[str, ...]] = {}


def allowed_methods(handler: type[web.RequestHandler]) -> tuple[str, ...]:
    """The methods ``handler`` implements (OPTIONS is Jupyter's CORS answer on API handlers)."""
    allowed = _ALLOWED.get(handler)
    if allowed is None:
        allowed = _ALLOWED[handler] = tuple(
            m for m in _METHODS
            if getattr(handler, m.lower(), None) is not getattr(web.RequestHandler, m.lower()))
    return allowed


def refuse_undeclared_method(handler: web.RequestHandler) -> None:
    """405 for a method the route does not have, before anything else runs (authentication,
    the member's first-visit row): the ``Allow`` header is set by ``allow_header``."""
    if handler.request.method not in allowed_methods(type(handler)):
        raise web.HTTPError(405)


def allow_header(handler: web.RequestHandler, status_code: int) -> None:
    """On a 405, say which methods the route has (RFC 9110: Allow is required there)."""
    if status_code == 405:
        handler.set_header("Allow", ", ".join(allowed_methods(type(handler))))


NOT_FOUND = json.dumps({"error": {"code": "not_found", "message": "Not found."}})


class UnknownPathHandler(JupyterHandler):
    """Any path under the API that no route matches, whatever the method: the usual JSON 404
    (not Jupyter's HTML page), to everyone, so an unknown path, an id outside its pattern and
    a route this server does not have (R-140) all answer alike."""

    # Whatever the method (TRACE and CONNECT included): there is nothing here to allow.
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS", "TRACE",
                         "CONNECT")

    def check_xsrf_cookie(self) -> None:
        return  # nothing here acts; every request is answered 404

    async def prepare(self) -> None:  # type: ignore[override]
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        self.finish(NOT_FOUND)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        self.finish(NOT_FOUND)

    @allow_unauthenticated
    def _answered(self, *args: Any) -> None:
        """Never reached: ``prepare`` answered (Jupyter asks every method for its auth)."""

    get = head = post = delete = patch = put = options = trace = connect = _answered
