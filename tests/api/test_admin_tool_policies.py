"""The admin tool-policy routes: admin only (404 to everyone else), bad input writes nothing,
and a revocation made over REST bites on the next tool call of a running turn."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import BACKENDS, scripted_server
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess

POLICIES = "admin/tool-policies"
SCRIPTS: list[dict[str, Any]] = [
    # Two calls of the same read tool, the second after a pause long enough for an admin
    # to revoke the tool while the turn is running.
    {"match": "look twice", "responses": [
        {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"delay_ms": 2500,
         "tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"text": "Both looks done."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def admin_server(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"admin-server-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS) as proc:
        yield proc


def _policies(client: httpx.Client, **params: str) -> list[dict[str, Any]]:
    response = client.get(POLICIES, params=params)
    assert response.status_code == 200, response.text
    return list(response.json())


def test_an_admin_sets_lists_and_deletes_a_policy(admin_server: ServerProcess) -> None:
    with admin_server.client("dave") as dave:
        put = dave.put(f"{POLICIES}/show_chat_canvas/bob", json={"allowed": False})
        assert put.status_code == 200, put.text
        assert put.json()["allowed"] is False and put.json()["updated_by"] == "dave"
        assert [(p["tool"], p["member"], p["allowed"])
                for p in _policies(dave, tool="show_chat_canvas")] == [
            ("show_chat_canvas", "bob", False)]
        # Setting again replaces the row; member * is everyone.
        assert dave.put(f"{POLICIES}/show_chat_canvas/bob",
                        json={"allowed": True}).json()["allowed"] is True
        assert dave.put(f"{POLICIES}/show_chat_canvas/*", json={"allowed": False}
                        ).status_code == 200
        assert {p["member"]: p["allowed"] for p in _policies(dave, tool="show_chat_canvas")
                } == {"bob": True, "*": False}
        assert dave.delete(f"{POLICIES}/show_chat_canvas/bob").status_code == 204
        assert dave.delete(f"{POLICIES}/show_chat_canvas/%2A").status_code == 204
        assert _policies(dave, tool="show_chat_canvas") == []
        again = dave.delete(f"{POLICIES}/show_chat_canvas/bob")
        assert again.status_code == 404 and again.json()["error"]["code"] == "policy_not_found"


def test_a_non_admin_gets_404_and_changes_nothing(admin_server: ServerProcess) -> None:
    with admin_server.client("alice") as alice, admin_server.client("dave") as dave:
        assert dave.put(f"{POLICIES}/visualize_read_me/carol",
                        json={"allowed": False}).status_code == 200
        for response in (alice.get(POLICIES),
                         alice.put(f"{POLICIES}/visualize_read_me/alice",
                                   json={"allowed": True}),
                         alice.put(f"{POLICIES}/visualize_read_me/carol", content=b"{nope"),
                         alice.delete(f"{POLICIES}/visualize_read_me/carol")):
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "not_found"
        assert [(p["member"], p["allowed"]) for p in
                _policies(dave, tool="visualize_read_me")] == [("carol", False)]
        assert dave.delete(f"{POLICIES}/visualize_read_me/carol").status_code == 204
    with httpx.Client(base_url=admin_server.base_url + "kaizen/api/") as anonymous:
        assert anonymous.get(POLICIES).status_code in (401, 403)


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    ("list_available_agents/bob", b"{not json", 400, "malformed_json"),
    ("list_available_agents/bob", b'{"allowed": "no"}', 422, "schema_violation"),
    ("list_available_agents/bob", b'{"allowed": false, "extra": 1}', 422, "schema_violation"),
    ("list_available_agents/bob", b"{}", 422, "schema_violation"),
    ("no_such_tool/bob", b'{"allowed": false}', 422, "unknown_tool"),
    ("list_available_agents/%20bob", b'{"allowed": false}', 422, "invalid_member"),
])
def test_bad_input_is_refused_and_writes_nothing(admin_server: ServerProcess, path: str,
                                                 body: bytes, status: int, code: str) -> None:
    with admin_server.client("dave") as dave:
        response = dave.put(f"{POLICIES}/{path}", content=body,
                            headers={"Content-Type": "application/json"})
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
        assert _policies(dave) == []
        assert dave.get(POLICIES, params={"tool": "bad name!"}).status_code == 400


@pytest.mark.rule("R-005", "R-204")
def test_a_revocation_over_rest_bites_on_the_next_call_of_a_running_turn(
    admin_server: ServerProcess,
) -> None:
    with admin_server.client("carol") as carol, admin_server.client("dave") as dave:
        room = _room(carol)
        accepted = _send(carol, room, "please look twice")
        deadline = time.monotonic() + 20
        while not any(e["type"] == "tool.settled"
                      for e in _events(carol, room, accepted["run_id"])):
            assert time.monotonic() < deadline, "the first tool call never settled"
            time.sleep(0.05)
        # The model's next step is still in flight (delayed): revoke now.
        revoked = dave.put(f"{POLICIES}/list_available_agents/carol", json={"allowed": False})
        assert revoked.status_code == 200, revoked.text
        try:
            run = _settled(carol, accepted["run_id"])
            settled = [e["data"] for e in _events(carol, room, accepted["run_id"])
                       if e["type"] == "tool.settled"]
        finally:
            dave.delete(f"{POLICIES}/list_available_agents/carol")
        assert [s["outcome"] for s in settled] == ["ok", "error"], settled
        assert "permission" in str(settled[1]).lower()
        assert run["status"] != "completed", run
        assert run["tool_calls"] == 2
