"""Small builders for the OpenAPI fragments each route module contributes.

Every ``*_openapi()`` function answers ``(paths, component schemas)`` for ``api/openapi.py``;
these builders keep those fragments in one shape. Each module keeps its own error wording
(what a 404 means differs between routes), passed to :func:`error_answers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSON = "application/json"
ERROR: dict[str, str] = {"$ref": "#/components/schemas/Error"}


def ref(name: str) -> dict[str, str]:
    """A reference to a component schema."""
    return {"$ref": f"#/components/schemas/{name}"}


def answer(description: str, schema: Mapping[str, Any], status: int | str = 200
           ) -> dict[str, Any]:
    """One JSON response, keyed by its status."""
    return {str(status): {"description": description, "content": {JSON: {"schema": schema}}}}


def body(name: str, *, required: bool = True) -> dict[str, Any]:
    """A request body of the named component schema."""
    return {"required": required, "content": {JSON: {"schema": ref(name)}}}


def error_answers(text: Mapping[int, str], *codes: int) -> dict[str, Any]:
    """The error responses of an authenticated operation: 401 always, then ``codes``, each
    described by the module's own ``text`` and answering the shared Error body."""
    return {str(code): {"description": text[code], "content": {JSON: {"schema": ERROR}}}
            for code in (401, *codes)}


def operation(summary: str, op_id: str, responses: dict[str, Any], *,
              params: list[dict[str, Any]] | None = None,
              body_schema: str | None = None) -> dict[str, Any]:
    """An operation object; ``body_schema`` names a required JSON body's component."""
    out: dict[str, Any] = {"summary": summary, "operationId": op_id, "responses": responses}
    if params:
        out["parameters"] = params
    if body_schema:
        out["requestBody"] = body(body_schema)
    return out


def path_param(name: str, schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A required path parameter (``api/openapi.py`` fills the route's own pattern in)."""
    return {"name": name, "in": "path", "required": True,
            "schema": dict(schema) if schema is not None else {"type": "string"}}
