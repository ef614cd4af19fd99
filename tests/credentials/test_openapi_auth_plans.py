"""OpenAPI security schemes compile into value-free credential plans: the supported ones
(a query-string key included: the query-auth ceiling is applied at discovery, see
test_openapi_query_auth.py) become a plan, unknown or incomplete alternatives do not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kaizen_server_extension.tools.openapi_compiler import CompiledAuth, compile_document

SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer"},
    "basic": {"type": "http", "scheme": "Basic"},
    "digest": {"type": "http", "scheme": "digest"},
    "header_key": {"type": "apiKey", "in": "header", "name": "X-Key"},
    "cookie_key": {"type": "apiKey", "in": "cookie", "name": "session"},
    "query_key": {"type": "apiKey", "in": "query", "name": "api_key"},
    "query_page": {"type": "apiKey", "in": "query", "name": "page"},
    "host_key": {"type": "apiKey", "in": "header", "name": "Host"},
    "oauth": {"type": "oauth2", "flows": {}},
    "oidc": {"type": "openIdConnect", "openIdConnectUrl": "https://id.example/.well-known"},
    "mtls": {"type": "mutualTLS"},
    "incomplete": {"type": "apiKey", "in": "header"},
}


def _compiled(security: Any, **operation: Any) -> tuple[CompiledAuth | None, dict[str, str]]:
    auth, _, omitted = _alternatives(security, **operation)
    return auth, omitted


def _alternatives(security: Any, **operation: Any) -> tuple[
        CompiledAuth | None, tuple[CompiledAuth, ...], dict[str, str]]:
    document = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
                "paths": {"/x": {"get": {"operationId": "op", "security": security,
                                         **operation}}},
                "components": {"securitySchemes": SCHEMES}}
    compiled = compile_document(json.dumps(document).encode())
    op = compiled.by_id.get("op")
    return ((op.auth, op.auth_alternatives) if op else (None, ())) + (dict(compiled.omitted),)


@pytest.mark.rule("R-386")
@pytest.mark.parametrize(("scheme", "plan"), [
    ("bearer", CompiledAuth("bearer", "bearer")),
    ("basic", CompiledAuth("basic", "basic")),
    ("header_key", CompiledAuth("header_key", "header", "X-Key")),
    ("cookie_key", CompiledAuth("cookie_key", "cookie", "session")),
    ("oauth", CompiledAuth("oauth", "bearer")),
    ("oidc", CompiledAuth("oidc", "bearer")),
    ("mtls", CompiledAuth("mtls", "mtls")),   # a client certificate
    ("query_key", CompiledAuth("query_key", "query", "api_key")),
])
def test_a_supported_scheme_becomes_a_value_free_plan(scheme: str,
                                                      plan: CompiledAuth) -> None:
    auth, _ = _compiled([{scheme: []}])
    assert auth == plan


@pytest.mark.rule("R-385")
@pytest.mark.parametrize("security", [
    [{"digest": []}], [{"incomplete": []}], [{"host_key": []}],
    [{"undeclared": []}],
    [{"bearer": [], "header_key": []}],   # needs both at once: not supported
])
def test_an_unsupported_or_incomplete_alternative_omits_the_operation(security: Any) -> None:
    auth, omitted = _compiled(security)
    assert auth is None and omitted == {"GET /x": "requires authentication no supported "
                                                  "scheme provides"}


@pytest.mark.rule("R-385")
def test_the_first_supported_alternative_wins_and_anonymous_needs_none() -> None:
    auth, alternatives, _ = _alternatives([{"digest": []}, {"query_key": []},
                                           {"header_key": []}, {"mtls": []}])
    assert auth == CompiledAuth("query_key", "query", "api_key")
    # Every supported alternative is kept, in order, for discovery to choose under its
    # ceilings.
    assert alternatives == (auth, CompiledAuth("header_key", "header", "X-Key"),
                            CompiledAuth("mtls", "mtls"))
    anonymous, omitted = _compiled([{"bearer": []}, {}])
    assert anonymous is None and omitted == {}


@pytest.mark.rule("R-384", "R-385")
def test_a_query_key_named_like_a_query_parameter_is_not_an_alternative() -> None:
    parameter = {"name": "page", "in": "query", "schema": {"type": "integer"}}
    # The key would collide with the model's own value: that alternative is dropped ...
    auth, alternatives, _ = _alternatives([{"query_page": []}, {"bearer": []}],
                                          parameters=[parameter])
    assert auth == CompiledAuth("bearer", "bearer") and alternatives == (auth,)
    # ... and when it was the only one, the operation is omitted.
    only, omitted = _compiled([{"query_page": []}], parameters=[parameter])
    assert only is None and omitted == {"GET /x": "requires authentication no supported "
                                                  "scheme provides"}
