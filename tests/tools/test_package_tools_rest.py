"""Operator-installed package tools, end to end through a real server (KAIZEN_PACKAGE_TOOLS_DIR):
registered as third-party tools, run in a secretless child interpreter, journaled like any
tool, and refused at start-up when a manifest is unusable or takes a built-in name."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.lanes.test_turns import _events, _send, _settled
from tests.support.server import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-live-package-must-not-see-this"

PACKAGE = '''
import os

def env_names():
    return {"names": sorted(os.environ)}

def add(a, b):
    return {"sum": a + b}
'''
MANIFEST = [
    {"name": "acme_env", "description": "The names of the package's environment.",
     "entry": "acme:env_names", "input_schema": {"type": "object", "properties": {}},
     "capability": "read", "room_class": "actor_bound_read"},
    {"name": "acme_sum", "description": "Add two numbers.", "entry": "acme:add",
     "input_schema": {"type": "object", "required": ["a", "b"],
                      "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
     "capability": "read", "room_class": "actor_bound_read"},
]
SCRIPTS = [
    {"match": "environment", "responses": [
        {"tool_calls": [{"name": "acme_env", "arguments": {}}]},
        {"text": "Listed."}]},
    {"match": "add", "responses": [
        {"tool_calls": [{"name": "acme_sum", "arguments": {"a": 2, "b": 40}}]},
        {"text": "It is 42."}]},
]


def install(directory: Path, manifest: object) -> Path:
    package = directory / "acme"
    package.mkdir(parents=True)
    (package / "acme.py").write_text(textwrap.dedent(PACKAGE))
    (package / "kaizen-tools.json").write_text(json.dumps(manifest))
    return directory


def _env(root: Path, packages: Path, fake: FakeOpenAI | None = None) -> dict[str, str]:
    env = {"KAIZEN_PACKAGE_TOOLS_DIR": str(packages),
           "KAIZEN_PLUGINS": "tests.support.package_agent_plugin",
           "KAIZEN_MODEL_API_KEY": SECRET,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    if fake is not None:
        env.update(KAIZEN_MODEL_BASE_URL=fake.base_url, KAIZEN_MODEL="fake")
    return env


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("packaged-server")
    packages = install(root / "packages", MANIFEST)
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"),
                              extra_env=_env(root, packages, fake))
        try:
            yield server
        finally:
            server.stop()


def _room(client: object) -> str:
    response = client.post("conversations",  # type: ignore[attr-defined]
                           json={"agent_id": "packaged"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.mark.rule("R-465")
def test_an_installed_package_tool_runs_without_the_servers_secrets(
        packaged: ServerProcess) -> None:
    with packaged.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, "list your environment")
        assert _settled(alice, accepted["run_id"])["status"] == "completed"
        settled = [e for e in _events(alice, room, accepted["run_id"])
                   if e["type"] == "tool.settled"]
    assert [e["data"]["outcome"] for e in settled] == ["ok"]
    names = json.loads(settled[0]["data"]["content"])["names"]
    # Only the runner's allowlist reaches the child: no key, token, database or KAIZEN_*.
    assert set(names) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR",
                          "PYTHONDONTWRITEBYTECODE"}
    assert SECRET not in settled[0]["data"]["content"]


def test_a_package_tool_is_listed_validated_and_journaled_like_any_tool(
        packaged: ServerProcess) -> None:
    with packaged.client("bob") as bob:
        room = _room(bob)
        tools = bob.get("tools", params={"conversation_id": room}).json()
        listed = {t["name"] for t in tools} if isinstance(tools, list) else {
            t["name"] for t in tools.get("tools", [])}
        assert {"acme_env", "acme_sum"} <= listed
        accepted = _send(bob, room, "add two and forty")
        assert _settled(bob, accepted["run_id"])["status"] == "completed"
        events = _events(bob, room, accepted["run_id"])
    requested = [e for e in events if e["type"] == "tool.requested"]
    settled = [e for e in events if e["type"] == "tool.settled"]
    assert [e["data"]["name"] for e in requested] == ["acme_sum"]
    assert json.loads(settled[0]["data"]["content"]) == {"sum": 42}


@pytest.mark.parametrize("manifest, says", [
    ("not json", "is not readable JSON"),
    ({"name": "acme_env"}, "must be a JSON list"),
    ([{"name": "bad name!", "entry": "acme:env_names"}], "valid name"),
    # A package cannot take a built-in tool's name.
    ([{**MANIFEST[0], "name": "run_code"}], "A tool plugin was refused"),
])
def test_an_unusable_package_stops_start_up_naming_it(tmp_path: Path, manifest: object,
                                                      says: str) -> None:
    packages = tmp_path / "packages"
    directory = install(packages, [])
    (directory / "acme" / "kaizen-tools.json").write_text(
        manifest if isinstance(manifest, str) else json.dumps(manifest))
    server = start_server(tmp_path, sqlite_url_for(tmp_path / "k.db"),
                          extra_env=_env(tmp_path, packages), wait=False)
    try:
        code = server.process.wait(60)
    finally:
        server.stop()
    assert code != 0
    log = server.log()
    assert says in log, log[-2000:]
