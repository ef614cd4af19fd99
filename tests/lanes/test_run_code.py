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
