"""Credential-backed tools end to end, on both databases: a real server, the scripted fake
model, the echo API as the destination. The model passes only an opaque ``credential_ref``;
the broker sends the value in exactly one request to its own origin; the value never reaches
the tool result, the journal, the audit log, the model's requests or the server log; an
uncertain write is ambiguous and never retried; credential-shaped arguments never run."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.conftest import BACKENDS
from tests.credentials.world import CredentialWorld, credential_world
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.credential_agent_plugin import CREDENTIAL_AGENT

SECRET = "tok-Qz81-unique-credential-value-20261204"


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[CredentialWorld]:
    root = tmp_path_factory.mktemp(f"credential-broker-{request.param}")
    with credential_world(str(request.param), root) as built:
        for member in ("alice", "bob"):
            with built.server.client(member) as client:
                # Writes run without asking, so a test sees what the broker does with them.
                assert client.put("members/me/settings",
                                  json={"approval_mode": "never_ask"}).status_code == 200
        yield built


def _encodings(secret: str) -> list[str]:
    raw = secret.encode()
    return [secret, quote(secret, safe=""), base64.b64encode(raw).decode().rstrip("="),
            base64.urlsafe_b64encode(raw).decode().rstrip("=")]


def _leaks(text: str, secret: str = SECRET) -> list[str]:
    return [form for form in _encodings(secret) if form in text]


class Turn:
    def __init__(self, world: CredentialWorld, room: str, run: dict[str, Any]) -> None:
        self.world, self.room, self.run = world, room, run

    def settled(self, member: str = "alice") -> list[dict[str, Any]]:
        with self.world.server.client(member) as client:
            return [dict(e["data"]) for e in _events(client, self.room, self.run["id"])
                    if e["type"] == "tool.settled"]


def _turn(world: CredentialWorld, calls: list[tuple[str, dict[str, Any]]],
          member: str = "alice") -> Turn:
    text = f"please do step {time.monotonic_ns()}"
    world.fake.load([{"match": text, "responses": [
        *({"tool_calls": [{"name": name, "arguments": arguments}]}
          for name, arguments in calls), {"text": "Done."}]},
        {"responses": [{"text": "Default."}]}])
    with world.server.client(member) as client:
        created = client.post("conversations", json={"agent_id": CREDENTIAL_AGENT})
        assert created.status_code == 201, created.text
        room = str(created.json()["id"])
        accepted = _send(client, room, text)
        run = _settled(client, accepted["run_id"], timeout=90)
    return Turn(world, room, run)


def _request_receipts(world: CredentialWorld, ref: str) -> list[dict[str, Any]]:
    return [r for r in world.rows()["receipts"]
            if r["kind"] == "request" and r["credential_ref"] == ref]


@pytest.mark.rule("R-386", "R-391", "R-396", "R-443", "R-350", "R-397", "R-398")
def test_the_value_reaches_only_its_destination_and_nothing_else_sees_it(
        world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET)
    sent_before = len(world.received())
    turn = _turn(world, [("echo_whoami", {"credential_ref": ref})])
    assert turn.run["status"] == "completed", turn.run
    # Exactly one request reached the destination, carrying the value the member entered.
    received = world.received()[sent_before:]
    assert [(r["method"], r["path"]) for r in received] == [("GET", "/whoami")]
    assert received[0]["authorization"] == f"Bearer {SECRET}"
    # The API echoed the value back in several encodings; the tool result carries none.
    [settled] = turn.settled()
    assert settled["outcome"] == "ok"
    assert _leaks(settled["content"]) == [] and "[REDACTED]" in settled["content"]
    # Nothing the model was sent holds it: not the tool result, not any message.
    bodies = json.dumps(world.fake.requests())
    assert ref in bodies  # the model did see the opaque reference it passed
    assert _leaks(bodies) == []
    # Nor the journal, the audit log, the receipts or the server's log.
    rows = world.rows()
    assert _leaks(json.dumps(rows["journal"], default=str)) == []
    assert _leaks(json.dumps(rows["audit"], default=str)) == []
    assert _leaks(json.dumps(rows["receipts"], default=str)) == []
    assert _leaks(world.server.log()) == []
    # One credential-free receipt for the request, claimed and settled.
    [receipt] = _request_receipts(world, ref)
    assert receipt["status"] == "succeeded" and receipt["operation"] == "echo_whoami"
    assert receipt["effect"] == "read" and receipt["retention"] == "once"
    assert receipt["run_id"] == turn.run["id"]


@pytest.mark.rule("R-391", "R-393", "R-397")
def test_a_use_once_ref_is_spent_by_its_first_request(world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET)
    assert _turn(world, [("echo_whoami", {"credential_ref": ref})]).run["status"] == \
        "completed"
    sent = len(world.received())
    again = _turn(world, [("echo_whoami", {"credential_ref": ref})])
    [settled] = again.settled()
    assert settled["outcome"] == "error" and "enter the credential again" in settled["content"]
    assert len(world.received()) == sent  # nothing was sent
    with world.server.client("alice") as alice:
        assert ref not in json.dumps(alice.get("credentials").json())


@pytest.mark.rule("R-443", "R-350")
def test_a_ref_serves_only_its_member_and_its_destination(world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET, remember=True)
    first = _turn(world, [("echo_whoami", {"credential_ref": ref}),
                          ("echo_whoami", {"credential_ref": ref})])
    assert [s["outcome"] for s in first.settled()] == ["ok", "ok"]
    sent = len(world.received())
    # Bob holds the string but not the credential.
    stolen = _turn(world, [("echo_whoami", {"credential_ref": ref})], member="bob")
    [settled] = stolen.settled("bob")
    assert settled["outcome"] == "error" and "cannot be used" in settled["content"]
    # A credential entered for another destination is not this one's, even at one origin.
    form = world.issue("alice", destination="keyed")
    page = world.submit("alice", form["form_url"], value="keyed-value-987654321")
    keyed_ref = page.text.split('id="kz-credential-ref">')[1].split("<")[0]
    other = _turn(world, [("echo_whoami", {"credential_ref": keyed_ref})])
    [settled] = other.settled()
    assert settled["outcome"] == "error" and "cannot be used" in settled["content"]
    assert len(world.received()) == sent
    with world.server.client("alice") as alice:
        alice.delete(f"credentials/{ref}")


@pytest.mark.rule("R-399", "R-441", "R-446")
def test_an_uncertain_write_is_ambiguous_and_never_retried(world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET, remember=True)
    sent = len(world.received())
    turn = _turn(world, [("echo_hang_write", {"credential_ref": ref}),
                         ("echo_whoami", {"credential_ref": ref})])
    settled = turn.settled()
    # The write's outcome is unknown: it closed the turn, and the next call never ran.
    assert [s["name"] for s in settled] == ["echo_hang_write"]
    assert settled[0]["closes_turn"] is True
    assert "is unknown" in settled[0]["content"] and "Do not retry" in settled[0]["content"]
    assert turn.run["status"] == "failed", turn.run
    time.sleep(1.5)  # long enough for any retry to have shown up
    posts = [r for r in world.received()[sent:] if r["path"] == "/hang"]
    assert len(posts) == 1 and len(world.received()) == sent + 1
    [receipt] = _request_receipts(world, ref)
    assert receipt["status"] == "ambiguous" and receipt["effect"] == "write"
    with world.server.client("alice") as alice:
        alice.delete(f"credentials/{ref}")


@pytest.mark.rule("R-399")
def test_a_failed_read_is_a_bounded_error_the_turn_survives(world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET)
    turn = _turn(world, [("echo_hang_read", {"credential_ref": ref})])
    [settled] = turn.settled()
    assert settled["outcome"] == "error" and settled["closes_turn"] is False
    assert "failed" in settled["content"] and len(settled["content"]) < 600
    assert turn.run["status"] == "completed"
    [receipt] = _request_receipts(world, ref)
    assert receipt["status"] == "failed"


def test_a_write_that_was_answered_settles_its_receipt(world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET)
    turn = _turn(world, [("echo_create_order", {"credential_ref": ref, "item": "tea"})])
    [settled] = turn.settled()
    assert settled["outcome"] == "ok" and '"created": true' in settled["content"]
    [receipt] = _request_receipts(world, ref)
    assert receipt["status"] == "succeeded" and receipt["effect"] == "write"


@pytest.mark.rule("R-443")
def test_a_credential_is_never_sent_to_another_origin(world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET)
    sent = len(world.received())
    turn = _turn(world, [("echo_elsewhere", {"credential_ref": ref,
                                             "url": "http://127.0.0.1:9/whoami"})])
    [settled] = turn.settled()
    assert settled["outcome"] == "error" and "only sent there" in settled["content"]
    assert len(world.received()) == sent
    assert _request_receipts(world, ref) == []  # refused before any claim


@pytest.mark.rule("R-380")
def test_a_redirect_is_never_followed(world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET)
    sent = len(world.received())
    turn = _turn(world, [("echo_elsewhere", {"credential_ref": ref,
                                             "url": f"{world.origin}/redirect"})])
    [settled] = turn.settled()
    assert settled["outcome"] == "ok" and '"status": 302' in settled["content"]
    assert [r["path"] for r in world.received()[sent:]] == ["/redirect"]


@pytest.mark.rule("R-389")
def test_a_destination_revoked_after_the_ref_was_made_refuses_the_call(
        world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET, remember=True)
    world.set_policy("credentials__echo", "alice", False)
    try:
        sent = len(world.received())
        turn = _turn(world, [("echo_whoami", {"credential_ref": ref})])
        [settled] = turn.settled()
        assert settled["outcome"] == "error" and "not available to you" in settled["content"]
        assert len(world.received()) == sent
    finally:
        world.set_policy("credentials__echo", "alice", None)
        with world.server.client("alice") as alice:
            alice.delete(f"credentials/{ref}")


def test_a_call_without_a_ref_asks_for_one_and_sends_nothing(world: CredentialWorld) -> None:
    sent = len(world.received())
    turn = _turn(world, [("echo_whoami", {})])
    [settled] = turn.settled()
    assert settled["outcome"] == "error"  # the schema requires credential_ref
    assert len(world.received()) == sent


CARRYING = {
    "bearer_value": {"query": "use Bearer abcdefghijklmnopqrstu for this"},
    "url_userinfo": {"query": "x", "url": "https://user:hunter22@api.example.com/x"},
    "query_secret": {"query": "x", "url": "https://api.example.com/x?access_token=abc123xyz"},
    "credential_key": {"query": "x", "options": {"api_key": "abc123"}},
    "authorization_key": {"query": "x", "options": {"headers": {"Authorization": "t abc"}}},
    "jwt": {"query": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlMTIz"},
    "private_key": {"query": "-----BEGIN RSA PRIVATE KEY-----\nMIIB...\n"},
    "raw_ref": {"query": "x", "options": {"credential_ref": "sk-live-not-a-reference"}},
    "issuer_token": {"query": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"},
}


@pytest.mark.rule("R-349", "R-350")
@pytest.mark.parametrize("case", sorted(CARRYING))
def test_credential_shaped_arguments_are_refused_before_the_tool_runs(
        world: CredentialWorld, case: str) -> None:
    ran = world.notes_ran()
    turn = _turn(world, [("note_search", CARRYING[case])])
    [settled] = turn.settled()
    assert settled["outcome"] == "error"
    assert "credential-shaped" in settled["content"]
    assert world.notes_ran() == ran  # it never ran
    # The refusal says where (a key may be named), never what value.
    for value in _leaf_values(CARRYING[case]):
        assert value not in settled["content"]


def _leaf_values(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaf_values(item)]
    return [value] if isinstance(value, str) and len(value) > 3 else []


def test_ordinary_arguments_pass_the_screen(world: CredentialWorld) -> None:
    ran = world.notes_ran()
    turn = _turn(world, [("note_search", {"query": "token budget for the quarterly report",
                                          "url": "https://example.com/reports?page=2"})])
    [settled] = turn.settled()
    assert settled["outcome"] == "ok", settled
    assert world.notes_ran() == ran + 1
