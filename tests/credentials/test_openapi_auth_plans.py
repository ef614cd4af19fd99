"""OpenAPI security schemes compile into value-free credential plans: the supported ones
become a plan, a query-string key and unknown or incomplete alternatives do not."""

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
    "host_key": {"type": "apiKey", "in": "header", "name": "Host"},
    "oauth": {"type": "oauth2", "flows": {}},
    "oidc": {"type": "openIdConnect", "openIdConnectUrl": "https://id.example/.well-known"},
    "mtls": {"type": "mutualTLS"},
    "incomplete": {"type": "apiKey", "in": "header"},
}


def _compiled(security: Any) -> tuple[CompiledAuth | None, dict[str, str]]:
    document = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"},
                "paths": {"/x": {"get": {"operationId": "op", "security": security}}},
                "components": {"securitySchemes": SCHEMES}}
    compiled = compile_document(json.dumps(document).encode())
    op = compiled.by_id.get("op")
    return (op.auth if op else None), dict(compiled.omitted)


@pytest.mark.rule("R-386")
@pytest.mark.parametrize(("scheme", "plan"), [
    ("bearer", CompiledAuth("bearer", "bearer")),
    ("basic", CompiledAuth("basic", "basic")),
    ("header_key", CompiledAuth("header_key", "header", "X-Key")),
    ("cookie_key", CompiledAuth("cookie_key", "cookie", "session")),
    ("oauth", CompiledAuth("oauth", "bearer")),
    ("oidc", CompiledAuth("oidc", "bearer")),
    ("mtls", CompiledAuth("mtls", "mtls")),   # a client certificate
])
def test_a_supported_scheme_becomes_a_value_free_plan(scheme: str,
                                                      plan: CompiledAuth) -> None:
    auth, _ = _compiled([{scheme: []}])
    assert auth == plan


@pytest.mark.rule("R-384", "R-385")
@pytest.mark.parametrize("security", [
    [{"query_key": []}],          # a query-string key: the ceiling is off
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
    auth, _ = _compiled([{"query_key": []}, {"digest": []}, {"header_key": []}, {"mtls": []}])
    assert auth == CompiledAuth("header_key", "header", "X-Key")
    anonymous, omitted = _compiled([{"bearer": []}, {}])
    assert anonymous is None and omitted == {}
