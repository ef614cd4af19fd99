"""Credentials for External OpenAPI sources, end to end on both databases: a member's source
whose document requires an API key becomes a credential destination; the form, the broker
and the source's egress carry the value to that one origin, and nothing else sees it. A
disabled, changed or denied source revokes the forms already rendered for it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.credentials.test_broker_rest import _leaks
from tests.support.openapi_agent_plugin import OPENAPI_AGENT
from tests.support.openapi_server import OpenApiService, items_document, reaching
from tests.support.server import ServerProcess, member_token
from tests.support.tool_turns import settled_calls_of_turn

SECRET = "oas-key-9d1e-quarantined-credential-value"
SOURCES = "openapi-sources"
DEFAULT = {"responses": [{"text": "Default."}]}


def _document() -> dict[str, Any]:
    document = items_document(**{
        "/api/whoami": {"get": {"operationId": "whoAmI", "security": [{"key": []}]}},
        # A query-string key: offered because this server turns the query-auth ceiling on.
        "/api/headers": {"get": {"operationId": "queryKeyed", "security": [{"qkey": []}]}}})
    document["components"]["securitySchemes"]["qkey"] = {
        "type": "apiKey", "in": "query", "name": "api_key"}
    return document


class World:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI,
                 service: OpenApiService) -> None:
        self.server, self.fake, self.service = server, fake, service

    def form_submit(self, member: str, form_url: str, **fields: str) -> httpx.Response:
        return httpx.post(self.server.base_url.rstrip("/") + form_url, data=fields,
                          headers={"Authorization": f"token {member_token(member)}"},
                          timeout=30)

    def turn(self, member: str, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        return settled_calls_of_turn(self.server, self.fake, member, OPENAPI_AGENT,
                                     f"call {name} now {len(self.fake.requests())}",
                                     name, arguments)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"openapi-credentials-{request.param}")
    with OpenApiService(root) as service, FakeOpenAI([DEFAULT]) as fake:
        service.serve("/openapi.json", _document())
        service.serve("/moved.json", _document())
        with served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.openapi_agent_plugin",
                "KAIZEN_OPENAPI_SOURCES_ENABLED": "1",
                # The deployment's signed egress policy names the local services.
                **reaching(service, root),
                "KAIZEN_OPENAPI_SCHEMA_FRESH_SECONDS": "0",
                "KAIZEN_CREDENTIALS_ENABLED": "1",
                "KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED": "1",
                "KAIZEN_CREDENTIAL_KEY": new_key_text()}) as server:
            with server.client("alice") as alice:
                assert alice.put("members/me/settings",
                                 json={"approval_mode": "never_ask"}).status_code == 200
            yield World(server, fake, service)


@pytest.fixture
def source(world: World) -> Iterator[dict[str, Any]]:
    with world.server.client("alice") as alice:
        created = alice.post(SOURCES, json={"schema_url": world.service.url("/openapi.json")})
        assert created.status_code == 201, created.text
        yield dict(created.json())
        alice.delete(f"{SOURCES}/{created.json()['id']}")


def _destination(world: World, member: str, source_id: str,
                 kind: str = "header") -> dict[str, Any] | None:
    with world.server.client(member) as client:
        listed = client.get("credentials/destinations").json()
    return next((d for d in listed if d["id"].startswith(f"oas-{source_id}-")
                 and d["scheme"]["kind"] == kind), None)


def _form(world: World, destination: str) -> str:
    with world.server.client("alice") as alice:
        issued = alice.post("credentials/forms", json={"destination": destination})
        assert issued.status_code == 201, issued.text
        return str(issued.json()["form_url"])


def _ref(page: httpx.Response) -> str:
    found = re.search(r'id="kz-credential-ref">(cref_[A-Za-z0-9_-]+)<', page.text)
    assert found, page.text
    return found.group(1)


@pytest.mark.rule("R-386", "R-388", "R-391", "R-396", "R-443", "R-350")
def test_an_api_key_reaches_the_source_through_the_form_and_the_broker_only(
        world: World, source: dict[str, Any]) -> None:
    destination = _destination(world, "alice", source["id"])
    assert destination is not None
    assert destination["origin"] == world.service.origin
    assert destination["scheme"] == {"kind": "header", "name": "X-Key"}
    assert _destination(world, "bob", source["id"]) is None  # not bob's source
    form_url = _form(world, destination["id"])
    page = httpx.get(world.server.base_url.rstrip("/") + form_url,
                     headers={"Authorization": f"token {member_token('alice')}"}, timeout=30)
    assert f'id="destination-origin">{world.service.origin}<' in page.text
    ref = _ref(world.form_submit("alice", form_url, value=SECRET))
    before = len(world.service.received("/api/whoami"))
    tool = f"openapi__{source['id']}__whoAmI"
    [settled] = world.turn("alice", tool, {"credential_ref": ref})
    assert settled["outcome"] == "ok", settled
    received = world.service.received("/api/whoami")[before:]
    assert [r.headers.get("x-key") for r in received] == [SECRET]
    # The source echoed the key back; neither the result nor anything else carries it.
    assert _leaks(settled["content"], SECRET) == [] and "[REDACTED]" in settled["content"]
    assert _leaks(json.dumps(world.fake.requests()), SECRET) == []
    assert _leaks(world.server.log(), SECRET) == []
    # The model was offered the operation with an opaque credential_ref, nothing else.
    offered = {t["function"]["name"]: t["function"]["parameters"]
               for body in world.fake.requests() for t in body.get("tools") or []}
    assert "credential_ref" in offered[tool]["properties"]
    assert "X-Key" not in json.dumps(offered[tool])
    with world.server.client("alice") as alice:
        receipts = alice.get("credentials/receipts").json()
    assert any(r["credential_ref"] == ref and r["kind"] == "request"
               and r["status"] == "succeeded" for r in receipts)


@pytest.mark.rule("R-389")
def test_disabling_the_source_revokes_a_rendered_form(world: World,
                                                      source: dict[str, Any]) -> None:
    destination = _destination(world, "alice", source["id"])
    assert destination is not None
    form_url = _form(world, destination["id"])
    with world.server.client("alice") as alice:
        changed = alice.put(f"{SOURCES}/{source['id']}", json={
            "schema_url": source["schema_url"], "enabled": False})
        assert changed.status_code == 200, changed.text
        answer = world.form_submit("alice", form_url, value=SECRET)
        assert answer.status_code == 403 and 'data-code="destination_disabled"' in answer.text
        assert alice.get("credentials").json()["once"] == []


@pytest.mark.rule("R-390")
def test_changing_the_source_needs_a_new_form(world: World, source: dict[str, Any]) -> None:
    destination = _destination(world, "alice", source["id"])
    assert destination is not None
    form_url = _form(world, destination["id"])
    with world.server.client("alice") as alice:
        moved = alice.put(f"{SOURCES}/{source['id']}", json={
            "schema_url": world.service.url("/moved.json")})
        assert moved.status_code == 200, moved.text
    answer = world.form_submit("alice", form_url, value=SECRET)
    assert answer.status_code == 409 and 'data-code="destination_changed"' in answer.text


@pytest.mark.rule("R-389")
def test_the_admin_tree_revokes_a_rendered_form(world: World, source: dict[str, Any]) -> None:
    destination = _destination(world, "alice", source["id"])
    assert destination is not None
    form_url = _form(world, destination["id"])
    selector = f"openapi__{source['id']}"
    with world.server.client("dave") as dave:
        assert dave.put(f"admin/tool-policies/{selector}/alice",
                        json={"allowed": False}).status_code == 200
        try:
            answer = world.form_submit("alice", form_url, value=SECRET)
            assert answer.status_code == 403
            assert 'data-code="destination_denied"' in answer.text
        finally:
            dave.delete(f"admin/tool-policies/{selector}/alice")
    # The nonce was never claimed: allowed again, the same form works once.
    assert world.form_submit("alice", form_url, value=SECRET).status_code == 200


@pytest.mark.rule("R-387", "R-388")
def test_a_form_for_one_call_serves_that_call_only(world: World,
                                                  source: dict[str, Any]) -> None:
    destination = _destination(world, "alice", source["id"])
    assert destination is not None
    tool = f"openapi__{source['id']}__whoAmI"
    with world.server.client("alice") as alice:
        issued = alice.post("credentials/forms", json={
            "destination": destination["id"], "call": {"tool": tool, "arguments": {}}})
        assert issued.status_code == 201, issued.text
        body = issued.json()
        assert body["call"]["tool"] == tool and body["call"]["operation"] == "whoAmI"
        assert body["call"]["effect"] == "read" and body["remember_offered"] is False
        # An anonymous operation takes no credential: no form binds it.
        anonymous = alice.post("credentials/forms", json={
            "destination": destination["id"],
            "call": {"tool": f"openapi__{source['id']}__getItem",
                     "arguments": {"id": "1"}}})
        assert anonymous.status_code == 404
        assert anonymous.json()["error"]["code"] == "call_unknown"
    page = httpx.get(world.server.base_url.rstrip("/") + body["form_url"],
                     headers={"Authorization": f"token {member_token('alice')}"}, timeout=30)
    # The destination origin comes first, then the one call the form is for.
    assert page.text.index('id="destination-origin"') < page.text.index('id="kz-call"')
    assert tool in page.text
    ref = _ref(world.form_submit("alice", body["form_url"], value=SECRET))
    # Another operation of the same destination cannot use it; nothing is sent.
    before = len(world.service.received("/api/private"))
    [other] = world.turn("alice", f"openapi__{source['id']}__privateThing",
                         {"credential_ref": ref})
    assert other["outcome"] != "ok" and "entered for one call" in other["content"], other
    assert len(world.service.received("/api/private")) == before
    # The call it was entered for goes out once, with the value.
    sent = len(world.service.received("/api/whoami"))
    [settled] = world.turn("alice", tool, {"credential_ref": ref})
    assert settled["outcome"] == "ok", settled
    received = world.service.received("/api/whoami")[sent:]
    assert [r.headers.get("x-key") for r in received] == [SECRET]
    assert _leaks(settled["content"], SECRET) == []


@pytest.mark.rule("R-384", "R-386", "R-391")
def test_with_the_query_auth_ceiling_on_a_query_key_goes_in_the_one_requests_query(
        world: World, source: dict[str, Any]) -> None:
    with world.server.client("alice") as alice:
        listed = alice.get("credentials/destinations").json()
    [query] = [d for d in listed if d["id"].startswith(f"oas-{source['id']}-")
               and d["scheme"]["kind"] == "query"]
    assert query["scheme"]["name"] == "api_key"
    ref = _ref(world.form_submit("alice", _form(world, query["id"]), value=SECRET))
    tool = f"openapi__{source['id']}__queryKeyed"
    sent = len(world.service.received("/api/headers"))
    [settled] = world.turn("alice", tool, {"credential_ref": ref})
    assert settled["outcome"] == "ok", settled
    [received] = world.service.received("/api/headers")[sent:]
    assert received.query == [("api_key", SECRET)]
    # Neither the model, nor the result, nor the server's log saw the key or its parameter.
    offered = {t["function"]["name"]: t["function"]["parameters"]
               for body in world.fake.requests() for t in body.get("tools") or []}
    assert "api_key" not in json.dumps(offered[tool])
    assert _leaks(settled["content"], SECRET) == []
    assert _leaks(json.dumps(world.fake.requests()), SECRET) == []
    assert _leaks(world.server.log(), SECRET) == []
