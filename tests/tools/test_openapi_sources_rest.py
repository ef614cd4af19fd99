"""External OpenAPI sources as guarded tools, end to end: a real Kaizen server with the feature
on, a local HTTPS OpenAPI service on loopback (``tests/support/openapi_server.py``, its own
throwaway CA) plus a second one on another port that nothing may reach, and the scripted fake
model, driven through the REST API on both databases.

The agent ``api-user`` grants the whole OpenAPI family: every source of the run's member.
Every source call goes through the same pipeline as a built-in: the model is offered only
what discovery, the agent's grant and admin policy leave; writes ask the member first and do
not reach the source unless approved; requests go only to the registered origin.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import inspect, select

from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by, tool_call_audit, with_server_store
from tests.lanes.test_turns import _events, _pending_approval, _send, _settled
from tests.support.egress_policy import policy_env
from tests.support.openapi_agent_plugin import OPENAPI_AGENT
from tests.support.openapi_server import (
    OpenApiService,
    items_document,
    many_operations_document,
    oversized_document,
)
from tests.support.server import ServerProcess

SOURCES = "openapi-sources"
POLICIES = "admin/tool-policies"
DEFAULT_SCRIPT = {"responses": [{"text": "Default answer."}]}


def _call(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments or {}}]}


class World:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI, service: OpenApiService,
                 elsewhere: OpenApiService) -> None:
        self.server, self.fake, self.service, self.elsewhere = server, fake, service, elsewhere

    def script(self, *scripts: dict[str, Any]) -> None:
        self.fake.load([*scripts, DEFAULT_SCRIPT])

    def offered(self, text: str) -> set[str]:
        return self.fake.offered(text)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"openapi-{request.param}")
    with OpenApiService(root) as service, \
            OpenApiService(root, ca=service.ca) as elsewhere, \
            FakeOpenAI([DEFAULT_SCRIPT]) as fake:
        service.serve("/openapi.json", items_document(), etag='"items-1"')
        service.serve("/other.yaml", b"openapi: 3.0.3\ninfo: {title: Other}\npaths:\n"
                      b"  /api/ping:\n    get: {operationId: ping}\n",
                      content_type="application/yaml")
        # Another origin's document: a redirect there, or a source naming it, reaches nothing.
        elsewhere.serve("/openapi.json", items_document())
        with served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.openapi_agent_plugin",
                "KAIZEN_OPENAPI_SOURCES_ENABLED": "1",
                "KAIZEN_OPENAPI_EGRESS_NETWORKS": "127.0.0.1/32",
                "KAIZEN_OPENAPI_EGRESS_PORTS": f"{service.port},{elsewhere.port}",
                "KAIZEN_OPENAPI_CA_FILE": str(service.ca_file),
                # The deployment's signed egress policy names the local services.
                **policy_env(root, [service.origin, elsewhere.origin]),
                # Every discovery revalidates (ETag), and a failing source may stand in stale.
                "KAIZEN_OPENAPI_SCHEMA_FRESH_SECONDS": "0",
                "KAIZEN_OPENAPI_SCHEMA_STALE_SECONDS": "600"}) as proc:
            yield World(proc, fake, service, elsewhere)


def _register(client: httpx.Client, url: str, **extra: Any) -> dict[str, Any]:
    response = client.post(SOURCES, json={"schema_url": url, **extra})
    assert response.status_code == 201, response.text
    return dict(response.json())


def _room(client: httpx.Client, agent: str = OPENAPI_AGENT, shared: bool = False) -> str:
    response = client.post("conversations", json={"agent_id": agent, "shared": shared})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _run(client: httpx.Client, room: str, text: str) -> tuple[str, dict[str, Any]]:
    accepted = _send(client, room, text)
    return str(accepted["run_id"]), _settled(client, accepted["run_id"], timeout=120)


def _settled_calls(client: httpx.Client, room: str, run_id: str) -> list[dict[str, Any]]:
    return [dict(e["data"]) for e in _events(client, room, run_id)
            if e["type"] == "tool.settled"]


def _tool(source: dict[str, Any], operation: str) -> str:
    return f"openapi__{source['id']}__{operation}"


def _clear_sources(client: httpx.Client) -> None:
    for source in client.get(SOURCES).json():
        assert client.delete(f"{SOURCES}/{source['id']}").status_code == 204


@pytest.fixture
def alice(world: World) -> Iterator[httpx.Client]:
    with world.server.client("alice") as client:
        _clear_sources(client)
        yield client
        _clear_sources(client)


# --- registration ---------------------------------------------------------------------------


@pytest.mark.rule("R-375", "R-380", "R-381", "R-383")
@pytest.mark.parametrize(("body", "code"), [
    ({"schema_url": "http://127.0.0.1/openapi.json"}, "https_required"),
    ({"schema_url": "ftp://127.0.0.1/openapi.json"}, "https_required"),
    ({"schema_url": "https://user:pw@127.0.0.1/openapi.json"}, "credentialed_url"),
    ({"schema_url": "https://token@127.0.0.1/openapi.json"}, "credentialed_url"),
    ({"schema_url": "https://127.0.0.1/openapi.json?api_key=secret"}, "credentialed_url"),
    ({"schema_url": "https://127.0.0.1/openapi.json?"}, "credentialed_url"),
    ({"schema_url": "https://127.0.0.1/openapi.json#frag"}, "invalid_url"),
    ({"schema_url": "https:///openapi.json"}, "invalid_url"),
    ({"schema_url": "https://127.0.0.1:1/openapi.json"}, "egress_port_refused"),
    ({"schema_url": "https://10.1.2.3/openapi.json"}, "egress_port_refused"),
], ids=lambda v: v if isinstance(v, str) else v["schema_url"][:40])
def test_registration_refuses_what_is_not_an_uncredentialed_https_url(
        world: World, alice: httpx.Client, body: dict[str, Any], code: str) -> None:
    response = alice.post(SOURCES, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == code
    assert alice.get(SOURCES).json() == []


@pytest.mark.rule("R-381", "R-383", "R-380")
def test_registration_refuses_protected_addresses_other_origins_and_credentialed_bases(
        world: World, alice: httpx.Client) -> None:
    port = world.service.port
    cases = [
        # A protected address on an allowed port (only 127.0.0.1/32 is listed).
        ({"schema_url": f"https://10.1.2.3:{port}/openapi.json"}, "egress_address_refused"),
        ({"schema_url": f"https://[::1]:{port}/openapi.json"}, "egress_address_refused"),
        # An API base on another origin: refused without the admin ceiling, consent or not.
        ({"schema_url": world.service.url("/openapi.json"),
          "api_base": world.elsewhere.url("/api")}, "cross_origin_refused"),
        ({"schema_url": world.service.url("/openapi.json"),
          "api_base": world.elsewhere.url("/api"), "cross_origin": True},
         "cross_origin_refused"),
        ({"schema_url": world.service.url("/openapi.json"),
          "api_base": f"https://k:v@127.0.0.1:{port}/"}, "credentialed_url"),
        ({"schema_url": world.service.url("/openapi.json"),
          "api_base": world.service.url("/?token=abc")}, "credentialed_url"),
    ]
    for body, code in cases:
        response = alice.post(SOURCES, json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["code"] == code, body
    assert alice.post(SOURCES, json={"schema_url": 5}).status_code == 422
    assert alice.post(SOURCES, json={"schema_url": world.service.url("/openapi.json"),
                                     "headers": {"X": "1"}}).status_code == 422
    assert alice.get(SOURCES).json() == []


@pytest.mark.rule("R-376")
def test_a_source_is_a_pointer_owned_by_its_member(world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    assert source["api_base"] == world.service.origin and source["enabled"] is True
    assert alice.get(f"{SOURCES}/{source['id']}").json() == source
    with world.server.client("bob") as bob:
        assert bob.get(SOURCES).json() == []
        for response in (bob.get(f"{SOURCES}/{source['id']}"),
                         bob.delete(f"{SOURCES}/{source['id']}"),
                         bob.get(f"{SOURCES}/{source['id']}/operations"),
                         bob.put(f"{SOURCES}/{source['id']}", json={
                             "schema_url": world.service.url("/openapi.json")})):
            assert response.status_code == 404, response.text

    async def read(store: Store) -> tuple[set[str], list[str]]:
        async with store.transaction() as tx:
            columns = await tx.session.run_sync(lambda s: {
                c["name"] for c in inspect(s.connection()).get_columns("openapi_sources")})
            actions = (await tx.session.execute(
                select(m.AuditEvent.action).where(m.AuditEvent.actor == "alice",
                                                  m.AuditEvent.action.like("openapi_source%"))
            )).scalars().all()
            return columns, list(actions)
    columns, actions = with_server_store(world.server, read)
    # Only the pointer: no schema copy, response or credential column.
    assert columns == {"id", "owner", "slot", "schema_url", "api_base", "cross_origin",
                       "enabled", "created_at", "updated_at"}
    assert "openapi_source.created" in actions


@pytest.mark.rule("R-340", "R-341", "R-347", "R-328", "R-330")
def test_the_operations_a_source_compiles_into(world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    listing = alice.get(f"{SOURCES}/{source['id']}/operations")
    assert listing.status_code == 200, listing.text
    body = listing.json()
    effects = {op["operation_id"]: op["effect"] for op in body["operations"]}
    assert effects == {"getItem": "read", "deleteItem": "sensitive", "createItem": "write",
                       "searchItems": "read", "lookupItems": "write", "followMe": "read",
                       "showHeaders": "read", "hugeText": "read", "brokenRead": "read",
                       "dropRead": "read", "dropWrite": "write"}
    assert {op["tool"] for op in body["operations"]} == {_tool(source, o) for o in effects}
    omitted = {o["where"] for o in body["omitted"]}
    assert {"POST /api/login", "GET /api/private", "GET /api/needs-header",
            "GET /api/bad-effect", "GET /api/bad-schema", "GET /api/no-id"} == omitted
    # A YAML document works too.
    other = _register(alice, world.service.url("/other.yaml"))
    assert [op["tool"] for op in alice.get(f"{SOURCES}/{other['id']}/operations"
                                           ).json()["operations"]] == [_tool(other, "ping")]


# --- discovery and calls ---------------------------------------------------------------------


@pytest.mark.rule("R-400", "R-328", "R-330")
def test_discovery_offers_each_operation_under_its_source_name(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    other = _register(alice, world.service.url("/other.yaml"))
    room = _room(alice)
    _, run = _run(alice, room, "just say hi")
    assert run["status"] == "completed", run
    offered = {n for n in world.offered("just say hi") if n.startswith("openapi__")}
    assert offered == {_tool(source, op) for op in (
        "getItem", "deleteItem", "createItem", "searchItems", "lookupItems", "followMe",
        "showHeaders", "hugeText", "brokenRead", "dropRead", "dropWrite")} | {
            _tool(other, "ping")}
    # An agent that does not grant the family is offered none; nor is bob, whose sources
    # these are not.
    _run(alice, _room(alice, agent="general"), "hi from general")
    assert not {n for n in world.offered("hi from general") if n.startswith("openapi__")}
    with world.server.client("bob") as bob:
        _run(bob, _room(bob), "hi from bob")
        assert not {n for n in world.offered("hi from bob") if n.startswith("openapi__")}


@pytest.mark.rule("R-374")
def test_a_shared_room_is_offered_no_source_tool(world: World, alice: httpx.Client) -> None:
    _register(alice, world.service.url("/openapi.json"))
    _run(alice, _room(alice, shared=True), "hi in a shared room")
    assert not {n for n in world.offered("hi in a shared room") if n.startswith("openapi__")}


@pytest.mark.rule("R-343", "R-382", "R-344")
def test_a_read_runs_on_the_registered_origin_with_fixed_headers(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    name = _tool(source, "getItem")
    world.script({"match": "read item", "responses": [
        _call(name, {"id": "a/../b", "verbose": True}), {"text": "Read it."}]})
    room = _room(alice)
    run_id, run = _run(alice, room, "read item please")
    assert run["status"] == "completed", run
    [settled] = _settled_calls(alice, room, run_id)
    assert settled["outcome"] == "ok", settled
    # The source's credential-shaped field is redacted before the model sees it.
    assert "item a%2F..%2Fb" in settled["content"]
    assert "tok-123-from-the-source" not in settled["content"]
    [received] = world.service.received("/api/items/a%2F..%2Fb")
    assert received.method == "GET" and received.query == [("verbose", "true")]
    # No identity of the member or the server, no model-chosen header.
    assert set(received.headers) <= {"host", "accept", "user-agent", "accept-encoding",
                                     "connection"}
    assert "alice" not in json.dumps(received.headers)
    assert world.elsewhere.received() == []
    # The same audit row as any tool call.
    [row] = tool_call_audit(world.server, run_id)
    assert row["tool"] == name and row["outcome"] == "ok"


@pytest.mark.rule("R-343")
def test_arguments_cannot_supply_an_endpoint_or_a_header(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    world.script({"match": "sneak", "responses": [
        _call(_tool(source, "getItem"), {"id": "1", "url": world.elsewhere.url("/x"),
                                         "headers": {"Authorization": "Bearer x"},
                                         "X-Trace": "1"}),
        {"text": "Tried."}]})
    room = _room(alice)
    before = len(world.service.received())
    run_id, _ = _run(alice, room, "sneak a url in")
    [settled] = _settled_calls(alice, room, run_id)
    assert settled["outcome"] != "ok" and "Invalid arguments" in settled["content"], settled
    assert len(world.service.received()) == before + 1  # only the discovery's revalidation
    assert world.elsewhere.received() == []


@pytest.mark.rule("R-380")
def test_a_redirect_to_another_origin_is_never_followed(
        world: World, alice: httpx.Client) -> None:
    world.service.state.redirect_to = world.elsewhere.url("/stolen")
    source = _register(alice, world.service.url("/openapi.json"))
    world.script({"match": "follow", "responses": [_call(_tool(source, "followMe")),
                                                   {"text": "Followed."}]})
    room = _room(alice)
    run_id, _ = _run(alice, room, "follow the link")
    [settled] = _settled_calls(alice, room, run_id)
    assert settled["outcome"] != "ok" and "redirect" in settled["content"], settled
    assert world.elsewhere.received() == []


@pytest.mark.rule("R-340", "R-341", "R-342")
def test_writes_wait_for_approval_and_reach_the_source_only_when_approved(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    world.script(
        {"match": "create an item", "responses": [
            _call(_tool(source, "createItem"), {"body": {"name": "new"}}), {"text": "Done."}]},
        {"match": "look items up", "responses": [
            _call(_tool(source, "lookupItems")), {"text": "Done."}]},
        {"match": "delete item", "responses": [
            _call(_tool(source, "deleteItem"), {"id": "9"}), {"text": "Done."}]})
    room = _room(alice)
    accepted = _send(alice, room, "create an item")
    approval = _pending_approval(alice, accepted["run_id"])
    assert approval["tool"] == _tool(source, "createItem")
    assert approval["capability"] == "write"
    assert world.service.received("/api/items") == []
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "approve"}).status_code == 200
    assert _settled(alice, accepted["run_id"], timeout=120)["status"] == "completed"
    [created] = world.service.received("/api/items")
    assert json.loads(created.body) == {"name": "new"}
    assert created.headers["content-type"] == "application/json"

    # A POST that sounds like a read but declares nothing is a write: asked, and declined.
    accepted = _send(alice, room, "look items up")
    approval = _pending_approval(alice, accepted["run_id"])
    assert approval["capability"] == "write"
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "deny"}).status_code == 200
    _settled(alice, accepted["run_id"], timeout=120)
    assert world.service.received("/api/lookup") == []

    # DELETE is sensitive: it cannot be allowed for the whole conversation.
    accepted = _send(alice, room, "delete item 9")
    approval = _pending_approval(alice, accepted["run_id"])
    assert approval["capability"] == "sensitive"
    refused = alice.post(f"approvals/{approval['id']}",
                         json={"decision": "approve", "scope": "conversation"})
    assert refused.status_code == 422
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "deny"}).status_code == 200
    _settled(alice, accepted["run_id"], timeout=120)
    assert [r for r in world.service.received("/api/items/9") if r.method == "DELETE"] == []


def test_a_declared_read_post_runs_unasked(world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    world.script({"match": "search", "responses": [
        _call(_tool(source, "searchItems"), {"body": {"q": "x"}}), {"text": "Found."}]})
    room = _room(alice)
    run_id, run = _run(alice, room, "search for x")
    assert run["status"] == "completed"
    assert [e for e in _events(alice, room, run_id) if e["type"] == "approval.requested"] == []
    assert [c["outcome"] for c in _settled_calls(alice, room, run_id)] == ["ok"]


def test_results_are_bounded_and_an_error_status_is_a_failed_call(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    world.script({"match": "huge and broken", "responses": [
        _call(_tool(source, "hugeText")), _call(_tool(source, "brokenRead")),
        {"text": "Both."}]})
    room = _room(alice)
    run_id, _ = _run(alice, room, "huge and broken")
    huge, broken = _settled_calls(alice, room, run_id)
    assert huge["outcome"] == "ok" and len(huge["content"]) <= 20_000
    assert broken["outcome"] != "ok" and "500" in broken["content"]


@pytest.mark.rule("R-399")
def test_a_transport_failure_is_a_bounded_error_for_a_read_and_unknown_for_a_write(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    world.script(
        {"match": "dropped read", "responses": [_call(_tool(source, "dropRead")),
                                                {"text": "Tried."}]},
        {"match": "dropped write", "responses": [_call(_tool(source, "dropWrite")),
                                                 {"text": "Tried."}]})
    room = _room(alice)
    run_id, _ = _run(alice, room, "dropped read")
    [read] = _settled_calls(alice, room, run_id)
    assert read["outcome"] == "error" and "did not complete" in read["content"], read
    assert str(world.service.port) not in read["content"]
    accepted = _send(alice, room, "dropped write")
    approval = _pending_approval(alice, accepted["run_id"])
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "approve"}).status_code == 200
    _settled(alice, accepted["run_id"], timeout=120)
    [write] = _settled_calls(alice, room, accepted["run_id"])
    assert write["outcome"] == "raised" and "unknown" in write["content"].lower(), write
    # Sent once each: an uncertain delivery is never retried automatically.
    assert [r.method for r in world.service.received("/api/drop")] == ["GET", "POST"]


@pytest.mark.rule("R-400", "R-316")
def test_a_source_disabled_or_deleted_after_discovery_is_refused_at_the_call(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    name = _tool(source, "getItem")
    world.script({"match": "slow read", "responses": [
        {**_call(name, {"id": "late"}), "delay_ms": 3000}, {"text": "Tried."}]})
    room = _room(alice)
    accepted = _send(alice, room, "slow read")
    # Discovery happened at admission; the source is disabled before the model's call.
    deadline = time.monotonic() + 60
    while not any(e["type"] == "model.step.started"
                  for e in _events(alice, room, accepted["run_id"])):
        assert time.monotonic() < deadline, "the run never started a step"
        time.sleep(0.05)
    assert alice.put(f"{SOURCES}/{source['id']}", json={
        "schema_url": source["schema_url"], "enabled": False}).status_code == 200
    _settled(alice, accepted["run_id"], timeout=120)
    [settled] = _settled_calls(alice, room, accepted["run_id"])
    assert settled["outcome"] != "ok" and "disabled" in settled["content"], settled
    assert world.service.received("/api/items/late") == []
    # Disabled, it is not offered at all.
    _run(alice, room, "hi while disabled")
    assert not {n for n in world.offered("hi while disabled") if n.startswith("openapi__")}


@pytest.mark.rule("R-316", "R-065")
def test_a_source_that_cannot_be_discovered_gives_no_tools(
        world: World, alice: httpx.Client) -> None:
    missing = _register(alice, world.service.url("/missing.json"))
    working = _register(alice, world.service.url("/other.yaml"))
    _run(alice, _room(alice), "hi with a missing source")
    offered = world.offered("hi with a missing source")
    assert not {n for n in offered if n.startswith(f"openapi__{missing['id']}")}
    assert _tool(working, "ping") in offered
    assert alice.get(f"{SOURCES}/{missing['id']}/operations").status_code == 502


@pytest.mark.rule("R-327")
def test_discovery_revalidates_with_the_etag_and_falls_back_to_a_stale_copy(
        world: World, alice: httpx.Client) -> None:
    world.service.serve("/etag.json", items_document(), etag='"etag-1"')
    source = _register(alice, world.service.url("/etag.json"))
    room = _room(alice)
    _run(alice, room, "first look")
    _run(alice, room, "second look")
    fetches = world.service.received("/etag.json")
    assert fetches[0].headers.get("if-none-match") is None
    assert fetches[-1].headers.get("if-none-match") == '"etag-1"'
    # The source goes down: within the stale bound its cached schema still serves.
    world.service.state.failing.add("/etag.json")
    try:
        _run(alice, room, "third look")
        assert _tool(source, "getItem") in world.offered("third look")
    finally:
        world.service.state.failing.discard("/etag.json")


# --- admin policy: root, family, source, endpoint ----------------------------------------------


def _policy(client: httpx.Client, tool: str, member: str, allowed: bool) -> None:
    response = client.put(f"{POLICIES}/{tool}/{member}", json={"allowed": allowed})
    assert response.status_code == 200, response.text


@pytest.mark.rule("R-312", "R-313", "R-314", "R-315")
def test_the_policy_tree_only_tightens(world: World, alice: httpx.Client) -> None:
    a = _register(alice, world.service.url("/openapi.json"))
    b = _register(alice, world.service.url("/other.yaml"))
    get_a, ping_b = _tool(a, "getItem"), _tool(b, "ping")
    with world.server.client("dave") as dave:
        set_rows: list[tuple[str, str]] = []

        def policy(tool: str, allowed: bool, member: str = "*") -> None:
            _policy(dave, tool, member, allowed)
            set_rows.append((tool, member))

        def offered(text: str) -> set[str]:
            _run(alice, _room(alice), text)
            return {n for n in world.offered(text) if n.startswith("openapi__")}

        try:
            # Disabling one source leaves its sibling unchanged.
            policy(f"openapi__{a['id']}", False)
            now = offered("policy one")
            assert not {n for n in now if n.startswith(f"openapi__{a['id']}")}
            assert ping_b in now
            # A source allowed again admits its operations, but an exact disabled one stays
            # disabled.
            policy(f"openapi__{a['id']}", True)
            policy(get_a, False)
            now = offered("policy two")
            assert get_a not in now and _tool(a, "deleteItem") in now
            # An allow on the root or the family grants nothing beneath.
            policy("sources", True)
            policy("openapi", True)
            assert get_a not in offered("policy three")
            # A denied ancestor is a hard ceiling over an exact allow, for the member
            # it names, whatever the everyone rows say.
            policy(get_a, True, "alice")
            assert get_a in offered("policy four")
            policy("openapi", False, "alice")
            assert offered("policy five") == set()
            policy("openapi", True, "alice")
            policy("sources", False)
            assert offered("policy six") == set()
        finally:
            for tool, member in set_rows:
                dave.delete(f"{POLICIES}/{tool}/{member}")
        # Unknown sources and malformed names are refused, as for any tool.
        for name in ("openapi__s0000000000", "openapi__s0000000000__getItem", "openapi__x"):
            refused = dave.put(f"{POLICIES}/{name}/*", json={"allowed": False})
            assert refused.status_code == 422 and refused.json()["error"]["code"] == \
                "unknown_tool", name


@pytest.mark.rule("R-005")
def test_a_policy_denial_bites_on_the_next_call_of_a_running_turn(
        world: World, alice: httpx.Client) -> None:
    source = _register(alice, world.service.url("/openapi.json"))
    name = _tool(source, "getItem")
    world.script({"match": "read twice", "responses": [
        _call(name, {"id": "first"}),
        {**_call(name, {"id": "second"}), "delay_ms": 3000}, {"text": "Both."}]})
    room = _room(alice)
    accepted = _send(alice, room, "read twice")
    deadline = time.monotonic() + 60
    while not world.service.received("/api/items/first"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with world.server.client("dave") as dave:
        _policy(dave, f"openapi__{source['id']}", "alice", False)
        try:
            _settled(alice, accepted["run_id"], timeout=120)
        finally:
            dave.delete(f"{POLICIES}/openapi__{source['id']}/alice")
    assert world.service.received("/api/items/second") == []


# --- limits ------------------------------------------------------------------------------------


@pytest.mark.rule("R-401")
def test_a_document_is_bounded_in_bytes_and_operations(
        world: World, alice: httpx.Client) -> None:
    world.service.serve("/many.json", many_operations_document(2001))
    world.service.serve("/big.json", oversized_document(16 * 1024 * 1024 + 1))
    many = _register(alice, world.service.url("/many.json"))
    body = alice.get(f"{SOURCES}/{many['id']}/operations").json()
    assert len(body["operations"]) == 2000 and body["omitted_count"] == 1
    big = _register(alice, world.service.url("/big.json"))
    refused = alice.get(f"{SOURCES}/{big['id']}/operations")
    assert refused.status_code == 502
    assert refused.json()["error"]["code"] == "schema_too_large"


@pytest.mark.rule("R-402")
def test_a_member_may_own_at_most_100_sources(world: World, alice: httpx.Client) -> None:
    url = world.service.url("/other.yaml")
    for _ in range(100):
        _register(alice, url, enabled=False)
    refused = alice.post(SOURCES, json={"schema_url": url})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "source_limit_reached"
    assert len(alice.get(SOURCES).json()) == 100
    # Another member is not affected by alice's limit.
    with world.server.client("carol") as carol:
        created = carol.post(SOURCES, json={"schema_url": url})
        assert created.status_code == 201
        assert carol.delete(f"{SOURCES}/{created.json()['id']}").status_code == 204


def test_the_routes_are_in_the_openapi_document(world: World, alice: httpx.Client) -> None:
    from openapi_spec_validator import validate

    document = alice.get("openapi.json").json()
    validate(document)
    paths = document["paths"]
    assert {"/kaizen/api/openapi-sources", "/kaizen/api/openapi-sources/{source_id}",
            "/kaizen/api/openapi-sources/{source_id}/operations"} <= set(paths)


# --- the management tool ---------------------------------------------------------------------


@pytest.mark.rule("R-377")
def test_the_management_tool_changes_sources_only_when_approved(
        world: World, alice: httpx.Client) -> None:
    url = world.service.url("/other.yaml")
    world.script(
        {"match": "add that api", "responses": [
            _call("manage_openapi_sources", {"action": "create", "schema_url": url}),
            {"text": "Added."}]},
        {"match": "add a plain http api", "responses": [
            _call("manage_openapi_sources", {"action": "create",
                                             "schema_url": "http://127.0.0.1/x.json"}),
            {"text": "Tried."}]})
    room = _room(alice)
    accepted = _send(alice, room, "add that api")
    approval = _pending_approval(alice, accepted["run_id"])
    assert approval["tool"] == "manage_openapi_sources" and approval["capability"] == "write"
    assert alice.get(SOURCES).json() == []  # nothing before the member decides
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "deny"}).status_code == 200
    _settled(alice, accepted["run_id"], timeout=120)
    assert alice.get(SOURCES).json() == []

    accepted = _send(alice, room, "add that api")
    approval = _pending_approval(alice, accepted["run_id"])
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "approve"}).status_code == 200
    assert _settled(alice, accepted["run_id"], timeout=120)["status"] == "completed"
    [source] = alice.get(SOURCES).json()
    assert source["schema_url"] == url and source["owner"] == "alice"

    # The tool applies the REST rules: an http:// URL is refused, even once approved.
    accepted = _send(alice, room, "add a plain http api")
    approval = _pending_approval(alice, accepted["run_id"])
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "approve"}).status_code == 200
    _settled(alice, accepted["run_id"], timeout=120)
    [settled] = _settled_calls(alice, room, accepted["run_id"])
    assert settled["outcome"] != "ok" and "https://" in settled["content"], settled
    assert len(alice.get(SOURCES).json()) == 1


@pytest.mark.rule("R-379")
def test_without_a_valid_signed_policy_nothing_is_fetched_or_sent(
        world: World, alice: httpx.Client) -> None:
    """The feature stays on; only the deployment's signed egress policy goes bad: a call
    approved before that is refused at the door, the document is not fetched, and a new turn
    is offered no source tool. Restored, everything works again without a restart."""
    policy = world.service.ca_file.parent / "egress-policy.signed"
    signed = policy.read_text(encoding="ascii")
    source = _register(alice, world.service.url("/openapi.json"))
    operations = f"{SOURCES}/{source['id']}/operations"
    world.script({"match": "create one under policy", "responses": [
        _call(_tool(source, "createItem"), {"body": {"name": "unsent"}}), {"text": "Done."}]})
    room = _room(alice)
    accepted = _send(alice, room, "create one under policy")
    approval = _pending_approval(alice, accepted["run_id"])
    before = len(world.service.received())
    try:
        policy.write_text(signed.strip() + "A", encoding="ascii")  # one byte more: tampered
        assert alice.post(f"approvals/{approval['id']}",
                          json={"decision": "approve"}).status_code == 200
        _settled(alice, accepted["run_id"], timeout=120)
        [settled] = _settled_calls(alice, room, accepted["run_id"])
        assert settled["outcome"] != "ok" and "egress policy" in settled["content"], settled
        refused = alice.get(operations)
        assert refused.status_code == 502
        assert refused.json()["error"]["code"] == "egress_policy_invalid"
        _run(alice, _room(alice), "hi under a broken policy")
        assert not {n for n in world.offered("hi under a broken policy")
                    if n.startswith("openapi__")}
        policy.unlink()
        assert alice.get(operations).json()["error"]["code"] == "egress_policy_missing"
        assert len(world.service.received()) == before
    finally:
        policy.write_text(signed, encoding="ascii")
    assert alice.get(operations).status_code == 200


def _source_audit(world: World, source_id: str) -> list[tuple[str, dict[str, Any]]]:
    async def read(store: Store) -> list[tuple[str, dict[str, Any]]]:
        async with store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.AuditEvent.action, m.AuditEvent.data)
                .where(m.AuditEvent.actor == "alice",
                       m.AuditEvent.action.like("openapi_source.%"))
                .order_by(m.AuditEvent.id))).all()
            return [(a, dict(d)) for a, d in rows if dict(d).get("source") == source_id]
    return with_server_store(world.server, read)


@pytest.mark.rule("R-377")
def test_a_source_change_audits_a_one_shot_approval_apart_from_never_ask(
        world: World, alice: httpx.Client) -> None:
    url = world.service.url("/other.yaml")
    world.script({"match": "register the ping api", "responses": [
        _call("manage_openapi_sources", {"action": "create", "schema_url": url}),
        {"text": "Registered."}]})
    room = _room(alice)
    accepted = _send(alice, room, "register the ping api")
    approval = _pending_approval(alice, accepted["run_id"])
    assert alice.post(f"approvals/{approval['id']}",
                      json={"decision": "approve"}).status_code == 200
    assert _settled(alice, accepted["run_id"], timeout=120)["status"] == "completed"
    [source] = alice.get(SOURCES).json()
    [(action, created)] = _source_audit(world, source["id"])
    assert action == "openapi_source.created"
    assert created["authorization"] == {"by": "one_shot_approval", "mode": "ask_for_writes",
                                        "approval_id": approval["id"],
                                        "run_id": accepted["run_id"]}

    mode = alice.get("members/me/settings").json()["approval_mode"]
    assert alice.put("members/me/settings",
                     json={"approval_mode": "never_ask"}).status_code == 200
    try:
        world.script({"match": "disable the ping api", "responses": [
            _call("manage_openapi_sources", {"action": "disable",
                                             "source_id": source["id"]}),
            {"text": "Disabled."}]})
        run_id, run = _run(alice, room, "disable the ping api")
        assert run["status"] == "completed", run
        # Nothing was asked: the member's Never ask mode allowed it.
        assert [e for e in _events(alice, room, run_id)
                if e["type"].startswith("approval.")] == []
    finally:
        alice.put("members/me/settings", json={"approval_mode": mode})
    assert alice.get(f"{SOURCES}/{source['id']}").json()["enabled"] is False
    assert alice.delete(f"{SOURCES}/{source['id']}").status_code == 204
    audit = _source_audit(world, source["id"])
    assert [(a, d["authorization"]) for a, d in audit[1:]] == [
        ("openapi_source.updated", {"by": "never_ask", "mode": "never_ask",
                                    "run_id": run_id}),
        # The member's own REST call, a third kind.
        ("openapi_source.deleted", {"by": "member_request"})]
