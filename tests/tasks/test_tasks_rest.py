"""Durable tasks through the REST API of a real server and the fake model (docs/tasks.md).

A task's firing is the owner's input in the task's room: the same queue, lane, journal and
inbox as chat (R-051). A safe test performs nothing outside the sandbox (R-055); a task's
effects need the task's live authority (R-056, R-057); tasks are the owner's alone (R-059).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.conftest import BACKENDS, scripted_server
from tests.lanes.test_turns import _events, _settled
from tests.support.server import ServerProcess, json_of

NOTE = {"title": "Morning numbers", "kind": "markdown", "content": "# Sales\n\nUp 3%.\n"}
SCRIPTS: list[dict[str, Any]] = [
    {"match": "write the morning note", "responses": [
        {"tool_calls": [{"name": "create_artifact", "arguments": NOTE}]},
        {"text": "Done with the note."}]},
    {"match": "how are the numbers", "responses": [{"text": "The numbers are steady."}]},
    {"match": "check the numbers in the background", "responses": [
        {"tool_calls": [{"name": "manage_tasks", "arguments": {
            "action": "run_in_background", "prompt": "how are the numbers, later?"}}]},
        {"text": "Queued it."}]},
    {"match": "check every morning", "responses": [
        {"tool_calls": [{"name": "manage_tasks", "arguments": {
            "action": "run_in_background", "prompt": "check the sales every morning",
            "interval_seconds": 86400}}]},
        {"tool_calls": [{"name": "inspect_tasks", "arguments": {}}]},
        {"text": "Looping daily."}]},

    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def task_server(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"task-server-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS,
                         {"KAIZEN_TASK_POLL_SECONDS": "0.2"}) as proc:
        yield proc


def _room(client: httpx.Client, **extra: Any) -> str:
    created = client.post("conversations", json={"agent_id": "general", **extra})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _task(client: httpx.Client, room: str, prompt: str, **extra: Any) -> dict[str, Any]:
    created = client.post("tasks", json={"name": "Morning check", "prompt": prompt,
                                         "conversation_id": room, **extra})
    assert created.status_code == 201, created.text
    return dict(created.json())


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def _artifact_count(client: httpx.Client) -> int:
    return len(json_of(client.get("artifacts")))


@pytest.mark.rule("R-059")
def test_tasks_are_the_owners_alone_and_bad_input_writes_nothing(
        task_server: ServerProcess) -> None:
    with task_server.client("alice") as alice, task_server.client("bob") as bob:
        assert bob.get("agents").status_code == 200
        room = _room(alice)
        task = _task(alice, room, "how are the numbers today?", interval_seconds=86400)
        assert task["status"] == "active" and task["version"] == 1
        due = datetime.fromisoformat(task["next_due_at"])
        assert timedelta(hours=23) < due - datetime.now(UTC) <= timedelta(days=1)
        tid = task["id"]
        # Another member cannot see, edit, run or delete it: it does not exist for them.
        assert bob.get("tasks").json() == []
        for response in (bob.get(f"tasks/{tid}"), bob.patch(f"tasks/{tid}", json={"name": "x"}),
                         bob.post(f"tasks/{tid}/run"), bob.delete(f"tasks/{tid}")):
            _error(response, 404, "task_not_found")
        # Nor aim a task of theirs at alice's room.
        _error(bob.post("tasks", json={"name": "n", "prompt": "p", "conversation_id": room}),
               404, "conversation_not_found")

        before = alice.get("tasks").json()
        for body in ({"name": "n", "prompt": "p", "conversation_id": room,
                      "interval_seconds": 59},
                     {"name": "", "prompt": "p", "conversation_id": room},
                     {"name": "n", "prompt": "p", "conversation_id": room, "owner": "bob"},
                     {"name": "n", "prompt": "p", "conversation_id": room,
                      "first_run_at": "2030-01-01T08:00:00"}):  # no timezone
            _error(alice.post("tasks", json=body), 422, "schema_violation")
        _error(alice.post("tasks", content=b"{"), 400, "malformed_json")
        _error(alice.patch(f"tasks/{tid}", json={"status": "running"}), 422, "schema_violation")
        _error(alice.patch(f"tasks/{tid}", json={"name": "stale", "version": 7}), 409,
               "task_version_conflict")
        assert alice.get("tasks").json() == before  # nothing was written

        paused = alice.patch(f"tasks/{tid}", json={"status": "paused", "version": 1})
        assert paused.status_code == 200, paused.text
        assert paused.json()["next_due_at"] is None and paused.json()["version"] == 2
        resumed = alice.patch(f"tasks/{tid}", json={"status": "active"}).json()
        assert resumed["next_due_at"] is not None
        assert alice.delete(f"tasks/{tid}").status_code == 204
        _error(alice.get(f"tasks/{tid}"), 404, "task_not_found")


@pytest.mark.rule("R-051", "R-053")
def test_run_now_goes_through_the_rooms_queue_and_lands_in_the_inbox(
        task_server: ServerProcess) -> None:
    with task_server.client("alice") as alice:
        room = _room(alice)
        task = _task(alice, room, "how are the numbers this morning?")
        fired = alice.post(f"tasks/{task['id']}/run", json={"idempotency_key": "monday-1"})
        assert fired.status_code == 202, fired.text
        firing = fired.json()
        assert (firing["kind"], firing["posture"]) == ("run_now", "task_run")
        run = _settled(alice, firing["run_id"])
        assert run["status"] == "completed" and run["member"] == "alice"
        # The same journal as chat: the owner's input, admitted with the task posture.
        events = _events(alice, room, firing["run_id"])
        assert [e["type"] for e in events][:2] == ["input.accepted", "run.admitted"]
        assert events[0]["actor"] == "alice"
        assert events[1]["data"]["posture"] == "task_run"
        answer = next(e for e in events if e["type"] == "answer.committed")
        assert answer["data"]["text"] == "The numbers are steady."
        # A retried request with the same key is the same firing, not a second run.
        again = alice.post(f"tasks/{task['id']}/run", json={"idempotency_key": "monday-1"})
        assert again.status_code == 202 and again.json()["run_id"] == firing["run_id"]
        detail = alice.get(f"tasks/{task['id']}").json()
        assert [f["run_id"] for f in detail["firings"]] == [firing["run_id"]]
        assert detail["firings"][0]["run_status"] == "completed"
        # The owner hears of it in the inbox as a task run, even while watching nothing.
        deadline = time.monotonic() + 10
        notices: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not notices:
            notices = [n for n in alice.get("notifications").json()
                       if n["destination"].get("run_id") == firing["run_id"]]
            time.sleep(0.1)
        assert notices, "no inbox notice for the task run"
        assert notices[0]["destination"] == {"kind": "task_run", "task_id": task["id"],
                                             "run_id": firing["run_id"]}
        assert notices[0]["title"] == "Your task \u201cMorning check\u201d has an answer."


@pytest.mark.rule("R-055", "R-053")
def test_a_safe_test_performs_no_write_and_says_so(task_server: ServerProcess) -> None:
    with task_server.client("alice") as alice:
        room = _room(alice)
        task = _task(alice, room, "please write the morning note")
        before = _artifact_count(alice)
        fired = alice.post(f"tasks/{task['id']}/run", json={"mode": "test"})
        assert fired.status_code == 202, fired.text
        assert fired.json()["posture"] == "task_test"
        run = _settled(alice, fired.json()["run_id"])
        assert run["status"] == "completed", run
        (settled,) = [e for e in _events(alice, room, run["id"]) if e["type"] == "tool.settled"]
        assert settled["data"]["name"] == "create_artifact"
        assert settled["data"]["outcome"] == "error"
        assert "safe test" in settled["data"]["content"]
        assert _artifact_count(alice) == before  # nothing was written

        # The same task run for real writes the note.
        real = alice.post(f"tasks/{task['id']}/run").json()
        assert _settled(alice, real["run_id"])["status"] == "completed"
        assert _artifact_count(alice) == before + 1


@pytest.mark.rule("R-051", "R-054")
def test_a_due_task_fires_once_and_moves_to_its_next_due_time(
        task_server: ServerProcess) -> None:
    with task_server.client("alice") as alice:
        room = _room(alice)
        first = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
        task = _task(alice, room, "how are the numbers, scheduled?", interval_seconds=3600,
                     first_run_at=first)
        deadline = time.monotonic() + 15
        firings: list[dict[str, Any]] = []
        # A firing is committed a moment before its input is accepted: wait for its run.
        while time.monotonic() < deadline and not (firings and firings[0]["run_id"]):
            firings = alice.get(f"tasks/{task['id']}").json()["firings"]
            time.sleep(0.1)
        assert len(firings) == 1 and firings[0]["kind"] == "scheduled"
        assert _settled(alice, firings[0]["run_id"])["status"] == "completed"
        time.sleep(1.0)  # several more looks of the scheduler: still one firing
        detail = alice.get(f"tasks/{task['id']}").json()
        assert len(detail["firings"]) == 1
        next_due = datetime.fromisoformat(detail["next_due_at"])
        assert timedelta(minutes=59) < next_due - datetime.fromisoformat(first) \
            <= timedelta(hours=1)


@pytest.mark.rule("R-057")
def test_an_owner_who_left_the_room_cannot_fire_into_it(task_server: ServerProcess) -> None:
    with task_server.client("carol") as carol, task_server.client("bob") as bob:
        assert bob.get("agents").status_code == 200
        room = _room(carol, shared=True)
        assert carol.post(f"conversations/{room}/participants",
                          json={"member": "bob"}).status_code == 200
        task = _task(bob, room, "how are the numbers for bob?")
        assert carol.delete(f"conversations/{room}/participants/bob").status_code == 200
        # The firing re-resolves the owner's access now: nothing is accepted.
        _error(bob.post(f"tasks/{task['id']}/run"), 404, "conversation_not_found")
        assert [e for e in carol.get(f"conversations/{room}/journal").json()["events"]
                if e["type"] == "input.accepted"] == []


def _one_call(client: httpx.Client, room: str, run_id: str, name: str) -> dict[str, Any]:
    calls = [e["data"] for e in _events(client, room, run_id)
             if e["type"] == "tool.settled" and e["data"]["name"] == name]
    assert calls, f"no {name} call settled"
    return calls[0]


@pytest.mark.rule("R-185", "R-188", "R-051")
def test_background_work_is_one_durable_attempt_and_cadence_words_make_a_loop(
        task_server: ServerProcess) -> None:
    with task_server.client("alice") as alice:
        room = _room(alice)
        sent = alice.post(f"conversations/{room}/messages",
                          json={"text": "please check the numbers in the background"}).json()
        assert _settled(alice, sent["run_id"])["status"] == "completed"
        call = _one_call(alice, room, sent["run_id"], "manage_tasks")
        assert call["outcome"] == "ok", call
        background = [t for t in alice.get("tasks").json()
                      if t["prompt"] == "how are the numbers, later?"]
        assert len(background) == 1 and background[0]["interval_seconds"] is None
        (firing,) = alice.get(f"tasks/{background[0]['id']}").json()["firings"]
        assert firing["kind"] == "background"
        # Exactly one attempt, queued in this room after the turn that asked for it.
        later = _settled(alice, firing["run_id"])
        assert later["status"] == "completed" and later["member"] == "alice"
        answers = [e["data"]["text"] for e in _events(alice, room, firing["run_id"])
                   if e["type"] == "answer.committed"]
        assert answers == ["The numbers are steady."]

        # "every morning": the cadence words make it a loop, not one run.
        sent = alice.post(f"conversations/{room}/messages",
                          json={"text": "please check every morning"}).json()
        assert _settled(alice, sent["run_id"])["status"] == "completed"
        loops = [t for t in alice.get("tasks").json()
                 if t["prompt"] == "check the sales every morning"]
        assert len(loops) == 1 and loops[0]["interval_seconds"] == 86400
        assert loops[0]["conversation_id"] == room  # the tool's room, never an argument
        assert alice.get(f"tasks/{loops[0]['id']}").json()["firings"] == []
        seen = _one_call(alice, room, sent["run_id"], "inspect_tasks")
        assert "check the sales every morning" in seen["content"]


@pytest.mark.rule("R-187")
def test_no_model_visible_wait_or_process_control_tool_exists() -> None:
    from kaizen_server_extension.tools.manifest import BUILTIN_TOOLS

    names = list(BUILTIN_TOOLS)
    assert "manage_tasks" in names and "inspect_tasks" in names
    forbidden = ("sleep", "wait", "poll", "consent", "checkpoint", "process", "goal", "kill")
    assert [n for n in names if any(word in n for word in forbidden)] == []
