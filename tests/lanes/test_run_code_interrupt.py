"""Through a real server (issue 13, item 4): a persistent run_code call whose Python loop
overruns the wall limit is interrupted with its state kept, and the member's Stop interrupts
a running program at once, so the conversation's next call finds its kernel usable and its
state there. Jailed (bubblewrap, as ``KAIZEN_SANDBOX_JAIL=auto`` uses it) and not."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.kernel.conftest import bwrap_or_skip
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess, start_server

WALL_SECONDS = 12
LOOP = "import time\nwhile True:\n    time.sleep(0.1)\n"


def _run_code(code: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_code", "arguments": {
        "code": code, "language": "python", "persistent": True, "artifact_targets": []}}]}


SCRIPTS = [
    {"match": "keep k", "responses": [_run_code("k = 7"), {"text": "Kept."}]},
    {"match": "loop until the limit", "responses": [_run_code(LOOP), {"text": "It overran."}]},
    {"match": "loop until stopped", "responses": [_run_code(LOOP), {"text": "Never said."}]},
    {"match": "show k", "responses": [_run_code("print(k)"), {"text": "Shown."}]},
]


@pytest.fixture(scope="module", params=["auto", "off"], ids=["jailed", "unjailed"])
def interrupt_server(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if request.param == "auto":
        bwrap_or_skip()
    root: Path = tmp_path_factory.mktemp(f"interrupt-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_SANDBOX_JAIL": request.param,
            "SANDBOX_MAX_WALL_SECONDS": str(WALL_SECONDS),
        })
        try:
            yield server
        finally:
            server.stop()


def _body(client: httpx.Client, room: str, run_id: str) -> dict[str, Any]:
    settled = [e for e in _events(client, room, run_id)
               if e["type"] == "tool.settled" and e["data"]["name"] == "run_code"]
    assert len(settled) == 1, settled
    return dict(json.loads(str(settled[0]["data"]["content"])))


def _call(client: httpx.Client, room: str, text: str) -> dict[str, Any]:
    accepted = _send(client, room, text)
    run = _settled(client, accepted["run_id"], timeout=90)
    assert run["status"] == "completed", run
    return _body(client, room, accepted["run_id"])


@pytest.mark.rule("R-077")
def test_a_loop_over_the_wall_limit_is_interrupted_and_the_next_call_sees_its_state(
        interrupt_server: ServerProcess) -> None:
    with interrupt_server.client("alice") as alice:
        room = _room(alice)
        assert _call(alice, room, "keep k")["status"] == "ok"
        overran = _call(alice, room, "loop until the limit")
        assert overran["status"] == "timeout" and overran["code"] == "wall_time_exceeded", \
            overran
        assert "state_lost" not in overran and "kernel_restarted" not in overran
        shown = _call(alice, room, "show k")
        assert shown["status"] == "ok" and shown["stdout"] == "7\n", shown


@pytest.mark.rule("R-291")
def test_stop_interrupts_a_running_program_at_once_and_keeps_its_kernel(
        interrupt_server: ServerProcess) -> None:
    with interrupt_server.client("bob") as bob:
        room = _room(bob)
        assert _call(bob, room, "keep k")["status"] == "ok"
        looping = _send(bob, room, "loop until stopped")
        deadline = time.monotonic() + 60
        while not any(e["type"] == "tool.requested"
                      for e in _events(bob, room, looping["run_id"])):
            assert time.monotonic() < deadline, "run_code was never called"
            time.sleep(0.05)
        time.sleep(1.0)  # the loop is running in the kernel now
        stopped_at = time.monotonic()
        assert bob.post(f"runs/{looping['run_id']}/cancel").status_code == 202
        assert _settled(bob, looping["run_id"])["status"] == "cancelled"
        # The next call of the conversation waits for the lease its cancelled call held: it
        # gets it as soon as the program is interrupted, far before the wall limit would
        # have ended it, and the interrupted kernel still holds k.
        shown = _call(bob, room, "show k")
        assert time.monotonic() - stopped_at < WALL_SECONDS / 2
        assert shown["status"] == "ok" and shown["stdout"] == "7\n", shown
        assert "state_lost" not in shown
