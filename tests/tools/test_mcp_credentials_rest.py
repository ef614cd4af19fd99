"""An administrator-enabled streamable-HTTP MCP server bound to a credential destination, end to
end on both databases: a real Kaizen server, the test MCP server of
``tests/support/mcp_server.py`` over HTTP on loopback, the scripted fake model.

The member enters the credential in the signed form; the model passes only the opaque
``credential_ref`` (R-350, R-386); the call's own MCP session carries the value to that server
and nowhere else; the value never reaches the result, the journal, the audit log, the model's
requests or the server's log. A call without a reference, with another destination's, or with
a spent one never runs."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.settings import KaizenSettings, SettingsError
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.credentials.test_broker_rest import _leaks
from tests.credentials.world import CredentialWorld
from tests.support.mcp_agent_plugin import MCP_AGENT
from tests.support.processes import stop_process
from tests.support.tool_turns import settled_calls_of_turn
from tests.tools.test_mcp_sources_rest import _start_http_mcp

SECRET = "mcp-tok-7Hq2-unique-credential-value-20261206"
TOOL = "mcp__vault__whoami"


class World(CredentialWorld):
    mcp_log: Path

    def ran(self) -> list[dict[str, Any]]:
        if not self.mcp_log.exists():
            return []
        return [json.loads(line) for line in self.mcp_log.read_text().splitlines()
                if line.strip()]

    def enter_for(self, member: str, destination: str, secret: str) -> str:
        form = self.issue(member, destination=destination)
        answer = self.submit(member, form["form_url"], value=secret)
        assert answer.status_code == 200, answer.text
        found = re.search(r'id="kz-credential-ref">(cref_[A-Za-z0-9_-]+)<', answer.text)
        assert found, answer.text
        return found.group(1)

    def turn(self, arguments: dict[str, Any], member: str = "alice") -> list[dict[str, Any]]:
        return settled_calls_of_turn(self.server, self.fake, member, MCP_AGENT,
                                     f"ask the vault {time.monotonic_ns()}", TOOL, arguments)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"mcp-credentials-{request.param}")
    mcp_log = root / "vault.jsonl"
    process, port = _start_http_mcp(mcp_log)
    origin = f"http://127.0.0.1:{port}"
    destinations = [
        {"id": "vault-key", "origin": origin, "scheme": {"kind": "bearer"}},
        {"id": "other-key", "origin": origin, "scheme": {"kind": "header", "name": "X-Key"}},
    ]
    servers = [{"id": "vault", "transport": "http", "url": f"{origin}/mcp",
                "agents": [MCP_AGENT], "credential_destination": "vault-key"}]
    key = new_key_text()
    try:
        with FakeOpenAI([{"responses": [{"text": "Hello."}]}]) as fake, \
                served_by(str(request.param), root, fake, extra_env={
                    "KAIZEN_PLUGINS": "tests.support.mcp_agent_plugin",
                    "KAIZEN_CREDENTIALS_ENABLED": "1",
                    "KAIZEN_CREDENTIAL_KEY": key,
                    "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps(destinations),
                    "KAIZEN_MCP_SERVERS": json.dumps(servers)}) as server:
            built = World(server, fake, origin, key, root / "unused.jsonl",
                          root / "unused-notes.jsonl")
            built.mcp_log = mcp_log
            yield built
    finally:
        stop_process(process)


@pytest.mark.rule("R-350", "R-386", "R-391", "R-396")
def test_the_members_credential_reaches_only_the_bound_server_and_nothing_else_sees_it(
        world: World) -> None:
    ref = world.enter_for("alice", "vault-key", SECRET)
    before = len(world.ran())
    [settled] = world.turn({"credential_ref": ref})
    assert settled["outcome"] == "ok", settled
    # The call ran once, carrying the member's value by the destination's scheme.
    [ran] = world.ran()[before:]
    assert ran["tool"] == "whoami" and ran["arguments"]["authorization"] == f"Bearer {SECRET}"
    # The server echoed it; the result the model gets carries none of it.
    assert _leaks(settled["content"], SECRET) == []
    assert "[REDACTED]" in settled["content"]
    # The model was offered the reference in the schema and saw only the reference.
    bodies = json.dumps(world.fake.requests())
    assert ref in bodies and _leaks(bodies, SECRET) == []
    rows = world.rows()
    for kind in ("journal", "audit", "receipts"):
        assert _leaks(json.dumps(rows[kind], default=str), SECRET) == [], kind
    assert _leaks(world.server.log(), SECRET) == []
    receipts = [r for r in rows["receipts"]
                if r["kind"] == "request" and r["credential_ref"] == ref]
    assert [(r["status"], r["operation"], r["destination"]) for r in receipts] == [
        ("succeeded", TOOL, "vault-key")]


@pytest.mark.rule("R-350")
def test_the_bound_servers_tools_require_an_opaque_reference(world: World) -> None:
    before = len(world.ran())
    [missing] = world.turn({})
    assert missing["outcome"] != "ok"
    # A credential in the arguments instead of a reference is refused before execution.
    [pasted] = world.turn({"credential_ref": "Bearer pasted-value-Zx81-0042"})
    assert pasted["outcome"] != "ok"
    assert len(world.ran()) == before


@pytest.mark.rule("R-350", "R-391", "R-393")
def test_another_destinations_or_a_spent_reference_never_runs(world: World) -> None:
    other = world.enter_for("alice", "other-key", "other-value-4815162342")
    before = len(world.ran())
    [refused] = world.turn({"credential_ref": other})
    assert refused["outcome"] == "error" and "cannot be used" in refused["content"], refused
    assert len(world.ran()) == before
    ref = world.enter_for("alice", "vault-key", SECRET)
    assert world.turn({"credential_ref": ref})[0]["outcome"] == "ok"
    spent = len(world.ran())
    [again] = world.turn({"credential_ref": ref})
    assert again["outcome"] == "error" and "enter the credential again" in again["content"]
    assert len(world.ran()) == spent
    # Bob cannot use Alice's remembered or once reference either.
    ref = world.enter_for("alice", "vault-key", SECRET)
    [stolen] = world.turn({"credential_ref": ref}, member="bob")
    assert stolen["outcome"] == "error"
    assert len(world.ran()) == spent


BOUND = {"id": "vault", "transport": "http", "url": "http://127.0.0.1:9000/mcp",
         "credential_destination": "vault-key"}
KEY = {"id": "vault-key", "origin": "http://127.0.0.1:9000", "scheme": {"kind": "bearer"}}


@pytest.mark.parametrize(("servers", "destinations", "enabled"), [
    ([BOUND], [KEY], False),                                   # the quarantine is off
    ([BOUND], [], True),                                       # no such destination
    ([BOUND], [{**KEY, "origin": "http://127.0.0.1:9001"}], True),  # another origin
    ([{**BOUND, "transport": "stdio", "url": "", "command": "/bin/true"}], [KEY], True),
], ids=["credentials off", "unknown destination", "other origin", "stdio server"])
def test_a_binding_that_cannot_hold_stops_start_up_naming_the_setting(
        servers: list[dict[str, Any]], destinations: list[dict[str, Any]],
        enabled: bool) -> None:
    environ = {"KAIZEN_MCP_SERVERS": json.dumps(servers),
               "KAIZEN_MCP_STDIO_COMMANDS": "/bin/true",
               "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps(destinations),
               "KAIZEN_CREDENTIALS_ENABLED": "1" if enabled else "0",
               "KAIZEN_CREDENTIAL_KEY": "Y2hhbmdlLW1lLXRoaXMtaXMtMzItYnl0ZXMtbG9uZyE"}
    with pytest.raises(SettingsError) as error:
        KaizenSettings.from_environ(environ)
    assert "KAIZEN_MCP_SERVERS" in str(error.value)
    assert "Y2hhbmdl" not in str(error.value)
