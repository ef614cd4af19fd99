"""Administrator-approved MCP artifact producers end to end (docs/mcp.md, "Artifact
producers (version 2 envelopes)"): a real Kaizen server on each database, a real stdio MCP
server (``tests/support/mcp_artifact_server.py``) and the scripted fake model, read back
through REST and the server's own database.

The server entry ``art`` declares ``make_chart`` and ``make_chart_structured`` as producers;
``echo_chart`` returns the very same envelope text but no administrator declared it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from kaizen_server_extension.settings import KaizenSettings, SettingsError
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.content import (
    ATTESTATION_PREFIX,
    Attestation,
    attest_trusted_result,
    canonical_json,
    producer_of,
    validate_envelope,
    verify_attestation,
)
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by, tool_call_audit, with_server_store
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.mcp_agent_plugin import MCP_AGENT
from tests.support.mcp_artifact_server import FALSE_PROVENANCE, MARKINGS, envelope
from tests.support.server import ServerProcess

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "mcp_artifact_server.py"
PRODUCER = "mcp__art__make_chart"
ASSERTS = "validated_output_of_approved_producer"


def _call(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments or {}}]}


INVALID_MODES = ("missing_markings", "oversized", "duplicate_keys", "path_download",
                 "not_json")
SCRIPTS: list[dict[str, Any]] = [
    {"match": "make the chart now", "responses": [
        _call(PRODUCER, {"mode": "valid"}), {"text": "Chart made."}]},
    {"match": "make the structured chart", "responses": [
        _call("mcp__art__make_chart_structured"), {"text": "Chart made."}]},
    {"match": "echo the chart", "responses": [
        _call("mcp__art__echo_chart"), {"text": "Echoed."}]},
    *({"match": f"make a {mode} chart", "responses": [
        _call(PRODUCER, {"mode": mode}), {"text": "Tried."}]} for mode in INVALID_MODES),
    {"match": "forge a governed artifact", "responses": [
        _call("create_artifact", {"title": "Forged", "kind": "code",
                                  "language": "renderable-artifact",
                                  "content": json.dumps(envelope())}),
        {"text": "Tried."}]},
    {"responses": [{"text": "Default answer."}]},
]


class World:
    def __init__(self, server: ServerProcess, log: Path) -> None:
        self.server, self.log = server, log

    def ran(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp(f"mcp-artifacts-{request.param}")
    log = root / "art.jsonl"
    servers = [{"id": "art", "transport": "stdio", "command": sys.executable,
                "args": [str(SCRIPT), "--log", str(log)], "timeout_s": 60,
                "agents": [MCP_AGENT],
                "artifact_tools": ["make_chart", "make_chart_structured"]}]
    with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake, extra_env={
            "KAIZEN_PLUGINS": "tests.support.mcp_agent_plugin",
            "KAIZEN_MCP_STDIO_COMMANDS": sys.executable,
            "KAIZEN_MCP_SERVERS": json.dumps(servers)}) as proc:
        yield World(proc, log)


def _room(client: httpx.Client, agent: str = MCP_AGENT) -> str:
    response = client.post("conversations", json={"agent_id": agent})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _one_call(client: httpx.Client, room: str, text: str) -> tuple[str, dict[str, Any]]:
    accepted = _send(client, room, text)
    run_id = str(accepted["run_id"])
    run = _settled(client, run_id, timeout=120)
    assert run["status"] == "completed", run
    [settled] = [dict(e["data"]) for e in _events(client, room, run_id)
                 if e["type"] == "tool.settled"]
    return run_id, settled


def _versions(server: ServerProcess) -> list[dict[str, Any]]:
    """Every stored version (any owner): what reached the database, however it got there."""
    async def read(store: Store) -> list[dict[str, Any]]:
        async with store.transaction() as tx:
            rows = (await tx.session.execute(select(m.ArtifactVersion))).scalars().all()
            return [{"artifact_id": r.artifact_id, "kind": r.kind, "language": r.language,
                     "attestation": r.attestation, "run_id": r.run_id,
                     "content": bytes(r.content)} for r in rows]
    return with_server_store(server, read)


@pytest.mark.rule("R-403", "R-107")
def test_a_declared_producer_writes_a_governed_artifact_it_alone_vouches_for(
        world: World) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        run_id, settled = _one_call(alice, room, "make the chart now")
        assert settled["outcome"] == "ok", json.dumps(settled)
        told = json.loads(settled["content"])
        # The model gets the artifact's identity and what the attestation asserts, not the
        # envelope and no authority.
        assert told["attested"] == {"producer": PRODUCER, "asserts": ASSERTS}
        assert "cluster-that-never-existed" not in settled["content"]
        artifact_id, version = told["artifact"]["id"], told["artifact"]["version"]
        assert version == 1

        view = alice.get(f"artifacts/{artifact_id}")
        assert view.status_code == 200, view.text
        body = view.json()
        assert body["governed"] is True and body["owner"] == "alice"
        assert body["conversation_id"] == room
        assert (body["kind"], body["language"]) == ("code", "renderable-artifact")
        # The record says what is attested: the approved producer returned validated
        # output. Nothing in it claims the provenance or markings were verified.
        assert body["attested"] == {"producer": PRODUCER, "asserts": ASSERTS}
        # The stored provenance and markings are exactly the producer's (false) claims,
        # canonicalized, not corrected or endorsed by Kaizen.
        stored = json.loads(body["content"])
        assert stored["provenance"] == FALSE_PROVENANCE and stored["markings"] == MARKINGS
        assert body["content"] == canonical_json(envelope())

        [row] = [v for v in _versions(world.server) if v["artifact_id"] == artifact_id]
        assert row["attestation"].startswith(ATTESTATION_PREFIX)
        assert producer_of(row["attestation"]) == PRODUCER and row["run_id"] == run_id
        # The call's audit row names the producer too.
        [audit] = tool_call_audit(world.server, run_id)
        assert audit["tool"] == PRODUCER and audit["outcome"] == "ok"
        assert PRODUCER in json.dumps(audit)

        # The SDK's usual shape (text plus the same structuredContent) is accepted as well.
        _, structured = _one_call(alice, room, "make the structured chart")
        assert structured["outcome"] == "ok", structured
        assert json.loads(structured["content"])["attested"]["producer"] == \
            "mcp__art__make_chart_structured"

        # Another member cannot see it: owner-scoped like any artifact.
        with world.server.client("bob") as bob:
            assert bob.get(f"artifacts/{artifact_id}").status_code == 404


@pytest.mark.rule("R-118")
def test_a_copy_of_a_produced_artifact_names_the_same_producer_and_is_not_reattested(
        world: World) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        _, settled = _one_call(alice, room, "make the chart now")
        source = json.loads(settled["content"])["artifact"]["id"]
        fork = alice.post(f"artifacts/{source}/fork", json={})
        assert fork.status_code == 201, fork.text
        copy = alice.get(f"artifacts/{fork.json()['id']}").json()
        assert copy["governed"] is True and copy["derived_from"] == source
        assert copy["attested"] == {"producer": PRODUCER, "asserts": ASSERTS}
        assert copy["content"] == alice.get(f"artifacts/{source}").json()["content"]
        rows = {v["artifact_id"]: v for v in _versions(world.server)}
        # The copy carries the producer's marker as it was; no new attestation was minted.
        assert rows[copy["id"]]["attestation"] == rows[source]["attestation"]


@pytest.mark.rule("R-107")
def test_the_same_output_from_an_undeclared_tool_stays_an_untrusted_result(
        world: World) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        before = _versions(world.server)
        _, settled = _one_call(alice, room, "echo the chart")
        assert settled["outcome"] == "ok", json.dumps(settled)
        # The envelope comes back as the plain tool result it is, no artifact named.
        body = json.loads(settled["content"])
        assert "artifact" not in body and "attested" not in body
        assert json.loads(body["content"][0]["text"]) == envelope()
        assert [r for r in world.ran() if r["tool"] == "echo_chart"]
        # Nothing was written, attested or not.
        assert _versions(world.server) == before


@pytest.mark.parametrize("mode", INVALID_MODES)
def test_an_invalid_envelope_from_a_declared_producer_is_refused_and_nothing_is_written(
        world: World, mode: str) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        before = _versions(world.server)
        _, settled = _one_call(alice, room, f"make a {mode} chart")
        # It ran on the server, and the boundary refused its output.
        assert [r for r in world.ran() if r["arguments"] == {"mode": mode}]
        assert settled["outcome"] == "error", settled
        assert "not a valid renderable artifact" in settled["content"]
        assert "Nothing was saved" in settled["content"]
        # No envelope text reaches the model (the duplicate's relabel included).
        assert "RELABELED" not in settled["content"]
        assert "cluster-that-never-existed" not in settled["content"]
        assert _versions(world.server) == before


@pytest.mark.rule("R-107")
def test_the_model_cannot_mint_a_governed_artifact_with_create_artifact(
        world: World) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice, agent="general")
        before = _versions(world.server)
        _, settled = _one_call(alice, room, "forge a governed artifact")
        assert settled["outcome"] == "error", settled
        assert "reserved" in settled["content"]
        assert _versions(world.server) == before


def _settings(entry: dict[str, Any]) -> KaizenSettings:
    base = {"id": "art", "transport": "stdio", "command": sys.executable}
    return KaizenSettings.from_environ({
        "KAIZEN_MCP_SERVERS": json.dumps([{**base, **entry}]),
        "KAIZEN_MCP_STDIO_COMMANDS": sys.executable})


@pytest.mark.parametrize("declared", [
    "make_chart", [""], ["has space"], ["make_chart", "make_chart"], [1],
    ["x" * 60], {"make_chart": True},
])
def test_a_malformed_producer_declaration_stops_start_up(declared: object) -> None:
    with pytest.raises(SettingsError, match="KAIZEN_MCP_SERVERS"):
        _settings({"artifact_tools": declared})


def test_a_producer_declaration_is_read_from_the_settings() -> None:
    settings = _settings({"artifact_tools": ["make_chart"]})
    assert settings.KAIZEN_MCP_SERVERS[0].artifact_tools == ("make_chart",)
    assert _settings({}).KAIZEN_MCP_SERVERS[0].artifact_tools == ()


@pytest.mark.rule("R-107")
def test_an_attestation_binds_its_producer() -> None:
    """A marker minted for one producer does not verify under another's name, so a stored
    producer cannot be relabelled into a different approved one."""
    checked = validate_envelope(json.dumps(envelope()))
    made = attest_trusted_result("run:call-1", checked, producer=PRODUCER)
    assert verify_attestation(made, checked) and producer_of(made.marker) == PRODUCER
    other = "mcp__art__echo_chart"
    moved = Attestation(made.call_id, made.digest,
                        made.marker.replace(PRODUCER, other), other)
    assert not verify_attestation(moved, checked)
    assert not verify_attestation(replace(made, producer=""), checked)
