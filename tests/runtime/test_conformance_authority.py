"""The initiating member is the only authority for a turn in a shared room, end to end
(spec: Actor-specific execution in one shared room).

A real server and the fake model: tool permissions, the approval mode, who may decide an
approval, whose library a write lands in, and whose sandbox (kernel, workspace, callback
permissions) runs the code all resolve for the member who sent the message (R-034). Being in
the owner's room borrows nothing from the owner, and the room never merges or intersects its
participants' privileges: one member's denial does not bind another (R-035).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import BACKENDS, scripted_server
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.server import ServerProcess, json_of

TOOL = "list_available_agents"
POLICIES = "admin/tool-policies"
NOTE = {"title": "Authority note", "kind": "markdown", "content": "# Whose note\n"}
KEEP = 'kept_value = "alice-only"\nopen("mine.txt", "w").write("alice")\nprint("kept")\n'
PEEK = """
import json, os
try:
    roster = sorted(a["name"] for a in tools.call("list_available_agents")["agents"])
except Exception as exc:
    roster = "refused: " + str(exc)
print("PEEK " + json.dumps({"kept": globals().get("kept_value"),
                            "file": os.path.exists("mine.txt"), "roster": roster}))
"""
SCRIPTS: list[dict[str, Any]] = [
    {"match": "keep a value", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": KEEP, "persistent": True, "artifact_targets": []}}]},
        {"text": "Kept."}]},
    {"match": "peek into the kernel", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": PEEK, "persistent": True, "artifact_targets": []}}]},
        {"text": "Peeked."}]},
    {"match": "who can help", "responses": [
        {"tool_calls": [{"name": TOOL, "arguments": {}}]},
        {"text": "Here is the roster."}]},
    {"match": "save a note", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": NOTE}]},
        {"text": "Saved."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def authority_server(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"authority-server-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS) as proc:
        yield proc


def _shared_room(owner: httpx.Client, *members: str) -> str:
    created = owner.post("conversations", json={"agent_id": "general", "shared": True})
    assert created.status_code == 201, created.text
    room = str(created.json()["id"])
    for member in members:
        assert owner.post(f"conversations/{room}/participants",
                          json={"member": member}).status_code == 200
    return room


def _tool_outcome(client: httpx.Client, room: str, text: str) -> tuple[str, dict[str, Any]]:
    """Send ``text``; the run's member and its one settled call."""
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"])
    (settled,) = [e for e in _events(client, room, accepted["run_id"])
                  if e["type"] == "tool.settled"]
    return str(run["member"]), dict(settled["data"])


def _set_policy(admin: httpx.Client, member: str, allowed: bool) -> None:
    response = admin.put(f"{POLICIES}/{TOOL}/{member}", json={"allowed": allowed})
    assert response.status_code == 200, response.text


def _clear_policy(admin: httpx.Client, member: str) -> None:
    assert admin.delete(f"{POLICIES}/{TOOL}/{member}").status_code in (200, 204)


@pytest.mark.rule("R-034", "R-035")
def test_tool_permissions_resolve_for_the_sender_never_the_owner_or_the_room(
        authority_server: ServerProcess) -> None:
    with authority_server.client("alice") as alice, authority_server.client("bob") as bob, \
            authority_server.client("dave") as dave:
        room = _shared_room(alice, "bob")
        try:
            # bob may not use the tool; alice, the room's owner, may. bob's turn in alice's
            # room is refused: it does not borrow the owner's permission.
            _set_policy(dave, "bob", allowed=False)
            member, call = _tool_outcome(bob, room, "who can help bob?")
            assert member == "bob"
            assert call["name"] == TOOL and call["outcome"] == "error"
            assert "permission" in call["content"]
            member, call = _tool_outcome(alice, room, "who can help alice?")
            assert (member, call["outcome"]) == ("alice", "ok")
            assert "General" in call["content"]

            # The other way round: the owner is denied, bob is not. A room that intersected
            # its participants' privileges would refuse bob too; it does not.
            _clear_policy(dave, "bob")
            _set_policy(dave, "alice", allowed=False)
            member, call = _tool_outcome(alice, room, "who can help alice now?")
            assert (member, call["outcome"]) == ("alice", "error")
            member, call = _tool_outcome(bob, room, "who can help bob now?")
            assert (member, call["outcome"]) == ("bob", "ok")
        finally:
            for who in ("alice", "bob"):
                dave.delete(f"{POLICIES}/{TOOL}/{who}")


def _wait_for_pending(client: httpx.Client, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pending = [a for a in json_of(client.get("approvals", params={"status": "pending"}))
                   if a["run_id"] == run_id]
        if pending:
            return dict(pending[0])
        time.sleep(0.05)
    raise AssertionError(f"no pending approval for run {run_id}")


@pytest.mark.rule("R-034", "R-035")
def test_the_approval_mode_the_decision_and_the_library_are_the_senders(
        authority_server: ServerProcess) -> None:
    with authority_server.client("alice") as alice, authority_server.client("bob") as bob:
        # The owner never asks; bob asks before every write.
        assert alice.put("members/me/settings",
                         json={"approval_mode": "never_ask"}).status_code == 200
        assert bob.put("members/me/settings",
                       json={"approval_mode": "always_ask"}).status_code == 200
        room = _shared_room(alice, "bob")

        accepted = _send(bob, room, "save a note for bob")
        approval = _wait_for_pending(bob, accepted["run_id"])
        assert approval["tool"] == "create_artifact"
        assert bob.get(f"runs/{accepted['run_id']}").json()["status"] == "awaiting_approval"
        # The owner of the room can neither see nor decide bob's approval.
        assert approval["id"] not in {a["id"] for a in json_of(alice.get("approvals"))}
        refused = alice.post(f"approvals/{approval['id']}", json={"decision": "approve"})
        assert refused.status_code == 404, refused.text
        assert json_of(refused)["error"]["code"] == "approval_not_found"
        assert bob.get(f"runs/{accepted['run_id']}").json()["status"] == "awaiting_approval"

        decided = bob.post(f"approvals/{approval['id']}", json={"decision": "approve"})
        assert decided.status_code == 200, decided.text
        run = _settled(bob, accepted["run_id"])
        assert run["status"] == "completed"
        (settled,) = [e["data"] for e in _events(bob, room, accepted["run_id"])
                      if e["type"] == "tool.settled"]
        assert settled["outcome"] == "ok"
        # The write ran as bob: the artifact is in bob's library, not the owner's.
        bobs = [a for a in json_of(bob.get("artifacts")) if a["title"] == NOTE["title"]]
        assert len(bobs) == 1 and bobs[0]["owner"] == "bob" and bobs[0]["author"] == "bob"
        assert NOTE["title"] not in {a["title"] for a in json_of(alice.get("artifacts"))}

        # The same request from the owner follows the owner's own mode: no card at all.
        mine = _send(alice, room, "save a note for alice")
        run = _settled(alice, mine["run_id"])
        assert run["status"] == "completed"
        types = [e["type"] for e in _events(alice, room, mine["run_id"])]
        assert "approval.requested" not in types and "tool.settled" in types
        owned = [a for a in json_of(alice.get("artifacts")) if a["title"] == NOTE["title"]]
        assert [a["owner"] for a in owned] == ["alice"]


def _peek(client: httpx.Client, room: str) -> dict[str, Any]:
    accepted = _send(client, room, "peek into the kernel")
    run = _settled(client, accepted["run_id"], timeout=120)
    (settled,) = [e["data"] for e in _events(client, room, accepted["run_id"])
                  if e["type"] == "tool.settled"]
    assert settled["outcome"] == "ok", (run, settled)
    stdout = json.loads(settled["content"])["stdout"]
    line = next(x for x in stdout.splitlines() if x.startswith("PEEK "))
    return dict(json.loads(line[len("PEEK "):]))


@pytest.mark.rule("R-034", "R-035")
def test_the_sandbox_and_its_callbacks_belong_to_the_sender(
        authority_server: ServerProcess) -> None:
    with authority_server.client("alice") as alice, authority_server.client("bob") as bob, \
            authority_server.client("dave") as dave:
        for client in (alice, bob):  # run_code is an isolated execution: no card here
            assert client.put("members/me/settings",
                              json={"approval_mode": "ask_for_writes"}).status_code == 200
        room = _shared_room(alice, "bob")
        try:
            _set_policy(dave, "bob", allowed=False)
            kept = _send(alice, room, "keep a value in the kernel")
            assert _settled(alice, kept["run_id"], timeout=120)["status"] == "completed"

            # bob's code in alice's room runs in bob's own kernel and workspace: none of the
            # owner's variables or files, and its tool callbacks carry bob's permissions.
            seen = _peek(bob, room)
            assert seen["kept"] is None and seen["file"] is False
            assert str(seen["roster"]).startswith("refused"), seen

            # The owner's kernel kept both, and her callbacks carry her own permissions.
            seen = _peek(alice, room)
            assert seen == {"kept": "alice-only", "file": True,
                            "roster": ["General", "Search"]}
        finally:
            dave.delete(f"{POLICIES}/{TOOL}/bob")
