"""Crash recovery that resumes the accepted turn (R-054), per backend.

Each test runs a real server with tools that stay in flight (tests/support/crash_plugin.py),
kills it with SIGKILL at a chosen point of the turn, then starts a second server on the same
database. Its lease check takes the run over and:

* a dangling *read* call is rebuilt as an error and the turn continues on the same run id,
  without a second model request for the step already committed;
* a dangling *write* call has an unknown outcome: the run settles ``failed`` (interrupted),
  the write is never dispatched again and the model is not asked to continue;
* a crash while the first model step was still streaming (nothing committed) resumes from
  the first step, once.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.engine import create_engine
from kaizen_server_extension.store.runs import Admission, RunLane
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, _database_for, drop_schema
from tests.lanes.test_races import _kill_9
from tests.lanes.test_turns import TERMINAL
from tests.support.server import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]
LEASE_S = 2.0

SCRIPTS: list[dict[str, Any]] = [
    {"match": "crash during lookup", "responses": [
        {"tool_calls": [{"name": "slow_lookup", "arguments": {}}]},
        {"text": "Resumed after the restart."}]},
    {"match": "crash during update", "responses": [
        {"tool_calls": [{"name": "slow_update", "arguments": {}}]},
        {"text": "This step must never be asked for."}]},
    {"match": "crash before the answer", "responses": [
        {"attempts": [{"delay_ms": 120_000, "text": "Lost with the crash."},
                      {"text": "Answered after the restart."}]}]},
]


@dataclass
class Crashable:
    """A database, a fake model and the servers started on them one after the other."""

    root: Path
    url: str
    schema: str | None
    fake: FakeOpenAI
    tool_log: Path
    servers: list[ServerProcess] = field(default_factory=list)

    def start(self, **env: str) -> ServerProcess:
        server = start_server(self.root, self.url, self.schema, extra_env={**env,
            "KAIZEN_MODEL_BASE_URL": self.fake.base_url, "KAIZEN_MODEL": "fake-model",
            "KAIZEN_RUN_LEASE_SECONDS": str(LEASE_S), "KAIZEN_KERNEL_POOL_SIZE": "0",
            "KAIZEN_PLUGINS": "tests.support.crash_plugin",
            "KAIZEN_TEST_TOOL_LOG": str(self.tool_log),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])),
        })
        self.servers.append(server)
        return server

    def dispatched(self) -> list[str]:
        text = self.tool_log.read_text() if self.tool_log.exists() else ""
        return text.split()

    def asked(self, match: str) -> list[dict[str, Any]]:
        """The model requests of one script, in order."""
        return [r for r in self.fake.requests() if match in _last_user_text(r)]


@pytest.fixture(params=BACKENDS)
def crashable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Crashable]:
    url, schema = _database_for(str(request.param), tmp_path)
    with FakeOpenAI(SCRIPTS) as fake:
        setup = Crashable(tmp_path, url, schema, fake, tmp_path / "tools.log")
        try:
            yield setup
        finally:
            for server in setup.servers:
                if server.process.poll() is None:
                    server.stop()
            if schema:
                asyncio.run(drop_schema(schema))


def _last_user_text(request: dict[str, Any]) -> str:
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    content = users[-1]["content"] if users else ""
    return content if isinstance(content, str) else json.dumps(content)


def _slot(request: dict[str, Any]) -> int:
    """Which step of the turn a request asks for: assistant messages after the last user
    message (the fake model's own slot rule)."""
    messages = request["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return sum(m["role"] == "assistant" for m in messages[last_user:])


def _journal(client: httpx.Client, room: str, run_id: str) -> list[dict[str, Any]]:
    events = client.get(f"conversations/{room}/journal",
                        params={"limit": 1000}).json()["events"]
    return [e for e in events if e["run_id"] == run_id]


def _wait(what: str, check: Callable[[], Any], timeout: float,
          server: ServerProcess) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{server.log()[-3000:]}")


def _crash_then_restart(setup: Crashable, text: str,
                        crash_when: Callable[[list[dict[str, Any]]], bool], **restart_env: str,
                        ) -> tuple[ServerProcess, str, dict[str, Any]]:
    """Post ``text`` in a fresh room of the crashing agent, SIGKILL the server once the
    run's journal satisfies ``crash_when``, start another server on the same database."""
    first = setup.start()
    with first.client("alice") as alice:
        created = alice.post("conversations", json={"agent_id": "crasher"})
        assert created.status_code == 201, created.text
        room = created.json()["id"]
        accepted = alice.post(f"conversations/{room}/messages",
                              json={"text": text, "idempotency_key": "resume-1"})
        assert accepted.status_code == 202, accepted.text
        body = accepted.json()
        _wait("the crash point", lambda: crash_when(_journal(alice, room, body["run_id"])),
              30, first)
    _kill_9(first)
    return setup.start(**restart_env), room, body


def _settled(server: ServerProcess, run_id: str) -> dict[str, Any]:
    with server.client("alice") as alice:
        return dict(_wait("the recovered run to settle", lambda: (
            r if (r := alice.get(f"runs/{run_id}").json())["status"] in TERMINAL else None),
            LEASE_S * 3 + 20, server))


def _in_flight(tool: str) -> Callable[[list[dict[str, Any]]], bool]:
    def check(events: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "tool.requested" and e["data"]["name"] == tool
                   for e in events)
    return check


@pytest.mark.timeout(120)
@pytest.mark.rule("R-003", "R-054", "R-264")
def test_a_crash_during_a_read_call_resumes_the_turn_without_reasking_the_committed_step(
    crashable: Crashable,
) -> None:
    survivor, room, accepted = _crash_then_restart(
        crashable, "crash during lookup", _in_flight("slow_lookup"))
    run = _settled(survivor, accepted["run_id"])
    assert (run["status"], run["outcome"]) == ("completed", "answered")

    with survivor.client("alice") as alice:
        # The client retries its post after the crash: the same acceptance, nothing new.
        retried = alice.post(f"conversations/{room}/messages",
                             json={"text": "crash during lookup", "idempotency_key": "resume-1"})
        assert retried.status_code == 202 and retried.json() == accepted
        time.sleep(0.3)
        events = _journal(alice, room, accepted["run_id"])
    types = [e["type"] for e in events]
    # One admission, one resumption on the same run id, exactly one terminal.
    assert types.count("run.admitted") == 1 and types.count("run.resumed") == 1
    assert types.count("run.terminal") == 1 and types[-1] == "run.terminal"
    assert types.count("input.accepted") == 1
    # The dangling read was rebuilt as an error before the run resumed.
    settled = [e for e in events if e["type"] == "tool.settled"]
    assert len(settled) == 1 and settled[0]["data"]["rebuilt"] is True
    assert settled[0]["data"]["outcome"] == "error"
    assert types.index("tool.settled") < types.index("run.resumed")
    resumed = next(e for e in events if e["type"] == "run.resumed")
    assert resumed["data"]["dangling_calls"] == 1 and resumed["data"]["next_step"] == 2
    # The controller chosen at admission is the one that carries the run on.
    admitted = next(e for e in events if e["type"] == "run.admitted")
    assert admitted["data"]["controller"] == resumed["data"]["controller"] == "turn_engine"
    committed = [e for e in events if e["type"] == "answer.committed"]
    assert [c["data"]["text"] for c in committed] == ["Resumed after the restart."]
    # Step numbers continue after the committed step.
    steps = [e["data"]["step"] for e in events if e["type"] == "model.step.started"]
    assert steps == [1, 2]

    # The committed first step was asked once (by the crashed server); the resumed server
    # asked only for the next step, with the rebuilt history.
    asked = crashable.asked("crash during lookup")
    assert [_slot(r) for r in asked] == [0, 1]
    history = asked[1]["messages"]
    call = next(m for m in history if m["role"] == "assistant")["tool_calls"][0]
    assert call["function"]["name"] == "slow_lookup"
    tool_message = next(m for m in history if m["role"] == "tool")
    assert tool_message["tool_call_id"] == call["id"]
    assert "outcome is unknown" in tool_message["content"]
    # A read is not repeated by the recovery either: the model did not ask for it again.
    assert crashable.dispatched() == ["slow_lookup"]


@pytest.mark.timeout(120)
@pytest.mark.rule("R-264", "R-446")
def test_a_crash_during_a_write_settles_failed_and_never_replays_it(
    crashable: Crashable,
) -> None:
    survivor, room, accepted = _crash_then_restart(
        crashable, "crash during update", _in_flight("slow_update"))
    run = _settled(survivor, accepted["run_id"])
    assert (run["status"], run["outcome"]) == ("failed", "interrupted")
    time.sleep(LEASE_S)  # a replay, if any, would have happened by now

    with survivor.client("alice") as alice:
        events = _journal(alice, room, accepted["run_id"])
    types = [e["type"] for e in events]
    assert "run.resumed" not in types
    terminals = [e for e in events if e["type"] == "run.terminal"]
    assert len(terminals) == 1
    assert terminals[0]["data"]["ambiguous_calls"] == ["slow_update"]
    assert "check the activity" in terminals[0]["data"]["message"]
    rebuilt = [e for e in events if e["type"] == "tool.settled"]
    assert len(rebuilt) == 1 and rebuilt[0]["data"]["rebuilt"] is True
    # Dispatched once, before the crash; the model was never asked to continue.
    assert crashable.dispatched() == ["slow_update"]
    assert [_slot(r) for r in crashable.asked("crash during update")] == [0]


@pytest.mark.timeout(120)
@pytest.mark.rule("R-054")
def test_a_crash_before_any_committed_step_resumes_from_the_first_step_once(
    crashable: Crashable,
) -> None:
    def streaming(events: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "model.step.started" for e in events) and bool(
            crashable.asked("crash before the answer"))

    survivor, room, accepted = _crash_then_restart(
        crashable, "crash before the answer", streaming)
    run = _settled(survivor, accepted["run_id"])
    assert (run["status"], run["outcome"]) == ("completed", "answered")
    time.sleep(0.3)

    with survivor.client("alice") as alice:
        events = _journal(alice, room, accepted["run_id"])
    types = [e["type"] for e in events]
    assert types.count("run.admitted") == 1 and types.count("run.resumed") == 1
    assert types.count("run.terminal") == 1
    resumed = next(e for e in events if e["type"] == "run.resumed")
    assert resumed["data"]["dangling_calls"] == 0
    committed = [e["data"]["text"] for e in events if e["type"] == "answer.committed"]
    assert committed == ["Answered after the restart."]
    # The first step was never committed, so it is asked again — exactly once.
    assert [_slot(r) for r in crashable.asked("crash before the answer")] == [0, 0]
    assert crashable.dispatched() == []


@pytest.mark.timeout(120)
@pytest.mark.rule("R-020")
def test_a_run_is_not_resumed_under_another_correction_rule_set(
    crashable: Crashable,
) -> None:
    # The replica that recovers the run runs with correction rules the run was not admitted
    # with: the run's binding cannot change mid-run, so it is settled, not continued.
    rules = json.dumps([{"id": "late-rule", "pattern": "resumed", "reminder": "No."}])
    survivor, room, accepted = _crash_then_restart(
        crashable, "crash during lookup", _in_flight("slow_lookup"),
        AGENT_STREAM_CORRECTION_RULES=rules)
    run = _settled(survivor, accepted["run_id"])
    assert (run["status"], run["outcome"]) == ("failed", "interrupted")

    with survivor.client("alice") as alice:
        events = _journal(alice, room, accepted["run_id"])
    admitted = next(e for e in events if e["type"] == "run.admitted")
    assert admitted["data"]["correction"]["rule_ids"] == []
    terminal = next(e for e in events if e["type"] == "run.terminal")
    assert terminal["data"]["not_resumed"] == "admission_changed"
    assert "run.resumed" not in [e["type"] for e in events]
    assert [_slot(r) for r in crashable.asked("crash during lookup")] == [0]


async def _crashed_after_the_answer(setup: Crashable, room: str) -> tuple[str, str]:
    """The state a holder leaves when it dies between committing the answer and writing the
    terminal: admitted, answer journaled, lease run out. Written through the store as the
    holder writes it. Returns (run id, answer)."""
    store = Store(create_engine(setup.url, schema=setup.schema))
    try:
        accepted = await store.inputs.accept(room, "alice", "answered before the crash",
                                             kind="message", idempotency_key=None)
        lane = RunLane(store)
        run = await lane.claim_next(room, "dead-holder", timedelta(milliseconds=1))
        assert run is not None and run.id == accepted.run_id
        agent = await store.agents.get_visible("crasher", "alice")
        assert agent is not None
        assert await lane.admit(run.id, run.fence, Admission(
            agent_version_id=agent.version_id, audience_version=1, resource_digest="d",
            catalog_digest="c", model="fake-model"), {"controller": "turn_engine"})
        answer = "Committed just before the crash."
        async with store.transaction() as tx:
            await tx.append_event(room, "model.step.started", "alice",
                                  {"step": 1, "attempt": 1, "synthesis": False}, run_id=run.id)
            await tx.append_event(room, "answer.committed", "alice",
                                  {"step": 1, "text": answer, "model": "fake-model"},
                                  run_id=run.id)
        return run.id, answer
    finally:
        await store.dispose()


@pytest.mark.timeout(120)
@pytest.mark.rule("R-014", "R-054")
def test_a_crash_after_the_committed_answer_settles_completed_without_asking_again(
    crashable: Crashable,
) -> None:
    first = crashable.start()  # migrates and seeds the database
    with first.client("alice") as alice:
        created = alice.post("conversations", json={"agent_id": "crasher"})
        assert created.status_code == 201, created.text
        room = created.json()["id"]
    first.stop()
    run_id, answer = asyncio.run(_crashed_after_the_answer(crashable, room))

    survivor = crashable.start()
    run = _settled(survivor, run_id)
    assert (run["status"], run["outcome"]) == ("completed", "answered")
    with survivor.client("alice") as alice:
        events = _journal(alice, room, run_id)
    types = [e["type"] for e in events]
    assert types.count("run.terminal") == 1 and "run.resumed" not in types
    assert [e["data"]["text"] for e in events if e["type"] == "answer.committed"] == [answer]
    assert crashable.fake.requests() == []
