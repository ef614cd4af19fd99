"""One scripted turn that makes one tool call, through a real server, and the call's
``tool.settled`` data: what the credential and source tests look at."""

from __future__ import annotations

from typing import Any

from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.server import ServerProcess

DEFAULT_SCRIPT: dict[str, Any] = {"responses": [{"text": "Default."}]}


def settled_calls_of_turn(server: ServerProcess, fake: FakeOpenAI, member: str, agent_id: str,
                          text: str, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """In a new room of ``agent_id``, ``member`` says ``text``; the model calls ``name`` with
    ``arguments`` once, then answers. Returns the ``tool.settled`` data of the turn."""
    fake.load([{"match": text, "responses": [
        {"tool_calls": [{"name": name, "arguments": arguments}]}, {"text": "Done."}]},
        DEFAULT_SCRIPT])
    with server.client(member) as client:
        room = client.post("conversations", json={"agent_id": agent_id}).json()["id"]
        accepted = _send(client, room, text)
        _settled(client, accepted["run_id"], timeout=120)
        return [dict(e["data"]) for e in _events(client, room, accepted["run_id"])
                if e["type"] == "tool.settled"]
