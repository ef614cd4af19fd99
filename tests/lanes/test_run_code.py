"""run_code end to end: a model's call runs in a sandboxed kernel, whose tools.call comes back
through the same guarded pipeline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess, start_server

PROGRAM = """
import os
agents = tools.call("list_available_agents")
print("agents:", sorted(a["name"] for a in agents["agents"]))
print("model key in env:", "KAIZEN_MODEL_API_KEY" in os.environ)
with open("report.txt", "w") as f:
    f.write("hello from the kernel")
"""

SCRIPTS = [
    {"match": "analyse", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": PROGRAM, "language": "python", "artifact_targets": ["report.txt"]}}]},
        {"text": "Done: the report is ready."}]},
    {"match": "crash", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "1/0", "artifact_targets": []}}]},
        {"text": "The program divided by zero."}]},
    {"match": "ask first", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "auth = 'Bearer sk-hidden-from-the-card'\nprint('approved run')",
            "artifact_targets": []}}]},
        {"text": "Ran it after approval."}]},
    {"match": "ask again", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "print('never runs')", "artifact_targets": []}}]},
        {"text": "You declined, so I did not run it."}]},
    {"match": "no targets", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {"code": "print(1)"}}]},
        {"text": "I forgot the targets."}]},
]


@pytest.fixture(scope="module")
def kernel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("kernel-server")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_MODEL_API_KEY": "sk-must-not-leak", "KAIZEN_KERNEL_POOL_SIZE": "1",
        })
        try:
            yield server
        finally:
            server.stop()


def _settled_call(kernel_server: ServerProcess, text: str) -> dict[str, object]:
    with kernel_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, text)
        run = _settled(alice, accepted["run_id"], timeout=90)
        settled = [e for e in _events(alice, room, accepted["run_id"])
                   if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
        assert len(settled) == 1, run
        return {"run": run, **settled[0]["data"]}


@pytest.mark.rule("R-171", "R-439")
def test_run_code_runs_in_a_kernel_and_calls_read_tools_back(
    kernel_server: ServerProcess,
) -> None:
    call = _settled_call(kernel_server, "please analyse this")
    assert call["outcome"] == "ok", call
    body = json.loads(str(call["content"]))
    assert "agents: ['General', 'Search']" in body["stdout"]
    assert "model key in env: False" in body["stdout"]
    assert [f["name"] for f in body["files"]] == ["report.txt"]
    assert "sk-must-not-leak" not in str(call)


def test_a_programs_traceback_is_the_callers_failure_and_the_turn_goes_on(
    kernel_server: ServerProcess,
) -> None:
    call = _settled_call(kernel_server, "crash the program")
    assert call["outcome"] == "error" and call["failure_domain"] == "caller"
    assert "ZeroDivisionError" in str(call["content"])
    run = call["run"]
    assert isinstance(run, dict) and run["status"] == "completed"


@pytest.mark.rule("R-235")
def test_missing_artifact_targets_is_a_schema_error(kernel_server: ServerProcess) -> None:
    call = _settled_call(kernel_server, "run with no targets")
    assert call["outcome"] == "error"
    assert "artifact_targets" in str(call["content"])


def _await_pending(client: object, run_id: str) -> dict[str, object]:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = client.get("approvals", params={"status": "pending"})  # type: ignore[attr-defined]
        pending = [a for a in listed.json() if a["run_id"] == run_id]
        if pending:
            return dict(pending[0])
        time.sleep(0.05)
    raise AssertionError("no approval was requested")


@pytest.mark.rule("R-224", "R-238", "R-240")
def test_always_ask_parks_the_run_until_the_member_approves_once(
    kernel_server: ServerProcess,
) -> None:
    with kernel_server.client("bob") as bob, kernel_server.client("carol") as carol:
        bob.put("members/me/settings", json={"approval_mode": "always_ask"})
        room = _room(bob)
        accepted = _send(bob, room, "ask first, then run")
        approval = _await_pending(bob, accepted["run_id"])
        assert approval["tool"] == "run_code"
        assert bob.get(f"runs/{accepted['run_id']}").json()["status"] == "awaiting_approval"
        # The card shows the arguments, credentials redacted, before anything ran.
        assert "sk-hidden-from-the-card" not in str(approval["arguments"])
        assert not [e for e in _events(bob, room, accepted["run_id"])
                    if e["type"] == "tool.settled"]
        # Only the initiating member decides; anyone else sees nothing.
        assert carol.post(f"approvals/{approval['id']}",
                          json={"decision": "approve"}).status_code == 404
        assert bob.post(f"approvals/{approval['id']}",
                        json={"decision": "approve"}).status_code == 200
        assert bob.post(f"approvals/{approval['id']}",
                        json={"decision": "deny"}).status_code == 409
        run = _settled(bob, accepted["run_id"], timeout=90)
        assert run["status"] == "completed"
        settled = [e for e in _events(bob, room, accepted["run_id"])
                   if e["type"] == "tool.settled"]
        assert len(settled) == 1 and settled[0]["data"]["outcome"] == "ok"
        assert "approved run" in settled[0]["data"]["content"]
        statuses = {a["id"]: a["status"] for a in bob.get("approvals").json()}
        assert statuses[approval["id"]] == "consumed"  # the receipt was used exactly once
        bob.put("members/me/settings", json={"approval_mode": "ask_for_writes"})


def test_a_denied_call_never_runs_and_the_model_is_told(kernel_server: ServerProcess) -> None:
    with kernel_server.client("dave") as dave:
        dave.put("members/me/settings", json={"approval_mode": "always_ask"})
        room = _room(dave)
        accepted = _send(dave, room, "ask again please")
        approval = _await_pending(dave, accepted["run_id"])
        assert dave.post(f"approvals/{approval['id']}",
                         json={"decision": "deny"}).status_code == 200
        run = _settled(dave, accepted["run_id"], timeout=60)
        assert run["status"] == "completed"
        settled = [e for e in _events(dave, room, accepted["run_id"])
                   if e["type"] == "tool.settled"]
        assert len(settled) == 1 and settled[0]["data"]["outcome"] == "error"
        assert "declined" in settled[0]["data"]["content"]
        assert "never runs" not in str(settled)
