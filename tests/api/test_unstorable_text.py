"""Member input the databases cannot store is refused, on both databases alike
(store/storable.py; docs/architecture.md, "Text the databases cannot store").

U+0000 or an unpaired surrogate in a REST field, a path segment or a query value answers 422
``unstorable_text`` naming where it was, and nothing is written; PostgreSQL used to answer 500
(``invalid byte sequence for encoding "UTF8": 0x00``) and SQLite stored it. Any other string
is stored and read back equal, or refused with a 4xx: never a 500.

The session's server is shared: every check counts before and after, never from empty.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.repository import ArtifactStore
from kaizen_server_extension.store.storable import is_storable
from tests.conftest import with_server_store
from tests.support.server import ServerProcess, json_of
from tests.support.unicode import any_text

NUL = "\x00"


def _post_raw(client: httpx.Client, path: str, body: Any, method: str = "POST") -> httpx.Response:
    """A body sent ASCII-escaped, as a browser's JSON.stringify would: ``"\\ud800"`` arrives
    as an escape the server decodes into an unpaired surrogate."""
    return client.request(method, path, content=json.dumps(body),
                          headers={"Content-Type": "application/json"})


def _refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 422, response.text
    error = json_of(response)["error"]
    assert error["code"] == "unstorable_text", error
    assert repr(field) in error["message"] and "nothing was saved" in error["message"]


def _unknown_path(response: httpx.Response) -> None:
    """A path segment outside its route's ASCII pattern never reaches a handler: the JSON 404
    of a path that does not exist (api/params.py), before anything could be read or written."""
    assert response.status_code == 404, response.text
    assert json_of(response)["error"]["code"] == "not_found"


def _room(client: httpx.Client) -> str:
    response = client.post("conversations", json={"agent_id": "general"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _journal(client: httpx.Client, room: str) -> list[dict[str, Any]]:
    body = json_of(client.get(f"conversations/{room}/journal", params={"limit": 1000}))
    return list(body["events"])


def _artifact(server: ServerProcess) -> str:
    """A new markdown artifact of alice's own, titled "Before"."""
    async def seed(store: Store) -> str:
        record = await ArtifactStore(store).create("alice", title="Before", kind="markdown",
                                                   content="# x\n")
        return record.artifact_id

    return with_server_store(server, seed)


@pytest.fixture
def alice(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client("alice") as client:
        assert client.get("agents").status_code == 200  # the member exists
        yield client


@pytest.mark.parametrize("bad", [NUL, "\ud800", "\udfff"])
def test_body_fields_holding_unstorable_text_are_refused_naming_the_field(
        server: ServerProcess, alice: httpx.Client, bad: str) -> None:
    conversations = len(json_of(alice.get("conversations")))
    _refused(_post_raw(alice, "conversations", {"agent_id": "general",
                                                "title": f"a{bad}b"}), "title")
    _refused(_post_raw(alice, "conversations", {"agent_id": f"gen{bad}"}), "agent_id")
    assert len(json_of(alice.get("conversations"))) == conversations  # nothing written

    room = _room(alice)
    events = len(_journal(alice, room))
    path = f"conversations/{room}/messages"
    _refused(_post_raw(alice, path, {"text": f"hello {bad}"}), "text")
    _refused(_post_raw(alice, path, {"text": "hello", "idempotency_key": f"k{bad}"}),
             "idempotency_key")
    _refused(_post_raw(alice, path, {"text": "hello", "attachments": [f"a{bad}"]}),
             "attachments.0")
    _refused(_post_raw(alice, path, {"text": "hello", f"extra{bad}": 1}), f"extra{bad}")
    assert len(_journal(alice, room)) == events  # no input accepted, no run queued

    _refused(_post_raw(alice, f"conversations/{room}/participants",
                       {"member": f"bo{bad}b"}), "member")
    assert json_of(alice.get(f"conversations/{room}"))["participants"] == ["alice"]

    before = json_of(alice.get("members/me/settings"))
    _refused(_post_raw(alice, "members/me/settings",
                       {"approval_mode": "always_ask", "model": f"m{bad}"}, "PUT"), "model")
    assert json_of(alice.get("members/me/settings")) == before

    artifact = _artifact(server)
    _refused(_post_raw(alice, f"artifacts/{artifact}", {"title": f"t{bad}"}, "PATCH"),
             "title")
    assert json_of(alice.get(f"artifacts/{artifact}"))["title"] == "Before"


@pytest.mark.parametrize("path", [
    "conversations/a%00b", "conversations/%00/journal", "runs/%00", "artifacts/%00",
    "artifacts/%00/download", "agents/gen%00", "notifications/%00/ack",
])
def test_path_segments_holding_nul_are_refused_not_a_server_error(
        alice: httpx.Client, path: str) -> None:
    method = "POST" if path.endswith("/ack") else "GET"
    _unknown_path(alice.request(method, path))


def test_the_events_socket_refuses_a_nul_room_before_the_upgrade(
        server: ServerProcess) -> None:
    url = server.base_url.replace("http", "ws", 1) + "kaizen/api/conversations/%00/events"
    with server.client("alice") as alice:
        response = alice.get(url.replace("ws", "http", 1), headers={
            "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    _unknown_path(response)


def test_an_admin_route_with_a_nul_path_is_still_404_to_a_non_admin(
        server: ServerProcess) -> None:
    """Refusing the path must not tell a non-admin that the admin routes exist (API.md)."""
    with server.client("bob") as bob, server.client("dave") as dave:
        hidden = bob.put("admin/tool-policies/run_code/%00", json={"allowed": True})
        assert hidden.status_code == 404 and json_of(hidden)["error"]["code"] == "not_found"
        _refused(dave.put("admin/tool-policies/run_code/%00", json={"allowed": True}),
                 "path")  # dave is the admin


def test_a_message_posted_to_a_nul_room_writes_nothing(alice: httpx.Client) -> None:
    before = alice.get("conversations").json()
    _unknown_path(alice.post("conversations/%00/messages", json={"text": "hi"}))
    assert alice.get("conversations").json() == before


def test_query_values_holding_nul_are_refused_naming_the_parameter(
        alice: httpx.Client) -> None:
    _refused(alice.get("artifacts?conversation_id=%00"), "conversation_id")
    _refused(alice.get("tools?agent_id=gen%00eral"), "agent_id")


def test_other_control_characters_are_stored_as_they_are(alice: httpx.Client) -> None:
    title = "bell\x07 esc\x1b[31m del\x7f tab\t \\u0000 (an escape, not a NUL)"
    created = alice.post("conversations", json={"agent_id": "general", "title": title})
    assert created.status_code == 201, created.text
    assert json_of(alice.get(f"conversations/{created.json()['id']}"))["title"] == title


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._ -]+")


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=any_text)
def test_any_text_in_a_text_field_is_stored_and_read_back_equal_or_refused_with_4xx(
        server: ServerProcess, alice: httpx.Client, text: str) -> None:
    """The property: for every field, a 2xx means the value reads back exactly; otherwise a
    4xx, nothing written; never a 500. Unstorable text is always the 422."""
    # What the server decodes: an escaped surrogate pair ("\ud800\udc00") is one astral
    # code point on the wire, whatever two code points the Python string held.
    text = json.loads(json.dumps(text))
    storable = is_storable(text)

    def check(response: httpx.Response, field: str) -> bool:
        assert response.status_code < 500, response.text
        if not storable:
            _refused(response, field)
        return response.is_success

    conversations = len(json_of(alice.get("conversations")))
    created = _post_raw(alice, "conversations", {"agent_id": "general", "title": text})
    if check(created, "title"):
        room = created.json()["id"]
        assert created.json()["title"] == text
        assert json_of(alice.get(f"conversations/{room}"))["title"] == text
    else:
        assert len(json_of(alice.get("conversations"))) == conversations
        room = _room(alice)

    events = len(_journal(alice, room))
    sent = _post_raw(alice, f"conversations/{room}/messages",
                     {"text": text, "idempotency_key": text})
    if check(sent, "text"):
        accepted = [e for e in _journal(alice, room) if e["type"] == "input.accepted"]
        assert accepted[-1]["data"]["text"] == text
        again = _post_raw(alice, f"conversations/{room}/messages",
                          {"text": text, "idempotency_key": text})
        assert again.status_code == 202 and again.json() == sent.json()  # the same key
    else:
        assert len(_journal(alice, room)) == events

    before = json_of(alice.get("members/me/settings"))
    put = _post_raw(alice, "members/me/settings", {"approval_mode": "always_ask",
                                                   "model": text}, "PUT")
    if check(put, "model"):
        assert json_of(alice.get("members/me/settings"))["model"] == text
        assert alice.put("members/me/settings",
                         json={"approval_mode": before["approval_mode"],
                               "model": before["model"]}).status_code == 200
    else:
        assert json_of(alice.get("members/me/settings")) == before

    artifact = _artifact(server)
    renamed = _post_raw(alice, f"artifacts/{artifact}", {"title": text}, "PATCH")
    if check(renamed, "title"):
        assert renamed.json()["title"] == text
        assert json_of(alice.get(f"artifacts/{artifact}"))["title"] == text
        listed = {a["id"]: a["title"] for a in json_of(alice.get("artifacts"))}
        assert listed[artifact] == text
        disposition = alice.get(f"artifacts/{artifact}/download").headers["content-disposition"]
        stem = _SAFE_NAME.sub("_", text).strip(" .") or "artifact"
        name = stem if stem.endswith(".md") else stem + ".md"
        assert disposition == f'attachment; filename="{name}"'
    else:
        assert json_of(alice.get(f"artifacts/{artifact}"))["title"] == "Before"
