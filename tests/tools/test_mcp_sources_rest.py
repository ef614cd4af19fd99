"""MCP servers as guarded tool sources, end to end: a real Kaizen server, real MCP servers (one
over stdio, two over streamable HTTP on loopback, all the SDK's own server side in
``tests/support/mcp_server.py``) and the scripted fake model, driven through the REST API.

The agent ``mcp-user`` grants the whole ``local`` (stdio), ``down`` (nothing listens there),
``off`` (disabled in the settings) and ``flicker`` (stopped mid-turn) servers, and exactly two
tools of ``web``. Every MCP call goes through the same pipeline as a built-in: the model is
offered only what discovery, the agent's grant and admin policy leave; writes ask the member
first and do not reach the server unless approved; results are bounded like any tool's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from kaizen_server_extension.tools.pipeline import DEFAULT_PROJECTION_LIMIT
from tests.conftest import BACKENDS, served_by, tool_call_audit
from tests.lanes.test_turns import _events, _pending_approval, _send, _settled
from tests.support.mcp_agent_plugin import MCP_AGENT
from tests.support.processes import stop_process
from tests.support.server import ServerProcess, free_port

MCP_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "mcp_server.py"


def _call(name: str, arguments: dict[str, Any] | None = None,
          **extra: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments or {}}], **extra}


SCRIPTS: list[dict[str, Any]] = [
    {"match": "just say hi", "responses": [{"text": "Hi."}]},
    {"match": "look up kaizen", "responses": [
        _call("mcp__local__lookup", {"q": "kaizen"}), {"text": "Looked it up."}]},
    {"match": "look up two words", "responses": [
        _call("mcp__local__lookup", {"q": "first"}),
        _call("mcp__local__lookup", {"q": "second"}), {"text": "Both looked up."}]},
    {"match": "look up on the web", "responses": [
        _call("mcp__web__lookup", {"q": "web"}), {"text": "Looked it up on the web."}]},
    *({"match": f"forecast for city {n}", "responses": [
        _call("mcp__local__get_forecast", {"city": f"city-{n}"}), {"text": "Forecast done."}]}
      for n in range(1, 4)),
    {"match": "wipe the notes", "responses": [
        _call("mcp__local__wipe_notes"), {"text": "Wiped."}]},
    {"match": "ask the down server", "responses": [
        _call("mcp__down__lookup", {"q": "x"}), {"text": "Tried."}]},
    {"match": "ask the disabled server", "responses": [
        _call("mcp__off__lookup", {"q": "x"}), {"text": "Tried."}]},
    {"match": "something huge", "responses": [_call("mcp__web__huge"), {"text": "Huge."}]},
    {"match": "try the flaky one", "responses": [_call("mcp__local__flaky"),
                                                 {"text": "It failed."}]},
    {"match": "look twice locally", "responses": [
        _call("mcp__local__lookup", {"q": "one"}),
        _call("mcp__local__lookup", {"q": "two"}, delay_ms=3000),
        {"text": "Both looks done."}]},
    {"match": "use the flicker server", "responses": [
        _call("mcp__flicker__lookup", {"q": "gone"}, delay_ms=4000), {"text": "Tried."}]},
    {"responses": [{"text": "Default answer."}]},
]


def _start_http_mcp(log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(MCP_SCRIPT), "http", "--port", str(port), "--log", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the HTTP MCP server exited early")
        try:
            httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            return process, port
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the HTTP MCP server did not start")




class McpWorld:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI, logs: dict[str, Path],
                 flicker: subprocess.Popen[bytes]) -> None:
        self.server, self.fake, self.logs, self.flicker = server, fake, logs, flicker

    def ran(self, server_id: str) -> list[dict[str, Any]]:
        """What the MCP server ``server_id`` actually ran, in order."""
        path = self.logs[server_id]
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def offered(self, text: str) -> set[str]:
        """The tool names the model was offered on the first step for message ``text``."""
        return self.fake.offered(text)


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpWorld]:
    root = tmp_path_factory.mktemp(f"mcp-server-{request.param}")
    logs = {name: root / f"{name}.jsonl" for name in ("local", "web", "flicker")}
    web, web_port = _start_http_mcp(logs["web"])
    flicker, flicker_port = _start_http_mcp(logs["flicker"])
    closed_port = free_port()  # nothing listens here
    servers = [
        {"id": "local", "transport": "stdio", "command": sys.executable,
         "args": [str(MCP_SCRIPT), "stdio", "--log", str(logs["local"])], "timeout_s": 60},
        {"id": "web", "transport": "http", "url": f"http://127.0.0.1:{web_port}/mcp"},
        {"id": "flicker", "transport": "http", "url": f"http://127.0.0.1:{flicker_port}/mcp"},
        {"id": "down", "transport": "http", "url": f"http://127.0.0.1:{closed_port}/mcp"},
        {"id": "off", "transport": "http", "url": f"http://127.0.0.1:{web_port}/mcp",
         "enabled": False},
    ]
    try:
        with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake, extra_env={
                "KAIZEN_PLUGINS": "tests.support.mcp_agent_plugin",
                "KAIZEN_MCP_STDIO_COMMANDS": sys.executable,
                "KAIZEN_MCP_SERVERS": json.dumps(servers)}) as proc:
            yield McpWorld(proc, fake, logs, flicker)
    finally:
        stop_process(web)
        stop_process(flicker)


def _room(client: httpx.Client, agent: str = MCP_AGENT, shared: bool = False) -> str:
    response = client.post("conversations", json={"agent_id": agent, "shared": shared})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _settled_calls(client: httpx.Client, room: str, run_id: str) -> list[dict[str, Any]]:
    return [dict(e["data"]) for e in _events(client, room, run_id)
            if e["type"] == "tool.settled"]


def _asked(client: httpx.Client, room: str, run_id: str) -> list[dict[str, Any]]:
    return [dict(e["data"]) for e in _events(client, room, run_id)
            if e["type"] == "approval.requested"]


def _run(client: httpx.Client, room: str, text: str) -> tuple[str, dict[str, Any]]:
    accepted = _send(client, room, text)
    return str(accepted["run_id"]), _settled(client, accepted["run_id"], timeout=120)


@pytest.mark.rule("R-400", "R-328", "R-330", "R-066", "R-065")
def test_discovery_offers_each_granted_tool_under_its_source_name(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        _, run = _run(alice, room, "just say hi")
        assert run["status"] == "completed", run
        offered = {n for n in world.offered("just say hi") if n.startswith("mcp__")}
        # The whole stdio server the agent grants, each tool named with its source id;
        # the tool with an invalid input schema is omitted by itself.
        assert {"mcp__local__lookup", "mcp__local__get_forecast", "mcp__local__record_note",
                "mcp__local__wipe_notes", "mcp__local__huge", "mcp__local__flaky",
        "mcp__local__slow"} <= offered
        assert "mcp__local__bad_schema" not in offered
        # Of the web server only the two exact tools the agent names.
        assert {n for n in offered if n.startswith("mcp__web__")} == {
            "mcp__web__lookup", "mcp__web__huge"}
        # A down server and a disabled one give no tools; the others are unaffected.
        assert not {n for n in offered if n.startswith(("mcp__down__", "mcp__off__"))}
        # An agent that grants no MCP server is offered none, though the servers are on.
        general = _room(alice, agent="general")
        _run(alice, general, "just say hi from general")
        assert not {n for n in world.offered("just say hi from general")
                    if n.startswith("mcp__")}


@pytest.mark.rule("R-400", "R-065")
def test_the_tools_listing_shows_the_source_tools_a_turn_would_get(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        listed = alice.get("tools", params={"agent_id": MCP_AGENT})
        assert listed.status_code == 200, listed.text
        names = {t["name"] for t in listed.json()["tools"]} | set(listed.json()["deferred"])
        assert {"mcp__local__lookup", "mcp__web__lookup"} <= names
        assert not {n for n in names if n.startswith(("mcp__down__", "mcp__off__"))}
        assert "mcp__local__bad_schema" not in names
        # In a shared room, as in its turns, none.
        shared = _room(alice, shared=True)
        in_room = alice.get("tools", params={"conversation_id": shared}).json()
        assert not {t["name"] for t in in_room["tools"] if t["name"].startswith("mcp__")}
        # An agent granting no server lists none.
        general = alice.get("tools", params={"agent_id": "general"}).json()
        assert not {t["name"] for t in general["tools"] if t["name"].startswith("mcp__")}


@pytest.mark.rule("R-206", "R-207")
def test_a_task_prompt_can_attach_a_discovered_source_tool(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        saved = alice.post("tasks", json={
            "name": "Forecast", "conversation_id": room,
            "prompt": "check {{tool:mcp:local/mcp__local__lookup}} and report"})
        assert saved.status_code == 201, saved.text
        # A tool of a server that is down is no tool now: refused, nothing saved.
        before = alice.get("tasks").json()
        refused = alice.post("tasks", json={
            "name": "Down", "conversation_id": room,
            "prompt": "check {{tool:mcp:down/mcp__down__lookup}}"})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "attachment_invalid"
        assert alice.get("tasks").json() == before


@pytest.mark.rule("R-374")
def test_a_shared_room_is_offered_no_mcp_tool(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice, shared=True)
        _run(alice, room, "just say hi in a shared room")
        assert not {n for n in world.offered("just say hi in a shared room")
                    if n.startswith("mcp__")}


def test_a_read_runs_on_its_own_server_without_asking(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        run_id, run = _run(alice, room, "look up kaizen")
        assert run["status"] == "completed", run
        assert _asked(alice, room, run_id) == []
        [settled] = _settled_calls(alice, room, run_id)
        assert settled["name"] == "mcp__local__lookup" and settled["outcome"] == "ok"
        assert "glossary: kaizen means testing" in settled["content"]
        assert [r for r in world.ran("local") if r["tool"] == "lookup"
                and r["arguments"] == {"q": "kaizen"}]
        # The same audit row as any tool call.
        [row] = tool_call_audit(world.server, run_id)
        assert row["tool"] == "mcp__local__lookup" and row["outcome"] == "ok"

        run_id, run = _run(alice, room, "look up on the web")
        assert run["status"] == "completed", run
        [settled] = _settled_calls(alice, room, run_id)
        assert settled["outcome"] == "ok" and "glossary: web" in settled["content"]
        assert [r for r in world.ran("web") if r["arguments"] == {"q": "web"}]


def test_a_turn_keeps_its_session_with_a_stdio_server(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        run_id, run = _run(alice, room, "look up two words")
        assert run["status"] == "completed", run
        assert [c["outcome"] for c in _settled_calls(alice, room, run_id)] == ["ok", "ok"]
        pids = {r["pid"] for r in world.ran("local")
                if r["arguments"] in ({"q": "first"}, {"q": "second"})}
        # Both calls were answered by one server process, started once for the turn.
        assert len(pids) == 1, pids


@pytest.mark.rule("R-341", "R-342")
def test_an_unannotated_tool_is_a_write_that_runs_only_when_approved(world: McpWorld) -> None:
    """get_forecast declares no annotations: its read-sounding name makes it no read."""
    with world.server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "forecast for city 1")
        approval = _pending_approval(alice, accepted["run_id"])
        assert approval["tool"] == "mcp__local__get_forecast"
        assert approval["capability"] == "write"
        # Nothing reached the server while the member decides.
        assert not [r for r in world.ran("local") if r["tool"] == "get_forecast"]
        assert alice.post(f"approvals/{approval['id']}",
                          json={"decision": "approve"}).status_code == 200
        run = _settled(alice, accepted["run_id"], timeout=120)
        assert run["status"] == "completed", run
        assert [r for r in world.ran("local") if r["arguments"] == {"city": "city-1"}]

        # Declined: the server never sees the call.
        accepted = _send(alice, room, "forecast for city 2")
        approval = _pending_approval(alice, accepted["run_id"])
        assert alice.post(f"approvals/{approval['id']}",
                          json={"decision": "deny"}).status_code == 200
        _settled(alice, accepted["run_id"], timeout=120)
        assert not [r for r in world.ran("local") if r["arguments"] == {"city": "city-2"}]


@pytest.mark.rule("R-342")
def test_a_destructive_tool_is_sensitive_and_cannot_be_allowed_for_the_conversation(
        world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "wipe the notes")
        approval = _pending_approval(alice, accepted["run_id"])
        assert approval["capability"] == "sensitive"
        refused = alice.post(f"approvals/{approval['id']}",
                             json={"decision": "approve", "scope": "conversation"})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "grant_not_allowed"
        assert alice.post(f"approvals/{approval['id']}",
                          json={"decision": "deny"}).status_code == 200
        _settled(alice, accepted["run_id"], timeout=120)
        assert not [r for r in world.ran("local") if r["tool"] == "wipe_notes"]


def test_a_write_allowed_for_the_conversation_runs_unasked_there(world: McpWorld) -> None:
    with world.server.client("carol") as carol:
        room = _room(carol)
        accepted = _send(carol, room, "forecast for city 3")
        approval = _pending_approval(carol, accepted["run_id"])
        assert carol.post(f"approvals/{approval['id']}", json={
            "decision": "approve", "scope": "conversation"}).status_code == 200
        assert _settled(carol, accepted["run_id"], timeout=120)["status"] == "completed"
        grants = carol.get(f"conversations/{room}/tool-grants").json()
        assert [g["tool"] for g in grants] == ["mcp__local__get_forecast"]


@pytest.mark.rule("R-065")
def test_a_down_or_disabled_server_fails_closed(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        for text in ("ask the down server", "ask the disabled server"):
            run_id, run = _run(alice, room, text)
            [settled] = _settled_calls(alice, room, run_id)
            assert settled["outcome"] != "ok"
            assert "not available" in settled["content"], settled
            assert run["status"] in ("failed", "completed"), run


def test_a_server_gone_after_discovery_is_a_member_safe_refusal(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "use the flicker server")
        # The run discovered the server; it stops before the model's call arrives.
        deadline = time.monotonic() + 60
        while not any(e["type"] == "model.step.started"
                      for e in _events(alice, room, accepted["run_id"])):
            assert time.monotonic() < deadline, "the run never started a step"
            time.sleep(0.05)
        stop_process(world.flicker)
        run = _settled(alice, accepted["run_id"], timeout=120)
        [settled] = _settled_calls(alice, room, accepted["run_id"])
        assert settled["name"] == "mcp__flicker__lookup" and settled["outcome"] == "error"
        assert "The MCP server flicker is not reachable, so lookup was not run" in \
            settled["content"], settled
        assert "127.0.0.1" not in settled["content"]
        # A read that failed before anything was sent: the turn goes on to answer.
        assert run["status"] == "completed", run


def test_a_huge_result_is_bounded_like_any_tool_result(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        run_id, run = _run(alice, room, "something huge")
        assert run["status"] == "completed", run
        [settled] = _settled_calls(alice, room, run_id)
        assert settled["outcome"] == "ok"
        assert len(settled["content"]) < DEFAULT_PROJECTION_LIMIT + 200
        assert "[truncated: showing the first" in settled["content"]


@pytest.mark.rule("R-274")
def test_a_result_the_server_marks_as_an_error_is_a_failed_call(world: McpWorld) -> None:
    with world.server.client("alice") as alice:
        room = _room(alice)
        run_id, run = _run(alice, room, "try the flaky one")
        [settled] = _settled_calls(alice, room, run_id)
        assert settled["outcome"] == "error", settled
        assert run["status"] == "completed", run


@pytest.mark.rule("R-314")
def test_admin_policy_denies_a_server_over_an_exact_allow(world: McpWorld) -> None:
    with world.server.client("dave") as dave, world.server.client("bob") as bob:
        # An unknown MCP server cannot be named by a policy.
        unknown = dave.put("admin/tool-policies/mcp__nosuch/bob", json={"allowed": False})
        assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "unknown_tool"
        assert dave.put("admin/tool-policies/mcp__local/bob",
                        json={"allowed": False}).status_code == 200
        assert dave.put("admin/tool-policies/mcp__local__lookup/bob",
                        json={"allowed": True}).status_code == 200
        assert dave.put("admin/tool-policies/mcp__web__huge/bob",
                        json={"allowed": False}).status_code == 200
        room = _room(bob)
        run_id, _ = _run(bob, room, "look up kaizen as bob")
        # The model's call of the denied server's tool is refused like any tool outside
        # the run's catalog.
        [settled] = _settled_calls(bob, room, run_id)
        assert settled["name"] == "mcp__local__lookup" and settled["outcome"] != "ok"
        offered = {n for n in world.offered("look up kaizen as bob") if n.startswith("mcp__")}
        # The server's denial is a ceiling over its tools; a per-tool denial takes one.
        assert offered == {"mcp__web__lookup"}, offered


def test_a_server_denied_mid_turn_is_refused_at_the_next_call(world: McpWorld) -> None:
    with world.server.client("dave") as dave, world.server.client("carol") as carol:
        room = _room(carol)
        accepted = _send(carol, room, "look twice locally")
        deadline = time.monotonic() + 60
        while not _settled_calls(carol, room, accepted["run_id"]):
            assert time.monotonic() < deadline, "the first call never settled"
            time.sleep(0.05)
        assert dave.put("admin/tool-policies/mcp__local/carol",
                        json={"allowed": False}).status_code == 200
        _settled(carol, accepted["run_id"], timeout=120)
        first, second = _settled_calls(carol, room, accepted["run_id"])
        assert first["outcome"] == "ok"
        assert second["outcome"] != "ok"
        assert "permission" in second["content"], second
        assert not [r for r in world.ran("local") if r["arguments"] == {"q": "two"}]
