"""End to end through REST: the guardrail chain runs again before a result is published
(R-070), and a failed write's operator reference ends the member's answer (R-362).

The operator plugin ``tests.support.guard_plugin`` adds a result guardrail that withholds any
result carrying a marker, a read tool whose result carries it, and a write tool that raises.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.guard_plugin import MARKER
from tests.support.server import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]

SCRIPTS = [
    {"match": "code word", "responses": [
        {"tool_calls": [{"name": "peek_secret", "arguments": {}}]},
        {"text": "I could not get the code word."}]},
    {"match": "save a note", "responses": [
        {"tool_calls": [{"name": "explode_write", "arguments": {"note": "buy milk"}}]},
        {"text": "Saved."}]},
]


class GuardedServer:
    def __init__(self, server: ServerProcess, fake: FakeOpenAI, root: Path) -> None:
        self.server, self.fake, self.root = server, fake, root

    @property
    def tool_log(self) -> Path:
        return self.root / "tools.log"

    @property
    def database(self) -> Path:
        return self.root / "kaizen.db"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuardedServer]:
    root = tmp_path_factory.mktemp("guarded-server")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_PLUGINS": "tests.support.guard_plugin",
            "KAIZEN_TEST_TOOL_LOG": str(root / "tools.log"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])),
        })
        try:
            yield GuardedServer(server, fake, root)
        finally:
            server.stop()


def _guarded_room(client: httpx.Client) -> str:
    response = client.post("conversations", json={"agent_id": "guarded"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _tool_audit(database: Path, run_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT data FROM audit_events WHERE action = 'tool.call' "
                          "AND run_id = ?", (run_id,)).fetchall()
    return [json.loads(data) for (data,) in rows]


@pytest.mark.rule("R-070")
def test_a_result_guardrail_withholds_a_result_from_the_model_and_the_journal(
        guarded: GuardedServer) -> None:
    with guarded.server.client("alice") as alice:
        room = _guarded_room(alice)
        accepted = _send(alice, room, "what is the code word?")
        run = _settled(alice, accepted["run_id"])
        # The turn went on as for an error: the model answered after the withheld result.
        assert run["status"] == "completed", run
        events = _events(alice, room, accepted["run_id"])
        settled = [e for e in events if e["type"] == "tool.settled"]
        assert len(settled) == 1
        assert settled[0]["data"]["outcome"] == "error"
        assert "withheld by a safety check" in settled[0]["data"]["content"]
        committed = [e for e in events if e["type"] == "answer.committed"]
        assert committed and committed[0]["data"]["text"] == "I could not get the code word."
        journal = alice.get(f"conversations/{room}/journal",
                            params={"limit": 1000}).text
    # The tool really ran ...
    assert guarded.tool_log.read_text().splitlines().count("peek_secret") >= 1
    # ... but neither the journal nor any model request ever carried its text.
    assert MARKER not in journal
    requests = json.dumps(guarded.fake.requests())
    assert "withheld by a safety check" in requests  # the model did get the refusal
    assert MARKER not in requests
    # The outcome is recorded, and only audit keeps the raw result.
    audited = _tool_audit(guarded.database, accepted["run_id"])
    assert [row["outcome"] for row in audited] == ["error"]
    assert audited[0]["raw"]["result_withheld"] == "marked_result"


@pytest.mark.rule("R-362", "R-363")
def test_a_failed_writes_reference_ends_the_answer_the_audit_row_and_the_warning(
        guarded: GuardedServer) -> None:
    with guarded.server.client("bob") as bob:
        room = _guarded_room(bob)
        accepted = _send(bob, room, "please save a note")
        run = _settled(bob, accepted["run_id"])
        events = _events(bob, room, accepted["run_id"])
    assert run["status"] != "completed", run  # an ambiguous write closes the turn
    terminal = next(e for e in events if e["type"] == "run.terminal")
    message = str(terminal["data"]["message"])
    found = re.search(r"Reference: ([0-9a-f]{12})\.$", message)
    assert found, message  # the member's answer ends with the reference
    reference = found.group(1)
    assert "internal-notes.corp.example" not in message
    settled = next(e for e in events if e["type"] == "tool.settled")
    assert settled["data"]["outcome"] == "raised"
    audited = _tool_audit(guarded.database, accepted["run_id"])
    assert len(audited) == 1 and audited[0]["raw"]["reference"] == reference
    assert "internal-notes.corp.example" not in json.dumps(audited)
    warnings = [line for line in guarded.server.log().splitlines()
                if f"reference {reference}" in line and "explode_write" in line]
    assert len(warnings) == 1, warnings  # exactly one operator WARNING carries it
