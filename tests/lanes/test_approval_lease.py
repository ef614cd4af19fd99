"""R-239 end to end: a call that needs the member's approval first releases the member's
sandbox affinity worker (the run_code lease and its persistent kernel) for the conversation,
before the approval request can be seen or decided."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

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
        _run_code("print('x is', x + 1)"), {"text": "Recalled."}]},
    {"match": "save a summary", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": {
            "title": "Summary", "kind": "markdown", "content": "# Summary\n"}}]},
        {"text": "Handled."}]},
]


@pytest.fixture(scope="module")
def kernel_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("lease-server")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_KERNEL_POOL_SIZE": "1",
        })
        try:
            yield server
        finally:
            server.stop()


def _run_code_output(client: httpx.Client, room: str, text: str) -> str:
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=90)
    assert run["status"] == "completed", run
    settled = [e for e in _events(client, room, accepted["run_id"])
               if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert len(settled) == 1, settled
    return str(settled[0]["data"]["content"])


@pytest.mark.rule("R-239")
def test_the_sandbox_lease_is_released_before_an_approval_becomes_visible(
        kernel_server: ServerProcess) -> None:
    with kernel_server.client("alice") as alice:
        assert alice.put("members/me/settings",
                         json={"approval_mode": "never_ask"}).status_code == 200
        room = _room(alice)
        _run_code_output(alice, room, "remember the number")
        # Control: without an approval in between, the persistent kernel keeps its state.
        assert "x is 42" in json.loads(_run_code_output(alice, room, "recall the number"))[
            "stdout"]

        # A write that needs a decision: by the time the request is visible, the lease (and
        # with it the persistent kernel) is gone.
        assert alice.put("members/me/settings",
                         json={"approval_mode": "always_ask"}).status_code == 200
        accepted = _send(alice, room, "save a summary please")
        approval = _pending_approval(alice, accepted["run_id"])
        assert approval["tool"] == "create_artifact"
        assert alice.put("members/me/settings",
                         json={"approval_mode": "never_ask"}).status_code == 200
        assert alice.post(f"approvals/{approval['id']}",
                          json={"decision": "deny"}).status_code == 200
        _settled(alice, accepted["run_id"], timeout=60)

        # The next persistent run starts from a fresh kernel: the earlier state is lost.
        lost = _run_code_output(alice, room, "recall the number")
        assert "NameError" in lost and "x is 42" not in lost
