"""Operator plugins (KAIZEN_PLUGINS) add agents and guardrails through the public hooks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]

SCRIPTS = [{"match": "who can help", "responses": [
    {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
    {"text": "Here is what I found."}]}]


@pytest.fixture(scope="module")
def plugin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("plugin-server")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_PLUGINS": "tests.support.sample_plugin",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])),
        })
        try:
            yield server
        finally:
            server.stop()


def test_a_plugin_agent_is_seeded_and_usable(plugin_server: ServerProcess) -> None:
    with plugin_server.client("alice") as alice:
        agents = {a["id"]: a for a in alice.get("agents").json()}
        assert agents["analyst"]["tools"] == ["list_available_agents"]
        created = alice.post("conversations", json={"agent_id": "analyst"})
        assert created.status_code == 201


@pytest.mark.rule("R-237")
def test_a_plugin_guardrail_denies_in_the_shared_chain(plugin_server: ServerProcess) -> None:
    with plugin_server.client("carol") as carol, plugin_server.client("alice") as alice:
        for client, expected in ((carol, "error"), (alice, "ok")):
            room = _room(client)
            accepted = _send(client, room, "who can help?")
            _settled(client, accepted["run_id"])
            settled = next(e for e in _events(client, room, accepted["run_id"])
                           if e["type"] == "tool.settled")
            assert settled["data"]["outcome"] == expected, settled
        assert "Analyst" not in str(settled) or expected == "ok"


def test_a_plugin_that_cannot_be_imported_stops_start_up(tmp_path: Path) -> None:
    server = start_server(tmp_path, sqlite_url_for(tmp_path / "k.db"),
                          extra_env={"KAIZEN_PLUGINS": "no_such_kaizen_plugin"}, wait=False)
    try:
        code = server.process.wait(60)
    finally:
        server.stop()
    assert code != 0 and "KAIZEN_PLUGINS" in server.log()
