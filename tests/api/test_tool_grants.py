""""Allow for this conversation" through REST against a real server and a scripted model.

Under ``always_ask`` every ``create_artifact`` call asks. Approving one with ``scope:
"conversation"`` makes a grant for exactly (that member, that conversation, that tool): later
calls there run without a card, with an audit row that says the grant answered; another
conversation, another member in the same shared room, and a revoked grant ask again; and the
grant answers only the approval gate — a denying guardrail, an operator guardrail's own demand
for approval, a revoked permission and a sensitive tool are untouched by it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import BACKENDS, scripted_server, tool_call_audit
from tests.lanes.test_turns import _events, _pending_approval, _send, _settled
from tests.support.grant_guard_plugin import DENIED_TITLE, REVIEWED_TITLE
from tests.support.server import ServerProcess

TOOL = "create_artifact"


def _save(title: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": TOOL, "arguments": {
        "title": title, "kind": "markdown", "content": f"# {title}\n"}}]}


# One script per message text (each conversation replays its own script from the start).
SCRIPTS: list[dict[str, Any]] = [
    *({"match": f"save note {n}", "responses": [_save(f"Note {n}"), {"text": f"Saved {n}."}]}
      for n in range(1, 12)),
    {"match": "save the forbidden one", "responses": [_save(f"{DENIED_TITLE} note"),
                                                      {"text": "Tried."}]},
    {"match": "save the reviewed one", "responses": [_save(f"{REVIEWED_TITLE} note"),
                                                     {"text": "Reviewed."}]},
    {"match": "launch the probe", "responses": [
        {"tool_calls": [{"name": "launch_probe", "arguments": {"target": "lab-1"}}]},
        {"text": "Launched."}]},
    # The four ways a call is authorized, each its own script.
    *({"match": f"record {how}", "responses": [_save(f"Record {how}"), {"text": "Recorded."}]}
      for how in ("once", "by grant", "again by grant", "unasked", "declined")),
    {"match": "look it up", "responses": [
        {"tool_calls": [{"name": "search_about", "arguments": {"query": "approvals"}}]},
        {"text": "Looked up."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def grant_server(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"grant-server-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS, extra_env={
            "KAIZEN_PLUGINS": "tests.support.grant_guard_plugin"}) as proc:
        for member in ("alice", "bob", "carol"):
            with proc.client(member) as client:
                assert client.put("members/me/settings",
                                  json={"approval_mode": "always_ask"}).status_code == 200
        yield proc


def _grant_room(client: httpx.Client, shared: bool = False) -> str:
    response = client.post("conversations", json={"agent_id": "granted", "shared": shared})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _approve(client: httpx.Client, approval_id: str, scope: str = "call") -> httpx.Response:
    return client.post(f"approvals/{approval_id}", json={"decision": "approve",
                                                         "scope": scope})


def _grants(client: httpx.Client, room: str) -> list[str]:
    response = client.get(f"conversations/{room}/tool-grants")
    assert response.status_code == 200, response.text
    return [g["tool"] for g in response.json()]


def _asked(client: httpx.Client, room: str, run_id: str) -> list[dict[str, Any]]:
    return [e for e in _events(client, room, run_id) if e["type"] == "approval.requested"]


def _settled_call(client: httpx.Client, room: str, run_id: str) -> dict[str, Any]:
    [settled] = [e["data"] for e in _events(client, room, run_id)
                 if e["type"] == "tool.settled"]
    return dict(settled)


def _allow_here(client: httpx.Client, room: str, text: str) -> dict[str, Any]:
    """Send ``text``; approve its card for the rest of the conversation; the settled run."""
    accepted = _send(client, room, text)
    approval = _pending_approval(client, accepted["run_id"])
    decided = _approve(client, approval["id"], "conversation")
    assert decided.status_code == 200, decided.text
    assert decided.json()["scope"] == "conversation"
    run = _settled(client, accepted["run_id"])
    assert run["status"] == "completed", run
    return {"run_id": accepted["run_id"], "approval_id": approval["id"]}


def _runs_unasked(client: httpx.Client, room: str, text: str) -> str:
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"])
    assert _asked(client, room, accepted["run_id"]) == []
    assert run["status"] == "completed", run
    assert _settled_call(client, room, accepted["run_id"])["outcome"] == "ok"
    return str(accepted["run_id"])


def _asks(client: httpx.Client, room: str, text: str) -> dict[str, Any]:
    """``text`` asks for approval again; the card is denied so the run ends."""
    accepted = _send(client, room, text)
    approval = _pending_approval(client, accepted["run_id"])
    assert client.post(f"approvals/{approval['id']}",
                       json={"decision": "deny"}).status_code == 200
    _settled(client, accepted["run_id"])
    return approval


@pytest.mark.rule("R-224", "R-240", "R-377")
def test_allowing_a_tool_for_the_conversation_answers_its_later_calls_there(
        grant_server: ServerProcess) -> None:
    with grant_server.client("alice") as alice:
        room = _grant_room(alice)
        first = _allow_here(alice, room, "save note 1")
        assert _grants(alice, room) == [TOOL]
        # The card's own call still consumed its one-shot receipt.
        consumed = alice.get("approvals", params={"status": "consumed"}).json()
        assert first["approval_id"] in [a["id"] for a in consumed]
        decided = [e["data"] for e in _events(alice, room, first["run_id"])
                   if e["type"] == "approval.decided"]
        assert decided == [{"approval_id": first["approval_id"], "decision": "approved",
                            "tool": TOOL, "scope": "conversation"}]

        later = _runs_unasked(alice, room, "save note 2")
        # The audit keeps a grant-answered call apart from a one-shot approval: the
        # card's own call was the approval's, the later one the grant's.
        [row] = tool_call_audit(grant_server, later)
        assert row["authorization"]["by"] == "conversation_grant", row
        assert row["authorization"]["grant"]["approval_id"] == first["approval_id"]
        [one_shot] = tool_call_audit(grant_server, first["run_id"])
        assert one_shot["authorization"]["by"] == "one_shot_approval", one_shot
        assert one_shot["authorization"]["approval_id"] == first["approval_id"]


@pytest.mark.rule("R-377")
def test_each_call_audits_what_authorized_it(grant_server: ServerProcess) -> None:
    """A read, a one-shot approval, a standing grant and Never ask each leave their own
    authorization on the call's audit row; a declined call has none, since nothing let it
    run. (Never ask is recorded for a member-store write too: Always ask would have asked.)"""
    with grant_server.client("alice") as alice, grant_server.client("carol") as carol:
        room = _grant_room(alice)
        read = _runs_unasked(alice, room, "look it up")

        accepted = _send(alice, room, "record once")
        once = _pending_approval(alice, accepted["run_id"])
        assert _approve(alice, once["id"]).status_code == 200
        assert _settled(alice, accepted["run_id"])["status"] == "completed"

        grant_room = _grant_room(alice)
        made = _allow_here(alice, grant_room, "record by grant")
        by_grant = _runs_unasked(alice, grant_room, "record again by grant")

        declined = _asks(alice, _grant_room(alice), "record declined")

        assert carol.put("members/me/settings",
                         json={"approval_mode": "never_ask"}).status_code == 200
        try:
            unasked = _runs_unasked(carol, _grant_room(carol), "record unasked")
        finally:
            assert carol.put("members/me/settings",
                             json={"approval_mode": "always_ask"}).status_code == 200

    def authorization(run_id: str) -> Any:
        [row] = tool_call_audit(grant_server, run_id)
        assert row["outcome"] == "ok", row
        return row["authorization"]

    assert authorization(read) == {"by": "not_required", "mode": "always_ask",
                                   "run_id": read}
    assert authorization(accepted["run_id"]) == {
        "by": "one_shot_approval", "mode": "always_ask", "approval_id": once["id"],
        "run_id": accepted["run_id"]}
    assert authorization(made["run_id"]) == {
        "by": "one_shot_approval", "mode": "always_ask", "approval_id": made["approval_id"],
        "run_id": made["run_id"]}
    assert authorization(by_grant) == {
        "by": "conversation_grant", "mode": "always_ask", "run_id": by_grant,
        "grant": {"conversation_id": grant_room, "tool": TOOL,
                  "approval_id": made["approval_id"]}}
    assert authorization(unasked) == {"by": "never_ask", "mode": "never_ask",
                                      "run_id": unasked}
    # The declined call never ran: nothing in the audit says anything authorized it.
    assert [row["authorization"] for row in tool_call_audit(grant_server, declined["run_id"])
            if "authorization" in row] in ([], [None])


@pytest.mark.rule("R-034")
def test_a_grant_never_crosses_conversations_or_members(grant_server: ServerProcess) -> None:
    with grant_server.client("alice") as alice, grant_server.client("bob") as bob, \
            grant_server.client("carol") as carol:
        shared = _grant_room(alice, shared=True)
        assert alice.post(f"conversations/{shared}/participants",
                          json={"member": "bob"}).status_code == 200
        _allow_here(alice, shared, "save note 3")
        other = _grant_room(alice)
        # Same member, another conversation: asks.
        _asks(alice, other, "save note 4")
        assert _grants(alice, other) == []
        # Another member in the same shared room: asks, and sees no grant of theirs.
        _asks(bob, shared, "save note 5")
        assert _grants(bob, shared) == []
        # Nor can they revoke alice's; a non-participant cannot even see the room.
        refused = bob.delete(f"conversations/{shared}/tool-grants/{TOOL}")
        assert refused.status_code == 404 and refused.json()["error"]["code"] == \
            "grant_not_found"
        hidden = carol.get(f"conversations/{shared}/tool-grants")
        assert hidden.status_code == 404
        assert hidden.json()["error"]["code"] == "conversation_not_found"
        assert _grants(alice, shared) == [TOOL]
        _runs_unasked(alice, shared, "save note 6")


def test_a_revoked_grant_asks_again(grant_server: ServerProcess) -> None:
    with grant_server.client("alice") as alice:
        room = _grant_room(alice)
        _allow_here(alice, room, "save note 7")
        revoked = alice.delete(f"conversations/{room}/tool-grants/{TOOL}")
        assert revoked.status_code == 200, revoked.text
        assert revoked.json()["revoked"]["tool"] == TOOL
        assert _grants(alice, room) == []
        assert _asks(alice, room, "save note 8")["tool"] == TOOL
        again = alice.delete(f"conversations/{room}/tool-grants/{TOOL}")
        assert again.status_code == 404 and again.json()["error"]["code"] == "grant_not_found"


@pytest.mark.rule("R-237", "R-240")
def test_a_grant_does_not_answer_a_denying_guardrail_or_an_operators_demand(
        grant_server: ServerProcess) -> None:
    with grant_server.client("alice") as alice:
        room = _grant_room(alice)
        _allow_here(alice, room, "save note 9")
        # The denying guardrail still refuses: nothing ran, nobody was asked.
        accepted = _send(alice, room, "save the forbidden one")
        _settled(alice, accepted["run_id"])
        assert _asked(alice, room, accepted["run_id"]) == []
        settled = _settled_call(alice, room, accepted["run_id"])
        assert settled["outcome"] == "error" and "not allowed on this server" in \
            settled["content"], settled
        titles = [a["title"] for a in alice.get("artifacts").json()]
        assert not any(DENIED_TITLE in t for t in titles), titles
        # An operator guardrail's demand for approval is not the member's to waive.
        assert _asks(alice, room, "save the reviewed one")["tool"] == TOOL


@pytest.mark.rule("R-204", "R-226")
def test_a_grant_does_not_outlast_a_revoked_permission(grant_server: ServerProcess) -> None:
    with grant_server.client("alice") as alice, grant_server.client("dave") as dave:
        room = _grant_room(alice)
        _allow_here(alice, room, "save note 10")
        assert dave.put(f"admin/tool-policies/{TOOL}/alice",
                        json={"allowed": False}).status_code == 200
        try:
            accepted = _send(alice, room, "save note 11")
            _settled(alice, accepted["run_id"])
            assert _asked(alice, room, accepted["run_id"]) == []
            settled = _settled_call(alice, room, accepted["run_id"])
            assert settled["outcome"] == "error"
            assert "do not currently have permission" in settled["content"], settled
        finally:
            assert dave.delete(f"admin/tool-policies/{TOOL}/alice").status_code == 204


@pytest.mark.rule("R-152")
def test_a_tool_that_asks_every_time_cannot_be_allowed_for_the_conversation(
        grant_server: ServerProcess) -> None:
    with grant_server.client("alice") as alice:
        room = _grant_room(alice)
        accepted = _send(alice, room, "launch the probe")
        approval = _pending_approval(alice, accepted["run_id"])
        refused = _approve(alice, approval["id"], "conversation")
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "grant_not_allowed"
        # Nothing was decided: the card still waits, and no grant exists.
        pending = alice.get("approvals", params={"status": "pending"}).json()
        assert approval["id"] in [a["id"] for a in pending]
        assert _grants(alice, room) == []
        # A deny cannot carry a scope either (schema), and the plain approve still works.
        bad = alice.post(f"approvals/{approval['id']}",
                         json={"decision": "deny", "scope": "conversation"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "schema_violation"
        assert _approve(alice, approval["id"]).status_code == 200
        assert _settled(alice, accepted["run_id"])["status"] == "completed"


def test_the_grant_routes_are_in_the_openapi_document(grant_server: ServerProcess) -> None:
    with grant_server.client("alice") as alice:
        document = alice.get("openapi.json").json()
    paths = document["paths"]
    assert set(paths["/kaizen/api/conversations/{conversation_id}/tool-grants"]) == {"get"}
    assert set(paths["/kaizen/api/conversations/{conversation_id}/tool-grants/{tool}"]) == {
        "delete"}
    decision = document["components"]["schemas"]["ApprovalDecision"]
    assert decision["properties"]["scope"]["enum"] == ["call", "conversation"]

