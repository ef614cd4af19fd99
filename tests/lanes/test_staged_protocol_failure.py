"""A staged operation the step was not offered is journaled as denied, emits one typed
protocol failure and stops the attempt (spec: What happens on a tool call; R-252).

The pipeline half runs on in-memory ports: a call the controller marked ``refused`` is settled
as a typed denial without anything running, and a staged operation outside the agent's
ceiling gets the same typed reason instead of the generic ``over_ceiling``. The end-to-end
half is a real server with the scripted model: a required-tool step (which advertises only
the required tool) asks for ``begin_artifact`` and then the required tool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from sqlalchemy import select

from kaizen_server_extension.protocol.tools import (
    Capability,
    ProtocolFailure,
    ToolCallRequest,
    ToolOutcome,
    WriteCategory,
)
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from tests.conftest import BACKENDS, scripted_server, with_server_store
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.policy.fakes import BUNDLE, harness, make_tool, returning
from tests.support.server import ServerProcess

UNAVAILABLE = ProtocolFailure.STAGED_PROTOCOL_UNAVAILABLE


def _begin_artifact() -> Any:
    async def impl(arguments: Mapping[str, Any]) -> object:
        return {"draft_id": "d-1", "sequence": 0}

    return make_tool("begin_artifact", impl, capability=Capability.WRITE,
                     write_category=WriteCategory.MEMBER_STORE)


# --- the pipeline -----------------------------------------------------------------------


@pytest.mark.rule("R-252")
async def test_a_refused_call_is_denied_with_its_typed_reason_and_nothing_runs() -> None:
    h = harness(_begin_artifact())
    request = ToolCallRequest("c-1", "begin_artifact", '{"title": "x"}', 3, refused=UNAVAILABLE)

    result = await h.pipeline.run(BUNDLE, request)

    assert result.outcome is ToolOutcome.ERROR and result.closes_turn
    assert result.denied is UNAVAILABLE and result.close_reason == UNAVAILABLE.value
    assert h.executed == []
    # The refusal is final before any other check: nothing resolved, one audit row.
    assert h.permissions.calls == 0
    assert len(h.audit.entries) == 1


@pytest.mark.rule("R-252", "R-098")
async def test_a_staged_operation_outside_the_ceiling_is_a_typed_protocol_denial() -> None:
    h = harness(_begin_artifact(), make_tool("search", returning("ok")), ceiling=["search"])

    staged = await h.call("begin_artifact")
    other = await h.call("delete_everything")

    assert staged.closes_turn and staged.denied is UNAVAILABLE
    assert staged.close_reason == "staged_protocol_unavailable"
    # A name outside the staged protocol keeps the generic denial, untyped.
    assert other.closes_turn and other.close_reason == "over_ceiling"
    assert other.denied is None
    assert h.executed == []


# --- end to end -------------------------------------------------------------------------

REQUEST = "You must call tool list_available_agents now."

SCRIPTS: list[dict[str, Any]] = [
    {"match": REQUEST, "responses": [
        {"tool_calls": [{"name": "begin_artifact",
                         "arguments": {"title": "Stale draft", "kind": "markdown"}},
                        {"name": "list_available_agents", "arguments": {}}]},
        # Never reached: the attempt stops at the first step.
        {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"text": "Never asked for."}]},
    {"responses": [{"text": "Default answer."}]},
]


@pytest.fixture(scope="module", params=BACKENDS)
def stale_step_server(request: pytest.FixtureRequest,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"staged-protocol-failure-{request.param}")
    with scripted_server(str(request.param), root, SCRIPTS) as proc:
        yield proc


@pytest.mark.rule("R-252")
def test_an_unoffered_staged_call_is_journaled_denied_once_and_the_attempt_stops(
        stale_step_server: ServerProcess) -> None:
    with stale_step_server.client("alice") as alice:
        room = _room(alice)
        accepted = _send(alice, room, REQUEST)
        run = _settled(alice, accepted["run_id"])

        events = _events(alice, room, accepted["run_id"])
        # The journal in the message: what the run did instead, if it failed otherwise.
        assert (run["status"], run["outcome"]) == ("failed", "staged_protocol_unavailable"), [
            (e["type"], e["data"]) for e in events]
        # One model step: the model was not asked again.
        assert len([e for e in events if e["type"] == "model.step.started"]) == 1
        # Only the staged call was requested; the required tool beside it never ran.
        assert [e["data"]["name"] for e in events if e["type"] == "tool.requested"] == [
            "begin_artifact"]
        settled = [e["data"] for e in events if e["type"] == "tool.settled"]
        assert len(settled) == 1
        assert settled[0]["name"] == "begin_artifact"
        assert settled[0]["outcome"] == "error" and settled[0]["closes_turn"] is True
        assert settled[0]["denied"] == "staged_protocol_unavailable"
        failures = [e["data"] for e in events if e["type"] == "protocol.failed"]
        assert len(failures) == 1
        assert failures[0]["reason"] == "staged_protocol_unavailable"
        assert failures[0]["protocol"] == "staged_artifact"
        assert failures[0]["call_id"] == settled[0]["call_id"]
        assert failures[0]["calls_not_run"] == 1
        assert not [e for e in events if e["type"] == "approval.requested"]
        terminal = next(e["data"] for e in events if e["type"] == "run.terminal")
        assert terminal["reason"] == "staged_protocol_unavailable"
        assert "artifact" in terminal["message"]
        # The journal order: denial, then the one failure, then the terminal.
        kinds = [e["type"] for e in events]
        assert kinds[-3:] == ["tool.settled", "protocol.failed", "run.terminal"]

    # begin_artifact never reached the store: no draft was opened for this run.
    async def drafts(store: Store) -> int:
        async with store.transaction() as tx:
            rows = (await tx.session.execute(select(m.ArtifactDraft).where(
                m.ArtifactDraft.run_id == accepted["run_id"]))).scalars().all()
            return len(rows)

    assert with_server_store(stale_step_server, drafts) == 0
