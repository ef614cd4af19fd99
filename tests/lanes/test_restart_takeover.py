"""SQLite: a server restarted after a kill -9 takes its predecessor's run over at start-up,
not after the run's lease: the dead holder was a process of this host that no longer runs.
Exactly one terminal, the dangling call rebuilt once, the room usable afterwards."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_races import _journal, _kill_9, _run, _wait_for
from tests.lanes.test_turns import TERMINAL, _room
from tests.support.server import start_server

#: Far longer than the test may take: recovery can only come from the dead-holder check.
LEASE_S = 120.0
RECOVERED_WITHIN_S = 20.0

SCRIPTS: list[dict[str, Any]] = [
    {"match": "sleepy tool", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "import time; time.sleep(60)", "language": "python",
            "artifact_targets": []}}]},
        {"text": "The program finished."}]},
    {"match": "after the restart", "responses": [{"text": "Back in business."}]},
]


@pytest.mark.rule("R-014", "R-264", "R-446")
def test_a_restarted_server_settles_its_predecessors_run_at_once(tmp_path: Path) -> None:
    database = sqlite_url_for(tmp_path / "kaizen.db")
    env = {"KAIZEN_RUN_LEASE_SECONDS": str(LEASE_S), "KAIZEN_KERNEL_POOL_SIZE": "0",
           "KAIZEN_MODEL": "fake"}
    with FakeOpenAI(SCRIPTS) as fake:
        env["KAIZEN_MODEL_BASE_URL"] = fake.base_url
        first = start_server(tmp_path / "first", database, extra_env=env)
        try:
            with first.client("alice") as alice:
                room = _room(alice)
                sent = alice.post(f"conversations/{room}/messages",
                                  json={"text": "sleepy tool please"}).json()
                _wait_for("the tool call to be in flight", lambda: any(
                    e["type"] == "tool.requested" and e["run_id"] == sent["run_id"]
                    for e in _journal(alice, room)), 90, first)
            _kill_9(first)
        finally:
            first.stop()

        second = start_server(tmp_path / "second", database, extra_env=env)
        started_at = time.monotonic()
        try:
            with second.client("alice") as alice:
                run = _wait_for("the restarted server to settle the run", lambda: (
                    r if (r := _run(alice, sent["run_id"]))["status"] in TERMINAL else None),
                    RECOVERED_WITHIN_S + 10, second)
                recovered_s = time.monotonic() - started_at
                events = [e for e in _journal(alice, room) if e["run_id"] == sent["run_id"]]
                nxt = alice.post(f"conversations/{room}/messages",
                                 json={"text": "after the restart"}).json()
                after = _wait_for("the room to be usable", lambda: (
                    r if (r := _run(alice, nxt["run_id"]))["status"] in TERMINAL else None),
                    60, second)
        finally:
            second.stop()

    assert recovered_s < RECOVERED_WITHIN_S, f"settled {recovered_s:.1f}s after the restart"
    # run_code may have changed something, so it is interrupted, never replayed.
    assert (run["status"], run["outcome"]) == ("failed", "interrupted")
    terminals = [e for e in events if e["type"] == "run.terminal"]
    settled = [e for e in events if e["type"] == "tool.settled"]
    assert len(terminals) == 1 and terminals[0]["data"]["ambiguous_calls"] == ["run_code"]
    assert len(settled) == 1 and settled[0]["data"]["rebuilt"] is True
    assert after["status"] == "completed"
    print(json.dumps({"race": "restart_after_kill_9", "db": "sqlite", "lease_s": LEASE_S,
                      "settled_after_restart_s": round(recovered_s, 2)}))
