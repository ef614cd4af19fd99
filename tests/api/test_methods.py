"""Undeclared methods (issue 17): every route answers a method it does not have with 405 and an
``Allow`` header naming exactly the methods its OpenAPI operations declare (plus Jupyter's
OPTIONS), before authentication or anything else runs; a path no route takes is the JSON 404."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support.server import ServerProcess, json_of

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "TRACE")


def _concrete(path: str) -> str:
    # "1" is both an id and a number: every path parameter's pattern takes it.
    return re.sub(r"\{[^}]+\}", "1", path).removeprefix("/kaizen/api/")


def _admin(path: str) -> bool:
    return path.startswith("/kaizen/api/admin/")


@pytest.mark.parametrize("member", ["dave", "alice", None])
def test_every_route_refuses_an_undeclared_method_with_allow(server: ServerProcess,
                                                             member: str | None) -> None:
    """dave is the admin; to anyone else the admin routes do not exist (next test)."""
    with server.client("alice") as alice:
        paths = json_of(alice.get("openapi.json"))["paths"]
    checked = 0
    with server.client(member) as client:
        for path, item in paths.items():
            if _admin(path) and member != "dave":
                continue
            declared = {m.upper() for m in item if m in {"get", "post", "put", "patch",
                                                         "delete"}}
            for method in METHODS:
                if method in declared:
                    continue
                response = client.request(method, _concrete(path))
                assert response.status_code == 405, (method, path, response.text[:200])
                allowed = {m.strip() for m in response.headers["allow"].split(",")}
                assert allowed - {"OPTIONS"} == declared, (method, path, allowed)
                if method != "HEAD":
                    assert json_of(response)["error"]["code"] == "method_not_allowed"
                checked += 1
    assert checked > 200


def test_to_a_non_admin_the_admin_routes_are_unknown_paths_whatever_the_method(
        server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client(None) as anonymous:
        unknown = alice.post("no/such/thing")
        for path in ("admin/tool-policies", "admin/tool-policies/run_code/bob"):
            for method in METHODS:
                response = alice.request(method, path)
                assert response.status_code == 404, (method, path, response.text[:200])
                assert "allow" not in response.headers
                if method != "HEAD":
                    assert response.content == unknown.content
                # Without a token: who are you, before anything about the route.
                assert anonymous.request(method, path).status_code == 401, (method, path)


def test_an_unknown_path_is_404_whatever_the_method(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        for method in METHODS:
            response = alice.request(method, "no/such/thing")
            assert response.status_code == 404, (method, response.text[:200])
            assert "allow" not in response.headers
            if method != "HEAD":
                assert json_of(response)["error"]["code"] == "not_found"


def test_the_probes_refuse_other_methods_with_json(server: ServerProcess) -> None:
    for path in ("health/live", "health/ready"):
        response = httpx.post(server.base_url + "kaizen/api/" + path)
        assert response.status_code == 405 and response.headers["allow"] == "GET"
        assert json_of(response)["error"]["code"] == "method_not_allowed"
