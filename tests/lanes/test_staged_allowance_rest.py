"""Staged creation's separate round allowance, end to end over REST (R-039, R-074).

A real server with AGENT_LOOP_MAX_CYCLES=2 and the scripted model: the turn opens three
staged drafts (three staged rounds, more than the general budget) and then still has its
general rounds for an ordinary tool call before it answers. Had the staged rounds been drawn
from the general budget, the third step would have been the forced synthesis, which has no
tools, and the scripted tool call there would have failed the turn as non-delivery.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from tests.conftest import BACKENDS, scripted_server, with_server_store
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.server import ServerProcess


def _begin(title: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "begin_artifact",
                            "arguments": {"title": title, "kind": "markdown"}}]}


SCRIPTS: list[dict[str, Any]] = [
    {"match": "draft three outlines", "responses": [
        _begin("Outline one"), _begin("Outline two"), _begin("Outline three"),
        {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"text": "Three drafts are open."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def small_budget_server(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"staged-allowance-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS,
                         {"AGENT_LOOP_MAX_CYCLES": "2"}) as proc:
        yield proc


@pytest.mark.rule("R-039", "R-074")
def test_staged_rounds_are_not_drawn_from_the_general_cycle_budget(
        small_budget_server: ServerProcess) -> None:
    with small_budget_server.client("alice") as alice:
        # No approval card for the member's own drafts: the budget is what is under test.
        assert alice.put("members/me/settings",
                         json={"approval_mode": "never_ask"}).status_code == 200
        room = _room(alice)
        accepted = _send(alice, room, "draft three outlines")
        run = _settled(alice, accepted["run_id"])

        assert run["status"] == "completed", run
        assert run["outcome"] == "answered"
        events = _events(alice, room, accepted["run_id"])
        steps = [e["data"] for e in events if e["type"] == "model.step.started"]
        assert [s["synthesis"] for s in steps] == [False] * 5  # no forced synthesis
        settled = [e["data"] for e in events if e["type"] == "tool.settled"]
        assert [(s["name"], s["outcome"]) for s in settled] == [
            ("begin_artifact", "ok"), ("begin_artifact", "ok"), ("begin_artifact", "ok"),
            ("list_available_agents", "ok")]
        answer = next(e["data"] for e in events if e["type"] == "answer.committed")
        assert answer["text"] == "Three drafts are open."

    # Each begin went through the ordinary store path: one open draft per call, owned by
    # the member and fenced to this run.
    async def drafts(store: Store) -> list[tuple[str, str, str, str]]:
        async with store.transaction() as tx:
            rows = (await tx.session.execute(
                select(m.ArtifactDraft).where(m.ArtifactDraft.run_id == accepted["run_id"])
                .order_by(m.ArtifactDraft.title))).scalars().all()
            return [(d.title, d.owner, d.conversation_id, d.status) for d in rows]

    assert with_server_store(small_budget_server, drafts) == [
        (title, "alice", room, "open")
        for title in ("Outline one", "Outline three", "Outline two")]
