"""A whole turn through a real server: the provider cuts update_artifact's argument stream,
the building row survives as a checkpoint, the step's retry resumes that same row, and the
completed call freezes it into exactly one new version (R-245)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from sqlalchemy import select

from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import BACKENDS, served_by, with_server_store
from tests.support.server import ServerProcess

T = TypeVar("T")
TERMINAL = {"completed", "failed", "answer_unavailable", "cancelled"}


@pytest.fixture(params=BACKENDS)
def served(request: pytest.FixtureRequest,
           tmp_path: Path) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    fake = FakeOpenAI([{"responses": [{"text": "Nothing scripted yet."}]}])
    with fake, served_by(str(request.param), tmp_path, fake) as proc:
        yield proc, fake


def _settled(client: httpx.Client, run_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = client.get(f"runs/{run_id}").json()
        if run["status"] in TERMINAL:
            return dict(run)
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not settle")


@pytest.mark.rule("R-245")
def test_a_cut_update_stream_is_resumed_by_the_retry_and_frozen_once(
        served: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = served
    with server.client("alice") as client:
        assert client.put("members/me/settings",
                          json={"approval_mode": "never_ask"}).status_code == 200
        created = client.post("conversations", json={"agent_id": "general"})
        assert created.status_code == 201, created.text
        room = created.json()["id"]

        async def seed(store: Store) -> str:
            made = await ArtifactStore(store).create(
                "alice", title="Plan", kind="markdown", content="# Plan\n",
                where=WriteContext(room))
            return made.artifact_id
        artifact_id = with_server_store(server, seed)

        content = "# Plan\n\n" + "".join(f"Step {i}: do the thing.\n" for i in range(40))
        call = {"id": "call_up", "name": "update_artifact", "fragments": 8,
                "arguments": {"artifact_id": artifact_id, "content": content}}
        # Slot 0: the first attempt is cut after 4 of the 8 argument pieces, the retry
        # completes; slot 1 answers after the tool round.
        fake.load([{"match": "finish the plan", "responses": [
            {"attempts": [{"tool_calls": [call], "cut_after_chunks": 6},
                          {"tool_calls": [call]}]},
            {"text": "The plan is finished."}]}])
        sent = client.post(f"conversations/{room}/messages", json={"text": "finish the plan"})
        assert sent.status_code == 202, sent.text
        run = _settled(client, sent.json()["run_id"])
        assert run["status"] == "completed", run

    async def inspect(store: Store) -> tuple[list[int], list[m.ArtifactUpdateCheckpoint]]:
        versions = await ArtifactStore(store).versions("alice", artifact_id)
        async with store.transaction() as tx:
            rows = list((await tx.session.execute(
                select(m.ArtifactUpdateCheckpoint))).scalars())
        return versions, rows

    versions, rows = with_server_store(server, inspect)
    assert versions == [1, 2]  # exactly one new version
    (row,) = rows  # one building row carried through the cut, the retry and completion
    assert (row.status, row.frozen_version, row.owner) == ("frozen", 2, "alice")
    # Opened by the cut attempt (fence 1), taken over by the retry's stream (2), frozen by
    # the completed call (3).
    assert row.fence == 3
    # It holds the complete arguments the retry streamed, not the cut attempt's prefix.
    assert json.loads(row.arguments) == {"artifact_id": artifact_id, "content": content}
