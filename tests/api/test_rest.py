"""The REST contract (API.md) through a real Jupyter server process."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from tests.support.server import SERVER_TOKEN, ServerProcess, json_of


def _create(client: httpx.Client, *, shared: bool = False, **extra: Any) -> dict[str, Any]:
    response = client.post("conversations", json={"agent_id": "general", "shared": shared,
                                                  **extra})
    assert response.status_code == 201, response.text
    return dict(response.json())


def _journal(client: httpx.Client, room: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"conversations/{room}/journal", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _inputs(client: httpx.Client, room: str) -> list[dict[str, Any]]:
    events = _journal(client, room, limit=1000)["events"]
    return [e for e in events if e["type"] == "input.accepted"]


def _assert_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    body = json_of(response)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert "Traceback" not in body["error"]["message"]
    if code:
        assert body["error"]["code"] == code


def test_unauthenticated_requests_are_refused(server: ServerProcess) -> None:
    with server.client(None) as anonymous:
        _assert_error(anonymous.get("agents"), 401)
        _assert_error(anonymous.post("conversations", json={"agent_id": "general"}), 401)


def test_default_agents_are_seeded(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        agents = {a["name"]: a for a in alice.get("agents").json()}
        assert {"General", "Search"} <= set(agents)
        assert agents["General"]["mode"] == "chat" and agents["Search"]["mode"] == "search"
        assert alice.get("agents/general").json()["version"] == 1
        _assert_error(alice.get("agents/nope"), 404, "agent_not_found")


def test_create_list_and_get_a_conversation(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        created = _create(alice, title="Sales analysis")
        assert created["owner"] == "alice" and created["shared"] is False
        assert created["audience_version"] == 1 and created["title"] == "Sales analysis"
        assert created["id"] in {c["id"] for c in alice.get("conversations").json()}
        assert alice.get(f"conversations/{created['id']}").json()["id"] == created["id"]


def test_server_owner_token_is_one_stable_member(server: ServerProcess) -> None:
    headers = {"Authorization": f"token {SERVER_TOKEN}"}
    with httpx.Client(base_url=server.base_url + "kaizen/api/", headers=headers) as owner:
        room = _create(owner)
        assert room["id"] in {c["id"] for c in owner.get("conversations").json()}


def test_another_members_private_conversation_is_not_found(server: ServerProcess) -> None:
    with server.client("alice") as alice, server.client("bob") as bob:
        room = _create(alice)["id"]
        _assert_error(bob.get(f"conversations/{room}"), 404, "conversation_not_found")
        _assert_error(bob.get(f"conversations/{room}/journal"), 404)
        _assert_error(bob.post(f"conversations/{room}/messages", json={"text": "hi"}), 404)
        assert room not in {c["id"] for c in bob.get("conversations").json()}


def test_shared_room_journal_is_for_participants_and_removal_is_immediate(
    server: ServerProcess,
) -> None:
    with server.client("alice") as alice, server.client("bob") as bob, \
            server.client("carol") as carol:
        room = _create(alice, shared=True)["id"]
        alice.post(f"conversations/{room}/messages", json={"text": "before bob"})
        _assert_error(bob.get(f"conversations/{room}/journal"), 404)

        added = alice.post(f"conversations/{room}/participants", json={"member": "bob"})
        assert added.status_code == 200 and added.json()["audience_version"] == 2
        texts = [e["data"].get("text") for e in _journal(bob, room)["events"]]
        assert "before bob" in texts
        _assert_error(carol.get(f"conversations/{room}/journal"), 404)

        # A participant who is not the owner cannot change the roster.
        _assert_error(bob.post(f"conversations/{room}/participants",
                               json={"member": "carol"}), 403, "owner_only")
        # A stranger cannot even learn that the room exists.
        _assert_error(carol.post(f"conversations/{room}/participants",
                                 json={"member": "carol"}), 404)

        removed = alice.delete(f"conversations/{room}/participants/bob")
        assert removed.status_code == 200 and removed.json()["audience_version"] == 3
        _assert_error(bob.get(f"conversations/{room}/journal"), 404)
        _assert_error(bob.post(f"conversations/{room}/messages", json={"text": "x"}), 404)


def test_private_conversation_takes_no_participants(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        room = _create(alice)["id"]
        _assert_error(alice.post(f"conversations/{room}/participants",
                                 json={"member": "bob"}), 409, "conversation_private")


def test_message_is_accepted_into_the_journal(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        room = _create(alice)["id"]
        response = alice.post(f"conversations/{room}/messages", json={"text": "hello"})
        assert response.status_code == 202
        accepted = response.json()
        assert set(accepted) == {"input_id", "position", "run_id"}
        assert accepted["position"] == 1
        events = _journal(alice, room)["events"]
        assert (events[0]["seq"], events[0]["type"]) == (1, "input.accepted")
        assert events[0]["data"]["input_id"] == accepted["input_id"]
        assert events[0]["run_id"] == accepted["run_id"]
        run = alice.get(f"runs/{accepted['run_id']}").json()
        assert run["input_position"] == 1 and run["member"] == "alice"
        with server.client("bob") as bob:
            _assert_error(bob.get(f"runs/{accepted['run_id']}"), 404, "run_not_found")


def test_same_idempotency_key_gets_the_same_answer_and_writes_nothing(
    server: ServerProcess,
) -> None:
    with server.client("alice") as alice:
        room = _create(alice)["id"]
        body = {"text": "only once", "idempotency_key": "key-1"}
        first = alice.post(f"conversations/{room}/messages", json=body)
        second = alice.post(f"conversations/{room}/messages", json=body)
        assert first.status_code == second.status_code == 202
        assert first.json() == second.json()
        assert len(_inputs(alice, room)) == 1
        conflict = alice.post(f"conversations/{room}/messages",
                              json={"text": "something else", "idempotency_key": "key-1"})
        _assert_error(conflict, 409, "idempotency_key_reused")
        assert len(_inputs(alice, room)) == 1


def test_journal_pages_with_after_and_limit(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        room = _create(alice)["id"]
        for i in range(7):
            alice.post(f"conversations/{room}/messages", json={"text": f"m{i}"})
        everything = _journal(alice, room, limit=1000)["events"]
        seqs = [e["seq"] for e in everything]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 7
        paged: list[int] = []
        after = 0
        while True:
            page = _journal(alice, room, after=after, limit=3)
            if not page["events"]:
                assert page == {"events": [], "next": after}
                break
            assert len(page["events"]) <= 3
            paged += [e["seq"] for e in page["events"]]
            after = page["next"]
            assert after == paged[-1]
        assert paged[:len(seqs)] == seqs  # no gap, no duplicate
        _assert_error(alice.get(f"conversations/{room}/journal", params={"limit": 0}), 400)
        _assert_error(alice.get(f"conversations/{room}/journal", params={"after": "x"}), 400)


class TestBadInputWritesNothing:
    def _count(self, client: httpx.Client, room: str) -> int:
        return len(_journal(client, room, limit=1000)["events"])

    def test_malformed_json_is_400(self, server: ServerProcess) -> None:
        with server.client("alice") as alice:
            room = _create(alice)["id"]
            response = alice.post(f"conversations/{room}/messages", content=b"{not json",
                                  headers={"Content-Type": "application/json"})
            _assert_error(response, 400, "malformed_json")
            _assert_error(alice.post("conversations", content=b"[1,"), 400, "malformed_json")
            assert self._count(alice, room) == 0

    @pytest.mark.parametrize("body", [
        {},
        {"text": ""},
        {"text": 42},
        {"text": "hi", "kind": "shout"},
        {"text": "hi", "unexpected": True},
        ["text"],
    ])
    def test_schema_violation_is_422(self, server: ServerProcess, body: Any) -> None:
        with server.client("alice") as alice:
            room = _create(alice)["id"]
            _assert_error(alice.post(f"conversations/{room}/messages", json=body), 422,
                          "schema_violation")
            assert self._count(alice, room) == 0

    def test_unknown_ids_are_404(self, server: ServerProcess) -> None:
        with server.client("alice") as alice:
            missing = uuid.uuid4().hex
            _assert_error(alice.get(f"conversations/{missing}"), 404)
            _assert_error(alice.post(f"conversations/{missing}/messages",
                                     json={"text": "hi"}), 404)
            _assert_error(alice.get(f"runs/{missing}"), 404)
            before = len(alice.get("conversations").json())
            _assert_error(alice.post("conversations", json={"agent_id": "missing"}), 404,
                          "agent_not_found")
            assert len(alice.get("conversations").json()) == before

    def test_message_over_the_bound_is_413(self, server: ServerProcess) -> None:
        with server.client("alice") as alice:
            room = _create(alice)["id"]
            too_big = "x" * (256 * 1024 + 1)
            _assert_error(alice.post(f"conversations/{room}/messages", json={"text": too_big}),
                          413, "message_too_large")
            # Multi-byte text is measured in bytes, not characters.
            wide = "é" * (128 * 1024 + 1)
            _assert_error(alice.post(f"conversations/{room}/messages", json={"text": wide}),
                          413)
            assert self._count(alice, room) == 0
            ok = alice.post(f"conversations/{room}/messages", json={"text": "x" * 256 * 1024})
            assert ok.status_code == 202


def test_member_settings_round_trip(server: ServerProcess) -> None:
    with server.client("carol") as carol:
        assert carol.get("members/me/settings").json()["approval_mode"] == "ask_for_writes"
        put = carol.put("members/me/settings", json={"approval_mode": "always_ask",
                                                     "model": "small"})
        assert put.status_code == 200 and put.json()["approval_mode"] == "always_ask"
        assert carol.get("members/me/settings").json()["model"] == "small"
        _assert_error(carol.put("members/me/settings", json={"approval_mode": "yolo"}), 422)
        assert carol.get("members/me/settings").json()["approval_mode"] == "always_ask"


def test_admin_role_comes_from_configuration(server: ServerProcess) -> None:
    with server.client("dave") as dave, server.client("alice") as alice:
        assert dave.get("members/me").json() == {"member": "dave", "admin": True}
        assert alice.get("members/me").json() == {"member": "alice", "admin": False}


def test_openapi_document_is_valid_and_covers_the_routes(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        document = alice.get("openapi.json").json()
    validate(document)
    assert document["openapi"].startswith("3.1")
    for path in ("/kaizen/api/agents", "/kaizen/api/conversations",
                 "/kaizen/api/conversations/{conversation_id}/messages",
                 "/kaizen/api/conversations/{conversation_id}/journal"):
        assert path in document["paths"]


def test_cookie_clients_must_present_the_xsrf_token(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url) as browser:
        # Logging in with the token sets the login cookie, like JupyterLab's first load.
        login = browser.get("kaizen/api/agents", params={"token": SERVER_TOKEN})
        assert login.status_code == 200
        browser.get("lab")  # the JupyterLab page sets the _xsrf cookie
        assert browser.get("kaizen/api/agents").status_code == 200  # cookie alone reads
        refused = browser.post("kaizen/api/conversations", json={"agent_id": "general"})
        assert refused.status_code == 403
        xsrf = browser.cookies.get("_xsrf")
        assert xsrf
        accepted = browser.post("kaizen/api/conversations", json={"agent_id": "general"},
                                headers={"X-XSRFToken": xsrf})
        assert accepted.status_code == 201, accepted.text


def test_a_header_token_gets_no_login_cookie_and_a_url_token_does(
        server: ServerProcess) -> None:
    """A client that authenticates with the Authorization header sends it again each time:
    it is answered without a login cookie. A token in the URL, as a browser opening a link
    has it, still logs the browser in."""
    with server.client("alice") as api:
        first = api.get("members/me")
        assert first.status_code == 200
        assert first.json()["member"] == "alice"
        assert "set-cookie" not in first.headers, first.headers
        assert not api.cookies
        assert api.get("members/me").json()["member"] == "alice"  # the header, every time
    with httpx.Client(base_url=server.base_url) as browser:
        login = browser.get("kaizen/api/members/me", params={"token": SERVER_TOKEN})
        assert login.status_code == 200
        assert browser.cookies, "the URL token logs the browser in"
        me = browser.get("kaizen/api/members/me")  # the cookie alone
        assert me.status_code == 200
        assert me.json()["member"] == login.json()["member"]


def test_every_route_is_documented_in_openapi() -> None:
    import re

    from kaizen_server_extension.api.handlers import routes
    from kaizen_server_extension.api.openapi import openapi_document
    from kaizen_server_extension.api.params import UnknownPathHandler

    # "1" is both an id and a number: every path parameter's pattern takes it.
    documented = [re.sub(r"\{[^}]+\}", "1", p) for p in openapi_document()["paths"]]
    for pattern, handler in routes():
        if pattern.endswith("/events") or handler is UnknownPathHandler:
            continue  # the websocket is described in API.md; the catch-all is no route
        assert any(re.fullmatch(pattern, path) for path in documented), pattern
