"""A task prompt's step attachments through the REST API of a real server and the fake model
(policy/prompt_attachments.py, docs/tasks.md "Attaching a tool").

Saving a prompt checks its ``{{tool:surface/name}}`` tokens against the tools of now, and so
does every run, before any step: the model is not asked anything for a run whose attachment
no longer resolves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by
from tests.lanes.test_turns import _events, _settled
from tests.support.server import ServerProcess

ATTACHED = "check the team {{tool:agents/list_available_agents}} and report"
DIRECTIVE = "(use the tool list_available_agents for this)"
SCRIPTS: list[dict[str, Any]] = [
    {"match": "check the team", "responses": [
        {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"text": "The team has its agents."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess,
                                                                       FakeOpenAI]]:
    root = tmp_path_factory.mktemp(f"attachments-{request.param}")
    with FakeOpenAI(SCRIPTS) as fake, served_by(str(request.param), root, fake) as proc:
        yield proc, fake


def _room(client: httpx.Client, agent: str = "general") -> str:
    created = client.post("conversations", json={"agent_id": agent})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _create(client: httpx.Client, room: str, prompt: str) -> httpx.Response:
    return client.post("tasks", json={"name": "Team check", "prompt": prompt,
                                      "conversation_id": room})


def _refused(response: httpx.Response, *needles: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "attachment_invalid"
    for needle in needles:
        assert needle in error["message"]


def _user_texts(requests: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content")) for r in requests for m in r.get("messages", [])
            if m.get("role") == "user"]


@pytest.mark.rule("R-206", "R-207")
def test_saving_a_prompt_refuses_an_attachment_the_task_cannot_use(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, _ = served
    with server.client("alice") as alice:
        general, search = _room(alice), _room(alice, "search")
        before = alice.get("tasks").json()
        _refused(_create(alice, general, "look {{tool:no_such_tool}}"),
                 "{{tool:no_such_tool}}", "not a tool")
        _refused(_create(alice, general, "look {{tool:artifacts/list_available_agents}}"),
                 "not a tool")  # the right name on the wrong surface
        _refused(_create(alice, general, "look {{connector:warehouse}}"), "warehouse")
        _refused(_create(alice, general, "look {{tool:run code}}"), "not an attachment")
        # run_code is outside the Search agent's ceiling: the search room cannot attach it.
        _refused(_create(alice, search, "sum it {{tool:run_code}}"),
                 "not available to this task's agent")
        assert alice.get("tasks").json() == before  # nothing was saved

        task = _create(alice, general, ATTACHED)
        assert task.status_code == 201, task.text
        assert task.json()["prompt"] == ATTACHED  # stored as written
        # Editing the prompt is checked the same way; the refused edit changes nothing.
        tid = task.json()["id"]
        _refused(alice.patch(f"tasks/{tid}", json={"prompt": "x {{tool:no_such_tool}}"}))
        assert alice.get(f"tasks/{tid}").json()["version"] == 1


@pytest.mark.rule("R-205", "R-208", "R-210", "R-211")
def test_a_run_reads_the_directive_and_calls_the_attached_tool_through_the_pipeline(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as alice:
        room = _room(alice)
        task = _create(alice, room, ATTACHED).json()
        fake.reset()
        fired = alice.post(f"tasks/{task['id']}/run")
        assert fired.status_code == 202, fired.text
        run = _settled(alice, fired.json()["run_id"])
        assert run["status"] == "completed", run
        requests = fake.requests()
        texts = _user_texts(requests)
        assert any(DIRECTIVE in text for text in texts), texts
        assert not any("{{tool:" in text for text in texts)
        first_tools = {t["function"]["name"] for t in requests[0].get("tools", [])}
        assert "list_available_agents" in first_tools
        # The attached tool ran as any call does: requested, settled, journaled.
        events = _events(alice, room, run["id"])
        settled = [e for e in events if e["type"] == "tool.settled"]
        assert [e["data"]["name"] for e in settled] == ["list_available_agents"]
        assert settled[0]["data"]["outcome"] == "ok"
        # The journal keeps what the member saved; the task itself is unchanged.
        assert events[0]["data"]["text"] == ATTACHED
        assert alice.get(f"tasks/{task['id']}").json()["prompt"] == ATTACHED

        # In chat the same token is only text: nothing is attached or rewritten.
        fake.reset()
        sent = alice.post(f"conversations/{room}/messages",
                          json={"text": "hello {{tool:agents/list_available_agents}}"})
        assert sent.status_code == 202, sent.text
        _settled(alice, sent.json()["run_id"])
        assert any("hello {{tool:agents/list_available_agents}}" in text
                   for text in _user_texts(fake.requests()))


@pytest.mark.rule("R-206", "R-207")
def test_an_attachment_turned_off_after_saving_blocks_the_run_before_any_step(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("carol") as carol, server.client("dave") as dave:
        room = _room(carol)
        task = _create(carol, room, ATTACHED).json()
        policy = "admin/tool-policies/list_available_agents/carol"
        assert dave.put(policy, json={"allowed": False}).status_code == 200
        try:
            fake.reset()
            fired = carol.post(f"tasks/{task['id']}/run")
            assert fired.status_code == 202, fired.text
            run = _settled(carol, fired.json()["run_id"])
            assert (run["status"], run["outcome"]) == ("failed", "attachment_invalid"), run
            assert fake.requests() == []  # the model was never asked
            terminal = [e for e in _events(carol, room, run["id"])
                        if e["type"] == "run.terminal"]
            assert "turned off for you" in terminal[0]["data"]["message"]
            _refused(carol.patch(f"tasks/{task['id']}", json={"prompt": ATTACHED}),
                     "turned off for you")
        finally:
            assert dave.delete(policy).status_code == 204
        # Turned back on, the same task runs again.
        again = carol.post(f"tasks/{task['id']}/run").json()
        assert _settled(carol, again["run_id"])["status"] == "completed"
