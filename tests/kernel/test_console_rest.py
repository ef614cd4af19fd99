"""The console route through a real Jupyter server: a turn's persistent run_code leaves
``x = 41`` in the member's kernel; the member opens it as a console and evaluates ``x + 1``
over the Jupyter kernels websocket, exactly as JupyterLab's console does."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess, json_of, member_token, start_server

# Short, so the idle reaping of a lease can be watched; long enough for one step's calls.
IDLE_SECONDS = 15

SCRIPTS = [
    {"match": "keep x", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "x = 41\nprint('kept')", "language": "python", "persistent": True,
            "artifact_targets": []}}]},
        {"text": "x is in the kernel."}]},
    {"match": "show x", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "print(x)", "language": "python", "persistent": True,
            "artifact_targets": []}}]},
        {"text": "Shown."}]},
]


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("console-server")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_KERNEL_POOL_SIZE": "1", "KAIZEN_KERNEL_IDLE_SECONDS": str(IDLE_SECONDS),
        })
        try:
            yield server
        finally:
            server.stop()


def _jupyter(server: ServerProcess, member: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url + "api/", timeout=30,
                        headers={"Authorization": f"token {member_token(member)}"})


def _run_code_settled(client: httpx.Client, room: str, text: str) -> dict[str, Any]:
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=90)
    assert run["status"] == "completed", run
    [settled] = [e["data"] for e in _events(client, room, accepted["run_id"])
                 if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    return dict(json.loads(settled["content"]))


def _evaluate(server: ServerProcess, member: str, kernel_id: str, code: str) -> dict[str, Any]:
    """Execute ``code`` over ``/api/kernels/{id}/channels`` (the JSON wire protocol)."""
    url = server.base_url.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels"
    session = uuid.uuid4().hex
    ws = websocket.create_connection(
        f"{url}?session_id={session}", timeout=30,
        header=[f"Authorization: token {member_token(member)}"])
    try:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": member,
                       "session": session, "date": datetime.now(UTC).isoformat(),
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        seen: dict[str, Any] = {}
        # Shell and iopub are separate channels: the reply may overtake the result, so wait
        # for both the reply and iopub's idle (which follows every output of the request).
        replied = idle = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_result":
                seen["result"] = msg["content"]["data"]["text/plain"]
            elif msg["msg_type"] == "error":
                seen["error"] = msg["content"]["ename"]
            elif msg["msg_type"] == "execute_reply":
                replied = True
            elif msg["msg_type"] == "status" and \
                    msg["content"].get("execution_state") == "idle":
                idle = True
            if replied and idle:
                return seen
        raise AssertionError("no execute_reply and idle over the kernel websocket")
    finally:
        ws.close()


def _kernel_ids(jupyter: httpx.Client) -> set[str]:
    response = jupyter.get("kernels")
    assert response.status_code == 200, response.text
    return {k["id"] for k in response.json()}


@pytest.mark.rule("R-439")
def test_the_member_opens_their_persistent_kernel_as_a_console(
        console_server: ServerProcess) -> None:
    with console_server.client("alice") as alice, console_server.client("bob") as bob, \
            console_server.client("carol") as carol, _jupyter(console_server, "alice") as lab:
        room = _room(alice, shared=True)
        before = alice.get(f"conversations/{room}/kernel")
        assert before.status_code == 200 and before.json()["kernels"] == []
        missing = alice.post(f"conversations/{room}/kernel/console")
        assert missing.status_code == 404 and json_of(missing)["error"]["code"] == \
            "kernel_not_found"

        body = _run_code_settled(alice, room, "please keep x in the kernel")
        assert body["status"] == "ok" and body["stdout"] == "kept\n", body

        opened = alice.post(f"conversations/{room}/kernel/console")
        assert opened.status_code == 200, opened.text
        console = opened.json()
        assert console["language"] == "python" and console["kernel_id"]
        kernel_id = console["kernel_id"]
        status = alice.get(f"conversations/{room}/kernel").json()
        assert status["console_enabled"] is True
        assert [(k["language"], k["console_kernel_id"]) for k in status["kernels"]] == \
            [("python", kernel_id)]
        assert kernel_id in _kernel_ids(lab)
        # A session on it, as JupyterLab's console creates one.
        session = lab.post("sessions", json={"path": "kaizen-console", "type": "console",
                                              "name": "", "kernel": {"id": kernel_id}})
        assert session.status_code == 201, session.text
        assert session.json()["kernel"]["id"] == kernel_id

        assert _evaluate(console_server, "alice", kernel_id, "x + 1") == {"result": "42"}

        # Not a participant: the conversation does not exist for carol.
        for response in (carol.post(f"conversations/{room}/kernel/console"),
                         carol.get(f"conversations/{room}/kernel")):
            assert response.status_code == 404
            assert json_of(response)["error"]["code"] == "conversation_not_found"
        # A participant of the same room has a lease of their own, never alice's.
        assert alice.post(f"conversations/{room}/participants",
                          json={"member": "bob"}).status_code == 200
        refused = bob.post(f"conversations/{room}/kernel/console")
        assert refused.status_code == 404
        assert json_of(refused)["error"]["code"] == "kernel_not_found"
        assert bob.get(f"conversations/{room}/kernel").json()["kernels"] == []

        # The lease idles out: the kernel leaves the Jupyter server with it.
        deadline = time.monotonic() + IDLE_SECONDS + 20
        while kernel_id in _kernel_ids(lab) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert kernel_id not in _kernel_ids(lab)
        gone = alice.post(f"conversations/{room}/kernel/console")
        assert gone.status_code == 404 and json_of(gone)["error"]["code"] == \
            "kernel_not_found"


def test_shutting_the_console_kernel_down_loses_the_state_visibly(
        console_server: ServerProcess) -> None:
    with console_server.client("dave") as dave, _jupyter(console_server, "dave") as lab:
        room = _room(dave)
        assert _run_code_settled(dave, room, "keep x please")["status"] == "ok"
        kernel_id = dave.post(f"conversations/{room}/kernel/console").json()["kernel_id"]
        assert lab.delete(f"kernels/{kernel_id}").status_code == 204
        assert kernel_id not in _kernel_ids(lab)
        assert dave.get(f"conversations/{room}/kernel").json()["kernels"] == []
        # The next persistent call runs in a fresh kernel and says the state is gone.
        body = _run_code_settled(dave, room, "show x now")
        assert body["state_lost"] is True and body["error"]["name"] == "NameError", body
        assert "shut down from a console" in body["message"]


def test_malformed_console_requests_are_refused(console_server: ServerProcess) -> None:
    with console_server.client("carol") as carol:
        room = _room(carol)
        bad = carol.post(f"conversations/{room}/kernel/console",
                        json={"language": "cobol"})
        assert bad.status_code == 422 and json_of(bad)["error"]["code"] == "schema_violation"
        broken = carol.post(f"conversations/{room}/kernel/console", content=b"{not json",
                           headers={"Content-Type": "application/json"})
        assert broken.status_code == 400


def test_console_attach_can_be_turned_off(tmp_path: Path) -> None:
    server = start_server(tmp_path, sqlite_url_for(tmp_path / "kaizen.db"),
                          extra_env={"KAIZEN_KERNEL_CONSOLE": "0"})
    try:
        with server.client("alice") as alice:
            room = _room(alice)
            assert alice.get(f"conversations/{room}/kernel").json() == {
                "console_enabled": False, "kernels": []}
            refused = alice.post(f"conversations/{room}/kernel/console")
            assert refused.status_code == 403
            assert json_of(refused)["error"]["code"] == "console_disabled"
    finally:
        server.stop()


def test_a_bad_kernel_idle_setting_stops_start_up(tmp_path: Path) -> None:
    server = start_server(tmp_path, sqlite_url_for(tmp_path / "kaizen.db"),
                          extra_env={"KAIZEN_KERNEL_IDLE_SECONDS": "0"}, wait=False)
    try:
        assert server.process.wait(60) != 0
        assert "KAIZEN_KERNEL_IDLE_SECONDS" in server.log()
    finally:
        server.stop()
