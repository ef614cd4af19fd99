"""Task firing across real server processes: two replicas on one PostgreSQL schema fire each
due time once, and a server killed with SIGKILL before a due time fires it once after its
restart (docs/tasks.md, "Scheduling, replicas and crashes")."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import POSTGRES_URL, drop_schema, new_schema
from tests.lanes.test_turns import _events, _settled
from tests.support.server import ServerProcess, start_server

SCRIPTS: list[dict[str, Any]] = [{"responses": [{"text": "Checked."}]}]
#: Every replica looks this often: a due task is seen by both within one look.
POLL = {"KAIZEN_TASK_POLL_SECONDS": "0.05"}


def _room(client: httpx.Client) -> str:
    created = client.post("conversations", json={"agent_id": "general"})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _due_task(client: httpx.Client, room: str, at: datetime) -> str:
    created = client.post("tasks", json={
        "name": "hourly", "prompt": "check the numbers", "conversation_id": room,
        "interval_seconds": 3600, "first_run_at": at.isoformat()})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _firings_when_fired(client: httpx.Client, task_id: str,
                        timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        firings: list[dict[str, Any]] = client.get(f"tasks/{task_id}").json()["firings"]
        if firings and all(f["run_id"] for f in firings):
            return firings
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} did not fire")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    if not POSTGRES_URL:
        pytest.skip("needs KAIZEN_TEST_DATABASE_URL")
    schema = new_schema()
    servers: list[ServerProcess] = []
    with FakeOpenAI(SCRIPTS) as fake:
        env = {"KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model", **POLL}
        try:
            # One after the other: the first migrates and seeds the schema.
            for name in ("a", "b"):
                servers.append(start_server(tmp_path_factory.mktemp(f"task-replica-{name}"),
                                            POSTGRES_URL, schema, extra_env=env))
            yield servers
        finally:
            for server in servers:
                server.stop()
            asyncio.run(drop_schema(schema))


@pytest.mark.rule("R-051", "R-054")
def test_two_replicas_fire_each_due_time_exactly_once(replicas: list[ServerProcess]) -> None:
    a, b = replicas
    with a.client("alice") as alice, b.client("alice") as alice_b:
        rooms = [_room(alice) for _ in range(6)]
        # Due a moment from now, so both replicas are looking when it comes.
        at = datetime.now(UTC) + timedelta(seconds=1)
        tasks = [_due_task(alice, room, at) for room in rooms]
        for task_id in tasks:
            (firing,) = _firings_when_fired(alice_b, task_id)
            assert firing["kind"] == "scheduled"
            assert _settled(alice, firing["run_id"])["status"] == "completed"
        time.sleep(1.0)  # twenty more looks by each replica
        for task_id, room in zip(tasks, rooms, strict=True):
            assert len(alice.get(f"tasks/{task_id}").json()["firings"]) == 1
            inputs = [e for e in _events(alice, room) if e["type"] == "input.accepted"]
            assert len(inputs) == 1 and inputs[0]["actor"] == "alice"


@pytest.mark.rule("R-054")
def test_a_due_time_passed_while_the_server_was_killed_fires_once_after_restart(
        tmp_path: Path) -> None:
    url = sqlite_url_for(tmp_path / "kaizen.db")
    with FakeOpenAI(SCRIPTS) as fake:
        env = {"KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model", **POLL}
        server = start_server(tmp_path / "first", url, extra_env=env)
        try:
            with server.client("alice") as alice:
                room = _room(alice)
                task_id = _due_task(alice, room, datetime.now(UTC) + timedelta(seconds=2))
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(10)
            time.sleep(3)  # the due time passes while no server runs
        finally:
            server.stop()
        restarted = start_server(tmp_path / "second", url, extra_env=env)
        try:
            with restarted.client("alice") as alice:
                (firing,) = _firings_when_fired(alice, task_id)
                assert _settled(alice, firing["run_id"])["status"] == "completed"
                time.sleep(0.5)
                detail = alice.get(f"tasks/{task_id}").json()
                assert len(detail["firings"]) == 1
                assert datetime.fromisoformat(detail["next_due_at"]) > datetime.now(UTC)
        finally:
            restarted.stop()
