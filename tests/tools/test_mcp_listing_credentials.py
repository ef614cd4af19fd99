"""Listing a credential-bound MCP server's tools with the member's credential, end to end on
both databases (docs/mcp.md, "Credentials"): a real Kaizen server, a real streamable-HTTP MCP
server on loopback that answers ``401`` to every request — ``tools/list`` included — without
its bearer token, the scripted fake model.

Discovery is per run, as the member: a member who remembered a credential for the server's
destination gets its tools, listed with that value (brokered: the bound origin only, a
credential-free receipt); a member without one gets none, with the reason
``credential_required``, and the run goes on; a value the server refuses gives
``credential_rejected``. The value never reaches the listing, the receipts or the log."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.credentials.test_broker_rest import _leaks
from tests.credentials.world import CredentialWorld
from tests.lanes.test_turns import _send, _settled
from tests.support.mcp_agent_plugin import MCP_AGENT
from tests.support.mcp_http_server import HttpMcp, start_http_mcp
from tests.support.tool_turns import settled_calls_of_turn

TOKEN = "list-tok-Qw81-locked-server-credential-20261206"


class World(CredentialWorld):
    locked: HttpMcp

    def remember(self, member: str, secret: str) -> str:
        form = self.issue(member, destination="locked-key")
        answer = self.submit(member, form["form_url"], value=secret, remember="yes")
        assert answer.status_code == 200, answer.text
        found = re.search(r'id="kz-credential-ref">(cref_[A-Za-z0-9_-]+)<', answer.text)
        assert found, answer.text
        return found.group(1)

    def listing(self, member: str) -> dict[str, Any]:
        with self.server.client(member) as client:
            response = client.get("tools", params={"agent_id": MCP_AGENT})
            assert response.status_code == 200, response.text
            return dict(response.json())


def _names(listing: dict[str, Any]) -> set[str]:
    return {t["name"] for t in listing["tools"]} | set(listing["deferred"])


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"mcp-listing-{request.param}")
    locked = start_http_mcp(root / "locked.jsonl", bearer=TOKEN)
    destinations = [{"id": "locked-key", "origin": locked.origin,
                     "scheme": {"kind": "bearer"}}]
    servers = [{"id": "locked", "transport": "http", "url": locked.url,
                "agents": [MCP_AGENT], "credential_destination": "locked-key"}]
    key = new_key_text()
    try:
        with FakeOpenAI([{"responses": [{"text": "Hello."}]}]) as fake, \
                served_by(str(request.param), root, fake, extra_env={
                    "KAIZEN_PLUGINS": "tests.support.mcp_agent_plugin",
                    "KAIZEN_CREDENTIALS_ENABLED": "1",
                    "KAIZEN_CREDENTIAL_KEY": key,
                    "KAIZEN_CREDENTIAL_REMEMBER_ENABLED": "1",
                    "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps(destinations),
                    "KAIZEN_MCP_SERVERS": json.dumps(servers)}) as server:
            built = World(server, fake, locked.origin, key, root / "unused.jsonl",
                          root / "unused-notes.jsonl")
            built.locked = locked
            yield built
    finally:
        locked.stop()


@pytest.mark.rule("R-065")
def test_a_member_without_a_credential_gets_no_tools_and_the_reason(world: World) -> None:
    refused, accepted = world.locked.http("refused"), world.locked.http("accepted")
    listing = world.listing("bob")
    assert not any(n.startswith("mcp__locked__") for n in _names(listing))
    assert {"source": "locked", "reason": "credential_required"} in listing["unavailable"]
    # It was asked without a credential and said no; nothing got in.
    assert world.locked.http("refused") > refused
    assert world.locked.http("accepted") == accepted
    # The run goes on without them: a turn is answered.
    before = len(world.fake.requests())
    with world.server.client("bob") as bob:
        room = bob.post("conversations", json={"agent_id": MCP_AGENT}).json()["id"]
        accepted_run = _send(bob, room, "hello there")
        assert _settled(bob, accepted_run["run_id"], timeout=120)["status"] == "completed"
    offered = json.dumps(world.fake.requests()[before:])
    assert offered != "[]" and "mcp__locked__" not in offered


@pytest.mark.rule("R-350", "R-386", "R-396", "R-397", "R-443")
def test_the_members_remembered_credential_lists_the_tools_and_only_there(
        world: World) -> None:
    ref = world.remember("alice", TOKEN)
    accepted = world.locked.http("accepted")
    listing = world.listing("alice")
    assert {"mcp__locked__whoami", "mcp__locked__lookup"} <= _names(listing)
    assert not any(u["source"] == "locked" for u in listing["unavailable"])
    assert world.locked.http("accepted") > accepted
    assert _leaks(json.dumps(listing), TOKEN) == []
    # The listing was a brokered request: a credential-free receipt of the remembered value.
    rows = world.rows()
    listings = [r for r in rows["receipts"] if r["kind"] == "request"
                and r["operation"] == "mcp__locked tools/list" and r["member"] == "alice"]
    assert listings and {(r["status"], r["retention"], r["credential_ref"])
                         for r in listings} == {("succeeded", "remember", ref)}
    for kind in ("journal", "audit", "receipts"):
        assert _leaks(json.dumps(rows[kind], default=str), TOKEN) == [], kind
    # And the tool runs with it, the echo scrubbed.
    [settled] = settled_calls_of_turn(world.server, world.fake, "alice", MCP_AGENT,
                                      f"ask the locked server {time.monotonic_ns()}",
                                      "mcp__locked__whoami", {"credential_ref": ref})
    assert settled["outcome"] == "ok", settled
    assert world.locked.ran()[-1]["arguments"]["authorization"] == f"Bearer {TOKEN}"
    assert _leaks(settled["content"], TOKEN) == []
    assert _leaks(world.server.log(), TOKEN) == []
    # Bob still has none: Alice's credential lists nothing for him.
    assert not any(n.startswith("mcp__locked__") for n in _names(world.listing("bob")))


@pytest.mark.rule("R-065")
def test_a_credential_the_server_refuses_gives_no_tools_and_says_so(world: World) -> None:
    world.remember("carol", "not-the-token-8841-wrong-value")
    listing = world.listing("carol")
    assert not any(n.startswith("mcp__locked__") for n in _names(listing))
    assert {"source": "locked", "reason": "credential_rejected"} in listing["unavailable"]
    assert _leaks(json.dumps(listing), "not-the-token-8841-wrong-value") == []
