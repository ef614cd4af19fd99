"""Turns end to end: REST in, the room lane, the controller, the fake model, the journal."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.support.server import SERVER_TOKEN, ServerProcess

TERMINAL = {"completed", "failed", "answer_unavailable", "cancelled"}


def _room(client: httpx.Client, shared: bool = False) -> str:
    response = client.post("conversations", json={"agent_id": "general", "shared": shared})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _send(client: httpx.Client, room: str, text: str, **extra: Any) -> dict[str, Any]:
    response = client.post(f"conversations/{room}/messages", json={"text": text, **extra})
    assert response.status_code == 202, response.text
    return dict(response.json())


def _settled(client: httpx.Client, run_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(f"runs/{run_id}").json()
        if run["status"] in TERMINAL:
            return dict(run)
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not settle: {run}")


def _pending_approval(client: httpx.Client, run_id: str,
                      timeout: float = 60) -> dict[str, Any]:
    """The run's first pending approval request, once it is visible."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = [a for a in client.get("approvals", params={"status": "pending"}).json()
                   if a["run_id"] == run_id]
        if pending:
            return dict(pending[0])
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} requested no approval")


def _events(client: httpx.Client, room: str, run_id: str | None = None) -> list[dict[str, Any]]:
    events = client.get(f"conversations/{room}/journal", params={"limit": 1000}).json()["events"]
    return [e for e in events if run_id is None or e["run_id"] == run_id]


def test_a_message_gets_a_committed_answer(model_server: ServerProcess) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "please say hello")
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "completed" and run["outcome"] == "answered"
        assert run["steps"] == 1
        types = [e["type"] for e in _events(alice, room, accepted["run_id"])]
        assert types == ["input.accepted", "run.admitted", "model.step.started",
                         "answer.committed", "run.terminal"]
        committed = next(e for e in _events(alice, room) if e["type"] == "answer.committed")
        assert committed["data"]["text"] == "Hello from the model."


@pytest.mark.rule("R-011")
def test_thinking_never_reaches_the_durable_journal(model_server: ServerProcess) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        run = _send(alice, room, "say hello again")
        _settled(alice, run["run_id"])
        journal = str(_events(alice, room))
        assert "A greeting is enough." not in journal


def test_a_tool_call_goes_through_the_pipeline(model_server: ServerProcess) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "who can help me?")
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "completed" and run["tool_calls"] == 1
        events = _events(alice, room, accepted["run_id"])
        settled = next(e for e in events if e["type"] == "tool.settled")
        assert settled["data"]["name"] == "list_available_agents"
        assert settled["data"]["outcome"] == "ok"
        assert "General" in settled["data"]["content"]
        assert "persona" not in settled["data"]["content"]  # a projection, not the rows
    # Every invocation is counted by tool, capability and outcome in the server's /metrics.
    metrics = httpx.get(model_server.base_url + "metrics",
                        headers={"Authorization": f"token {SERVER_TOKEN}"}).text
    assert ('kaizen_tool_invocations_total{capability="read",outcome="ok",'
            'tool="list_available_agents"}') in metrics


@pytest.mark.rule("R-001")
def test_a_tool_outside_the_agents_ceiling_never_runs(model_server: ServerProcess) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "tool outside ceiling please")
        _settled(alice, accepted["run_id"])
        settled = [e for e in _events(alice, room, accepted["run_id"])
                   if e["type"] == "tool.settled"]
        assert settled and all(e["data"]["outcome"] != "ok" for e in settled)


@pytest.mark.rule("R-008", "R-009", "R-352")
def test_a_transient_provider_failure_is_retried_before_commit(
    model_server: ServerProcess,
) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "flaky provider today")
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "completed"
        types = [e["type"] for e in _events(alice, room, accepted["run_id"])]
        assert "retry.scheduled" in types


@pytest.mark.rule("R-351")
def test_a_deterministic_provider_failure_settles_without_leaking(
    model_server: ServerProcess,
) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "broken request")
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "failed" and run["outcome"] == "provider_invalid_request"
        events = _events(alice, room, accepted["run_id"])
        assert "secret-ish" not in str(_events(alice, room))
        # One content-free diagnostic, and the identical payload is not sent again.
        assert [e["type"] for e in events].count("model.step.started") == 1
        assert "retry.scheduled" not in [e["type"] for e in events]
        [terminal] = [e for e in events if e["type"] == "run.terminal"]
        assert terminal["data"]["reason"] == "provider_invalid_request"


@pytest.mark.rule("R-024", "R-025")
def test_messages_sent_while_busy_queue_in_order(model_server: ServerProcess) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        runs = [_send(alice, room, f"queued message {i}")["run_id"] for i in range(4)]
        for run_id in runs:
            assert _settled(alice, run_id)["status"] == "completed"
        events = _events(alice, room)
        admitted = [e["run_id"] for e in events if e["type"] == "run.admitted"]
        assert admitted == runs  # FIFO
        # Never two active: each run is admitted only after the previous one settled.
        active = 0
        for event in events:
            if event["type"] == "run.admitted":
                active += 1
                assert active == 1
            elif event["type"] == "run.terminal":
                active -= 1


@pytest.mark.rule("R-026")
def test_steering_keeps_its_place_and_uses_the_steering_members_model(
    model_server: ServerProcess,
) -> None:
    with model_server.client("alice") as alice, model_server.client("bob") as bob:
        bob.put("members/me/settings", json={"approval_mode": "ask_for_writes",
                                             "model": "bobs-model"})
        room = _room(alice, shared=True)
        alice.post(f"conversations/{room}/participants", json={"member": "bob"})
        first = _send(alice, room, "queued first")
        steer = _send(bob, room, "queued steering", kind="steering")
        assert steer["position"] == first["position"] + 1
        _settled(alice, first["run_id"])
        run = _settled(bob, steer["run_id"])
        assert run["status"] == "completed" and run["member"] == "bob"
        admitted = next(e for e in _events(alice, room, steer["run_id"])
                        if e["type"] == "run.admitted")
        assert admitted["data"]["model"] == "bobs-model"
        assert admitted["data"]["agent_id"] == "general"


@pytest.mark.rule("R-014")
def test_cancel_settles_once_and_the_queue_moves_on(model_server: ServerProcess) -> None:
    with model_server.client("alice") as alice:
        room = _room(alice)
        slow = _send(alice, room, "slow answer please")
        after = _send(alice, room, "queued after the slow one")
        deadline = time.monotonic() + 10
        while alice.get(f"runs/{slow['run_id']}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # A busy room says so in its listing, with the run a client could stop.
        listed = {c["id"]: c for c in alice.get("conversations").json()}
        assert listed[room]["active_run"] == {"id": slow["run_id"], "status": "running"}
        cancelled = alice.post(f"runs/{slow['run_id']}/cancel")
        assert cancelled.status_code == 202
        assert _settled(alice, slow["run_id"])["status"] == "cancelled"
        again = alice.post(f"runs/{slow['run_id']}/cancel")
        assert again.status_code == 409
        assert _settled(alice, after["run_id"])["status"] == "completed"
        terminals = [e for e in _events(alice, room, slow["run_id"])
                     if e["type"] == "run.terminal"]
        assert len(terminals) == 1
        assert not any(e["type"] == "answer.committed"
                       for e in _events(alice, room, slow["run_id"]))


def test_another_member_cannot_cancel_a_private_run(model_server: ServerProcess) -> None:
    with model_server.client("alice") as alice, model_server.client("bob") as bob:
        room = _room(alice)
        slow = _send(alice, room, "slow answer again")
        assert bob.post(f"runs/{slow['run_id']}/cancel").status_code == 404
        alice.post(f"runs/{slow['run_id']}/cancel")


def test_without_a_model_the_run_fails_with_a_clear_message(server: ServerProcess) -> None:
    with server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "anyone there?")
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "failed" and run["outcome"] == "model_not_configured"
        terminal = _events(alice, room, accepted["run_id"])[-1]
        assert "KAIZEN_MODEL_BASE_URL" in terminal["data"]["message"]


@pytest.mark.rule("R-028", "R-029")
async def test_closing_the_observer_socket_cancels_nothing(model_server: ServerProcess) -> None:
    import asyncio

    from tests.events.support import connect, read_until

    with model_server.client("alice") as alice:
        room = _room(alice)
        ws = await connect(model_server, "alice", room)
        accepted = _send(alice, room, "queued while watching")
        # Watch until the run is admitted, then walk away mid-turn.
        await read_until(ws, lambda frames: any(f.get("type") == "run.admitted" for f in frames))
        ws.close()
        await asyncio.sleep(0)
        run = _settled(alice, accepted["run_id"])
        assert run["status"] == "completed"
        assert any(e["type"] == "answer.committed"
                   for e in _events(alice, room, accepted["run_id"]))


@pytest.mark.rule("R-037")
def test_a_committed_answer_is_shared_with_every_participant(
    model_server: ServerProcess,
) -> None:
    with model_server.client("alice") as alice, model_server.client("bob") as bob:
        room = _room(alice, shared=True)
        alice.post(f"conversations/{room}/participants", json={"member": "bob"})
        accepted = _send(alice, room, "say hello to the room")
        _settled(alice, accepted["run_id"])
        answers = [e for e in _events(bob, room) if e["type"] == "answer.committed"]
        assert [a["data"]["text"] for a in answers] == ["Hello from the model."]
