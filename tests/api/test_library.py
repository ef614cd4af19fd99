"""The member's Library over REST and the Library feature flag, through real server processes
on SQLite and PostgreSQL.

Two servers per database: one with the Library on (the default) and one started with
``KAIZEN_LIBRARY_ENABLED=0``. With the flag off every Library path, tool and mention must be
indistinguishable from one the server never had (R-140): each flagged-off answer is compared
byte for byte with the answer to a genuinely unknown path or tool on the same server, and the
server with the flag on is the control that shows the comparison could fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from kaizen_server_extension.api.library import library_openapi
from kaizen_server_extension.api.openapi import openapi_document
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, _database_for, drop_schema, with_server_store
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.server import ServerProcess, json_of, member_token, start_server

LIBRARY_TOOLS = ("inspect_library", "manage_library")
# A tool name and paths no version of this server ever had.
NEVER_EXISTED_TOOL = "inspect_librarx"
LIBRARY_PATHS = ("collections", "collections/abc123/documents", "projects",
                 "projects/abc123/items")
NEVER_EXISTED_PATHS = ("never-existed", "never-existed/abc123/documents", "nothing-here",
                       "nothing-here/abc123/items")
# Headers whose value differs between any two responses (a clock, a fresh XSRF token).
VOLATILE_HEADERS = ("date", "set-cookie")

SCRIPTS = [
    {"match": "use the library tool", "responses": [
        {"tool_calls": [{"name": "inspect_library", "arguments": {"surface": "collections"}}]},
        {"text": "Here is what I found."}]},
    {"match": "use the missing tool", "responses": [
        {"tool_calls": [{"name": NEVER_EXISTED_TOOL,
                         "arguments": {"surface": "collections"}}]},
        {"text": "Here is what I found."}]},
    {"responses": [{"text": "Hello."}]},
]


@dataclass
class Servers:
    on: ServerProcess
    off: ServerProcess
    fake: FakeOpenAI


@pytest.fixture(scope="module", params=BACKENDS)
def servers(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The Library on and off, each on its own database of ``request.param``."""
    backend = str(request.param)
    started: list[tuple[ServerProcess, str | None]] = []
    with FakeOpenAI(SCRIPTS) as fake:
        try:
            for flag in ("1", "0"):
                root = tmp_path_factory.mktemp(f"library-{flag}-{backend}")
                url, schema = _database_for(backend, root)
                started.append((start_server(root, url, schema, extra_env={
                    "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model",
                    "KAIZEN_LIBRARY_ENABLED": flag}), schema))
            yield Servers(on=started[0][0], off=started[1][0], fake=fake)
        finally:
            for server, schema in started:
                server.stop()
                if schema:
                    import asyncio

                    asyncio.run(drop_schema(schema))


def _raw(server: ServerProcess, method: str, path: str, member: str | None = "alice",
         body: bytes = b"{}") -> httpx.Response:
    headers = {"Authorization": f"token {member_token(member)}"} if member else {}
    return httpx.request(method, server.base_url + "kaizen/api/" + path, headers=headers,
                         content=body if method != "GET" else None, timeout=30)


def _wire(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    """What a client can observe: status, headers (volatile values reduced to their cookie
    names), body bytes."""
    headers = []
    for name, value in response.headers.multi_items():
        if name.lower() == "set-cookie":
            value = value.split("=", 1)[0]
        elif name.lower() in VOLATILE_HEADERS:
            value = "<volatile>"
        headers.append((name.lower(), value))
    return response.status_code, sorted(headers), response.content


# --- the flag off ------------------------------------------------------------------


@pytest.mark.rule("R-140")
@pytest.mark.parametrize("member", ["alice", None], ids=["member", "anonymous"])
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_library_routes_answer_exactly_like_a_path_that_never_existed(
        servers: Servers, method: str, member: str | None) -> None:
    for library, never in zip(LIBRARY_PATHS, NEVER_EXISTED_PATHS, strict=True):
        hidden = _raw(servers.off, method, library, member)
        unknown = _raw(servers.off, method, never, member)
        assert _wire(hidden) == _wire(unknown), (method, library)
        if member is not None:  # an anonymous write meets the server's XSRF check first
            assert hidden.status_code == 404
        # Control: with the Library on the same request reaches a handler.
        assert _wire(_raw(servers.on, method, library, member)) != _wire(
            _raw(servers.on, method, never, member))


@pytest.mark.rule("R-140")
def test_the_openapi_document_is_the_one_a_server_without_the_library_serves(
        servers: Servers) -> None:
    library_paths, library_components = library_openapi()
    with servers.off.client("alice") as off, servers.on.client("alice") as on:
        hidden, shown = json_of(off.get("openapi.json")), json_of(on.get("openapi.json"))
    assert hidden == openapi_document(library=False)
    assert not set(library_paths) & set(hidden["paths"])
    assert not set(library_components) & set(hidden["components"]["schemas"])
    # The flag-on document with the Library taken out is exactly the flag-off one.
    assert set(library_paths) <= set(shown["paths"])
    assert {p: v for p, v in shown["paths"].items() if p not in library_paths} == \
        hidden["paths"]
    assert {c: v for c, v in shown["components"]["schemas"].items()
            if c not in library_components} == hidden["components"]["schemas"]
    assert "collection" not in json.dumps(hidden["paths"])


@pytest.mark.rule("R-140")
def test_the_agent_roster_and_the_tool_catalog_do_not_name_the_library(
        servers: Servers) -> None:
    with servers.off.client("alice") as off, servers.on.client("alice") as on:
        for path in ("agents", "agents/general", "tools", "tools?agent_id=general"):
            hidden, shown = off.get(path), on.get(path)
            assert hidden.status_code == shown.status_code == 200, (path, hidden.text)
            assert not any(name in hidden.text for name in LIBRARY_TOOLS), path
            assert all(name in shown.text for name in LIBRARY_TOOLS), path  # control
        general = on.get("agents/general").json()
        assert off.get("agents/general").json() == {
            **general, "tools": [t for t in general["tools"] if t not in LIBRARY_TOOLS]}


@pytest.mark.rule("R-140")
def test_the_admin_tool_policies_treat_a_library_tool_as_an_unknown_tool(
        servers: Servers) -> None:
    def policy(server: ServerProcess, tool: str) -> tuple[Any, ...]:
        with server.client("dave") as dave:
            put = dave.put(f"admin/tool-policies/{tool}/bob", json={"allowed": False})
            listed = dave.get("admin/tool-policies", params={"tool": tool})
        return (_wire(put)[:2], put.content.replace(tool.encode(), b"<tool>"),
                _wire(listed))

    for name in LIBRARY_TOOLS:
        # Same length, so the echoed name cannot change a Content-Length.
        never = name[:-1] + "x"
        assert policy(servers.off, name) == policy(servers.off, never)
        assert policy(servers.on, name) != policy(servers.on, never)  # control


def _turn(server: ServerProcess, text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with server.client("alice") as alice:
        created = alice.post("conversations", json={"agent_id": "general"})
        assert created.status_code == 201, created.text
        room = created.json()["id"]
        accepted = _send(alice, room, text)
        run = _settled(alice, accepted["run_id"])
        return run, _events(alice, room, accepted["run_id"])


def _settlement(run: dict[str, Any], events: list[dict[str, Any]], tool: str) -> Any:
    """The run's outcome and its tool events as the member sees them, with the per-run ids and
    the called name itself taken out."""
    def scrub(value: Any) -> Any:
        text = json.dumps(value).replace(tool, "<tool>")
        for ident in (run["id"], run["conversation_id"]):
            text = text.replace(ident, "<id>")
        return json.loads(text)

    tool_events = [{"type": e["type"], "actor": e["actor"],
                    "data": {k: v for k, v in e["data"].items() if k != "call_id"}}
                   for e in events if e["type"].startswith(("tool.", "run.terminal"))]
    return scrub({"status": run["status"], "outcome": run["outcome"],
                  "tool_calls": run["tool_calls"], "events": tool_events})


def _model_requests(fake: FakeOpenAI, marker: str) -> list[dict[str, Any]]:
    return [r for r in fake.requests()
            if any(marker in str(msg.get("content")) for msg in r.get("messages", [])
                   if msg.get("role") == "user")]


@pytest.mark.rule("R-140")
def test_a_model_calling_a_library_tool_by_name_is_refused_like_an_unknown_tool(
        servers: Servers) -> None:
    hidden = _settlement(*_turn(servers.off, "off-1: use the library tool"), "inspect_library")
    unknown = _settlement(*_turn(servers.off, "off-2: use the missing tool"),
                          NEVER_EXISTED_TOOL)
    assert hidden == unknown
    # A call outside the catalog closes the turn; the settled call carries no capability.
    assert (hidden["status"], hidden["outcome"]) == ("failed", "over_ceiling")
    assert [e["type"] for e in hidden["events"]] == ["tool.requested", "tool.settled",
                                                     "run.terminal"]
    assert hidden["events"][1]["data"]["capability"] == "undeclared"
    # Neither the system prompt nor the advertised tools of any step named the Library.
    requests = _model_requests(servers.fake, "off-1: use the library tool")
    assert requests
    for request in requests:
        assert not any(name in json.dumps(request.get("tools", [])) for name in LIBRARY_TOOLS)
        system = [msg["content"] for msg in request["messages"] if msg["role"] == "system"]
        assert system and not any(name in text for text in system for name in LIBRARY_TOOLS)


@pytest.mark.rule("R-140")
def test_with_the_flag_on_the_model_sees_and_uses_the_library_tool(servers: Servers) -> None:
    run, events = _turn(servers.on, "on-1: use the library tool")
    assert run["status"] == "completed", run
    settled = [e for e in events if e["type"] == "tool.settled"]
    assert [e["data"]["outcome"] for e in settled] == ["ok"]
    assert json.loads(settled[0]["data"]["content"]) == {"surface": "collections", "items": []}
    [first, *_] = _model_requests(servers.fake, "on-1: use the library tool")
    assert all(name in json.dumps(first["tools"]) for name in LIBRARY_TOOLS)


# --- the Library's REST contract (flag on) --------------------------------------------------


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = json_of(response)
    assert body["error"]["code"] == code, body
    return dict(body)


def _documents(server: ServerProcess, *, owner: str = "alice") -> dict[str, str]:
    """A markdown document and an HTML canvas of ``owner``, and one document of bob's."""
    async def create(store: Store) -> dict[str, str]:
        artifacts = ArtifactStore(store)
        await store.members.ensure("bob")
        doc = await artifacts.create(owner, title="Notes", kind="markdown", content="n")
        canvas = await artifacts.create(owner, title="App", kind="html", content="<p>")
        theirs = await artifacts.create("bob", title="Bob's", kind="markdown", content="b")
        return {"doc": doc.artifact_id, "canvas": canvas.artifact_id,
                "theirs": theirs.artifact_id}
    return with_server_store(server, create)


def _audit(server: ServerProcess, action: str) -> list[dict[str, Any]]:
    async def read(store: Store) -> list[dict[str, Any]]:
        from sqlalchemy import select

        async with store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.AuditEvent.actor, m.AuditEvent.data)
                .where(m.AuditEvent.action == action))).all()
        return [{"actor": actor, **dict(data)} for actor, data in rows]
    return with_server_store(server, read)


@pytest.mark.rule("R-141", "R-143", "R-144", "R-147", "R-148")
def test_filing_a_document_into_a_collection_over_rest(servers: Servers) -> None:
    ids = _documents(servers.on)
    with servers.on.client("alice") as alice, servers.on.client("bob") as bob:
        created = alice.post("collections", json={"name": "  Research  "})
        assert created.status_code == 201, created.text
        collection = created.json()
        assert collection["name"] == "Research"
        theirs = bob.post("collections", json={"name": "Bob's"}).json()["id"]
        listed = alice.get("collections").json()
        assert [(c["id"], c["name"]) for c in listed] == [(collection["id"], "Research")]
        assert set(listed[0]) == {"id", "name", "hint"}  # identity only

        path = f"collections/{collection['id']}/documents"
        first = alice.post(path, json={"artifact_id": ids["doc"]})
        again = alice.post(path, json={"artifact_id": ids["doc"]})
        assert (first.status_code, first.json()["changed"]) == (200, True)
        assert (again.status_code, again.json()["changed"]) == (200, False)
        assert alice.get(path).json() == {"collection_id": collection["id"],
                                          "artifact_ids": [ids["doc"]]}
        # A foreign destination, an item the caller cannot see and missing ids: one refusal.
        refusals = [
            alice.post(f"collections/{theirs}/documents", json={"artifact_id": ids["doc"]}),
            alice.post(path, json={"artifact_id": ids["theirs"]}),
            alice.post(path, json={"artifact_id": "0" * 32}),
            alice.post(f"collections/{'0' * 32}/documents", json={"artifact_id": ids["doc"]}),
            bob.get(path),
        ]
        bodies = {json.dumps(_error(r, 404, "library_not_found")) for r in refusals}
        assert len(bodies) == 1
        wrong_kind = _error(alice.post(path, json={"artifact_id": ids["canvas"]}), 422,
                            "library_wrong_kind")
        assert "not a document" in wrong_kind["error"]["message"]
        _error(alice.post(path, content=b"{not json"), 400, "malformed_json")
        _error(alice.post(path, json={"artifact_id": ids["doc"], "extra": 1}), 422,
               "schema_violation")
        _error(alice.post("collections", json={"name": "   "}), 422, "schema_violation")
        _error(alice.post("collections", json={"name": "a\nb"}), 422, "schema_violation")
        assert alice.get(path).json()["artifact_ids"] == [ids["doc"]]  # refusals wrote nothing
        assert len(alice.get("collections").json()) == 1
    audited = _audit(servers.on, "member.collection.doc_added")
    assert [(a["actor"], a["collection_id"], a["artifact_id"]) for a in audited
            if a["collection_id"] == collection["id"]] == [("alice", collection["id"],
                                                            ids["doc"])]


@pytest.mark.rule("R-145", "R-147", "R-148")
def test_linking_items_into_a_project_over_rest(servers: Servers) -> None:
    ids = _documents(servers.on)
    with servers.on.client("alice") as alice, servers.on.client("bob") as bob:
        outer = alice.post("projects", json={"name": "Outer"}).json()["id"]
        inner = alice.post("projects", json={"name": "Inner"}).json()["id"]
        shelf = alice.post("collections", json={"name": "Shelf"}).json()["id"]
        for kind, ident in (("artifact", ids["canvas"]), ("collection", shelf),
                            ("project", inner)):
            linked = alice.post(f"projects/{outer}/items",
                                json={"item_kind": kind, "item_id": ident})
            assert linked.status_code == 200 and linked.json()["changed"] is True, linked.text
        assert alice.post(f"projects/{outer}/items", json={
            "item_kind": "project", "item_id": inner}).json()["changed"] is False
        items = alice.get(f"projects/{outer}/items").json()["items"]
        assert sorted((i["item_kind"], i["item_id"]) for i in items) == sorted(
            [("artifact", ids["canvas"]), ("collection", shelf), ("project", inner)])
        cycle = _error(alice.post(f"projects/{inner}/items",
                                  json={"item_kind": "project", "item_id": outer}),
                       422, "library_cycle")
        assert "contain itself" in cycle["error"]["message"]
        refusals = [
            alice.post(f"projects/{outer}/items",
                       json={"item_kind": "artifact", "item_id": ids["theirs"]}),
            bob.post(f"projects/{outer}/items",
                     json={"item_kind": "artifact", "item_id": ids["doc"]}),
            alice.post(f"projects/{'0' * 32}/items",
                       json={"item_kind": "artifact", "item_id": ids["doc"]}),
            bob.get(f"projects/{outer}/items"),
        ]
        assert len({json.dumps(_error(r, 404, "library_not_found")) for r in refusals}) == 1
        _error(alice.post(f"projects/{outer}/items",
                          json={"item_kind": "folder", "item_id": shelf}),
               422, "schema_violation")
        assert len(alice.get(f"projects/{outer}/items").json()["items"]) == 3
        assert [p["name"] for p in bob.get("projects").json()] == []



@pytest.mark.rule("R-140")
def test_the_traitlet_turns_the_library_off_like_the_environment(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """``c.KaizenApp.library_enabled = False`` (here on the command line) is the same switch."""
    from kaizen_server_extension.store.engine import sqlite_url_for

    root = tmp_path_factory.mktemp("library-traitlet")
    server = start_server(root, sqlite_url_for(root / "kaizen.db"),
                          extra_args=["--KaizenApp.library_enabled=False"])
    try:
        for library, never in zip(LIBRARY_PATHS, NEVER_EXISTED_PATHS, strict=True):
            assert _wire(_raw(server, "GET", library)) == _wire(_raw(server, "GET", never))
        with server.client("alice") as alice:
            assert json_of(alice.get("openapi.json")) == openapi_document(library=False)
            assert not any(name in alice.get("agents").text for name in LIBRARY_TOOLS)
    finally:
        server.stop()
