"""R-239 end to end: a call that needs the member's approval first releases the member's
sandbox affinity worker (the run_code lease) for the conversation, before the approval request
can be seen or decided; the lease's persistent kernel is parked meanwhile, so the approved
call resumes it with its state (issue 13, item 5). A kernel reclaimed while parked says its
state was lost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _pending_approval, _room, _send, _settled
from tests.support.server import ServerProcess, start_server


def _run_code(code: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "persistent": True, "artifact_targets": []}}]}


SCRIPTS = [
    {"match": "remember the number", "responses": [_run_code("x = 41"), {"text": "Kept."}]},
    {"match": "recall the number", "responses": [
        _run_code("print(x + 1)"), {"text": "Recalled."}]},
    {"match": "save a summary", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": {
            "title": "Summary", "kind": "markdown", "content": "# Summary\n"}}]},
        {"text": "Handled."}]},
]


def _server(root: Path, **extra: str) -> Iterator[ServerProcess]:
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake", **extra})
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def kernel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _server(tmp_path_factory.mktemp("lease-server"))


@pytest.fixture(scope="module")
def no_parking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _server(tmp_path_factory.mktemp("lease-server-0"), KAIZEN_KERNEL_MAX_PARKED="0")


def _live_kernels(client: httpx.Client, room: str) -> list[str]:
    response = client.get(f"conversations/{room}/kernel")
    assert response.status_code == 200, response.text
    return [k["language"] for k in response.json()["kernels"]]


def _approved_run_code(client: httpx.Client, room: str, text: str) -> dict[str, Any]:
    """Send ``text``; when its run_code asks, check the lease is already released, approve,
    and return the settled call's body."""
    accepted = _send(client, room, text)
    approval = _pending_approval(client, accepted["run_id"])
    assert approval["tool"] == "run_code"
    # Visible, so already released: the conversation has no live kernel now.
    assert _live_kernels(client, room) == []
    assert client.post(f"approvals/{approval['id']}",
                       json={"decision": "approve"}).status_code == 200
    run = _settled(client, accepted["run_id"], timeout=90)
    assert run["status"] == "completed", run
    [settled] = [e for e in _events(client, room, accepted["run_id"])
                 if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    return dict(json.loads(str(settled["data"]["content"])))


@pytest.mark.rule("R-239")
def test_an_approved_call_resumes_the_kernel_its_conversation_parked(
        kernel_server: ServerProcess) -> None:
    with kernel_server.client("alice") as alice:
        assert alice.put("members/me/settings",
                         json={"approval_mode": "always_ask"}).status_code == 200
        room = _room(alice)
        kept = _approved_run_code(alice, room, "remember the number")
        assert kept["status"] == "ok", kept
        assert _live_kernels(alice, room) == ["python"]
        recalled = _approved_run_code(alice, room, "recall the number")
        assert recalled["status"] == "ok" and recalled["stdout"] == "42\n", recalled
        assert "state_lost" not in recalled


@pytest.mark.rule("R-239")
def test_any_approval_releases_the_lease_and_the_state_outlives_a_denial(
        kernel_server: ServerProcess) -> None:
    with kernel_server.client("bob") as bob:
        assert bob.put("members/me/settings",
                       json={"approval_mode": "never_ask"}).status_code == 200
        room = _room(bob)
        accepted = _send(bob, room, "remember the number")
        assert _settled(bob, accepted["run_id"], timeout=90)["status"] == "completed"
        assert _live_kernels(bob, room) == ["python"]
        # A write of another tool that needs a decision: by the time the request is visible,
        # the lease is gone.
        assert bob.put("members/me/settings",
                       json={"approval_mode": "always_ask"}).status_code == 200
        accepted = _send(bob, room, "save a summary please")
        approval = _pending_approval(bob, accepted["run_id"])
        assert approval["tool"] == "create_artifact"
        assert _live_kernels(bob, room) == []
        assert bob.post(f"approvals/{approval['id']}",
                        json={"decision": "deny"}).status_code == 200
        _settled(bob, accepted["run_id"], timeout=60)
        recalled = _approved_run_code(bob, room, "recall the number")
        assert recalled["stdout"] == "42\n", recalled


@pytest.mark.rule("R-239")
def test_a_kernel_reclaimed_while_parked_reports_its_state_lost(
        no_parking_server: ServerProcess) -> None:
    """KAIZEN_KERNEL_MAX_PARKED=0: every parked kernel is reclaimed at once, for capacity."""
    with no_parking_server.client("carol") as carol:
        assert carol.put("members/me/settings",
                         json={"approval_mode": "always_ask"}).status_code == 200
        room = _room(carol)
        assert _approved_run_code(carol, room, "remember the number")["status"] == "ok"
        lost = _approved_run_code(carol, room, "recall the number")
        assert lost["error"]["name"] == "NameError" and lost["state_lost"] is True, lost
        assert "reclaimed for capacity" in lost["message"]
