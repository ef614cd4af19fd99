"""A step asking for a staged operation it was not offered (spec: What happens on a tool call;
R-252).

"If a stale captured step still requests an unadvertised staged operation after a draft
exists, Pi journals that denied result, emits one typed protocol failure, and stops the
attempt." These run the real controller over the scripted host, which settles a refused call
as the trusted pipeline does. Each step that must not be reached is scripted anyway, so a
controller that carried on would consume it (``host.remaining``) or dispatch its calls.
"""

from __future__ import annotations

from typing import Any

import pytest

from kaizen_server_extension.protocol.tools import (
    STAGED_PROTOCOL_GROUP,
    STAGED_PROTOCOL_OPERATIONS,
    Capability,
    ProtocolFailure,
)
from kaizen_server_extension.runtime.fallback import fallback_message
from kaizen_server_extension.runtime.port import Budgets, TerminalStatus
from kaizen_server_extension.tools.manifest import STAGED_ARTIFACT_TOOLS
from kaizen_server_extension.tools.registry import ToolRegistry

from .fakes import CATALOG, FakeHost, call, calls, drive, finished, returns, say, tool

UNAVAILABLE = ProtocolFailure.STAGED_PROTOCOL_UNAVAILABLE
STAGED_CATALOG = (*CATALOG, *(tool(n, Capability.WRITE) for n in sorted(STAGED_ARTIFACT_TOOLS)))


def assert_stopped_once(host: FakeHost, outcome: Any, *, call_id: str, name: str,
                        step: int, not_run: int) -> None:
    """The R-252 shape: only the offending call was requested, marked refused; one typed
    protocol failure; the turn failed with the typed reason and its fallback text."""
    assert [(r.call_id, r.name, r.refused) for r in host.requests] == [
        (call_id, name, UNAVAILABLE)]
    assert [(t["call_id"], t["name"]) for t in host.of("tool.requested")] == [(call_id, name)]
    assert host.of("protocol.failed") == [{
        "step": step, "protocol": STAGED_PROTOCOL_GROUP, "reason": UNAVAILABLE.value,
        "call_id": call_id, "name": name, "calls_not_run": not_run}]
    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "staged_protocol_unavailable"
    assert outcome.answer.startswith(fallback_message("staged_protocol_unavailable", ()))
    # The failure comes just before the one terminal, and nothing was asked after it.
    assert host.log[-2:] == ["publish:protocol.failed", "publish_terminal"]
    assert len(host.terminals) == 1


@pytest.mark.rule("R-252")
async def test_a_staged_call_of_an_agent_without_the_protocol_is_denied_and_stops() -> None:
    # The agent has no staged writer: begin_artifact was never advertised. The step's other
    # call (an advertised read) does not run either, and the model is not asked again.
    host = FakeHost([calls(("b1", "begin_artifact"), ("s1", "search_docs")),
                     say("Never asked for.")])

    outcome = await drive(host)

    assert_stopped_once(host, outcome, call_id="b1", name="begin_artifact", step=1, not_run=1)
    assert len(host.snapshots) == 1 and len(host.remaining) == 1


@pytest.mark.rule("R-252")
async def test_several_unoffered_staged_calls_in_one_step_make_one_protocol_failure() -> None:
    # A stale step still writing: append, append, finalize. Only the first is journaled as
    # denied; the failure is emitted once for the attempt, not once per call.
    step = [call("s0", "search_docs"), call("a1", "append_artifact"),
            call("a2", "append_artifact"), call("f1", "finalize_artifact"), finished()]
    host = FakeHost([step, say("Never asked for.")])

    outcome = await drive(host)

    assert_stopped_once(host, outcome, call_id="a1", name="append_artifact", step=1,
                        not_run=3)


@pytest.mark.rule("R-252", "R-304")
async def test_a_staged_call_on_a_required_tool_step_is_denied_not_held() -> None:
    # The required-tool step advertises write_note alone. A staged call there used to be
    # held silently (and the required tool beside it dispatched); now it is journaled as
    # denied and the attempt stops: the required tool does not run either.
    host = FakeHost([calls(("b1", "begin_artifact"), ("w1", "write_note")),
                     calls(("w2", "write_note")), say("Never asked for.")])

    outcome = await drive(host, catalog=STAGED_CATALOG, staged_protocol=STAGED_ARTIFACT_TOOLS,
                          required_tool="write_note")

    assert host.snapshots[0].required_tool == "write_note"
    assert [t.name for t in host.snapshots[0].tools] == ["write_note"]
    assert_stopped_once(host, outcome, call_id="b1", name="begin_artifact", step=1, not_run=1)
    assert len(host.remaining) == 2


@pytest.mark.rule("R-252", "R-257")
async def test_a_staged_call_in_the_tool_less_synthesis_step_is_denied() -> None:
    # The general budget is spent, so the first step is the synthesis grant, which offers no
    # tool; a stale model still appends to its draft instead of answering.
    host = FakeHost([[call("a9", "append_artifact"), finished()]])

    outcome = await drive(host, catalog=STAGED_CATALOG, staged_protocol=STAGED_ARTIFACT_TOOLS,
                          budgets=Budgets(max_cycles=0))

    assert host.snapshots[0].tools == ()
    assert_stopped_once(host, outcome, call_id="a9", name="append_artifact", step=1,
                        not_run=0)


@pytest.mark.rule("R-252", "R-257")
async def test_other_tool_calls_in_the_synthesis_step_are_still_non_delivery() -> None:
    host = FakeHost([[call("s9", "search_docs"), finished()]])

    outcome = await drive(host, budgets=Budgets(max_cycles=0))

    assert outcome.reason == "non_delivery"
    assert host.requests == [] and host.of("protocol.failed") == []


@pytest.mark.rule("R-252", "R-251")
async def test_offered_staged_calls_run_as_ordinary_calls() -> None:
    host = FakeHost([calls(("b1", "begin_artifact"), ("s1", "search_docs")),
                     say("Draft opened.")])

    outcome = await drive(host, catalog=STAGED_CATALOG, staged_protocol=STAGED_ARTIFACT_TOOLS)

    assert outcome.status is TerminalStatus.COMPLETED
    assert [(r.name, r.refused) for r in host.requests] == [("begin_artifact", None),
                                                           ("search_docs", None)]
    assert host.of("protocol.failed") == []


@pytest.mark.rule("R-252", "R-098")
async def test_an_unknown_tool_outside_the_staged_protocol_keeps_the_generic_denial() -> None:
    # Unchanged: the call is dispatched unmarked and the pipeline's ceiling denial closes the
    # turn with its own reason; no protocol failure is emitted.
    over_ceiling = returns(content="That tool is not available.", closes_turn=True,
                           close_reason="over_ceiling")
    host = FakeHost([calls(("x1", "made_up_tool")), say("Never asked for.")],
                    tools={"made_up_tool": over_ceiling})

    outcome = await drive(host)

    assert [(r.name, r.refused) for r in host.requests] == [("made_up_tool", None)]
    assert outcome.reason == "over_ceiling"
    assert host.of("protocol.failed") == []


@pytest.mark.rule("R-252", "R-304")
async def test_a_non_staged_substitute_on_a_required_step_is_still_held() -> None:
    host = FakeHost([calls(("s1", "search_docs")), calls(("w1", "write_note")),
                     say("Done.")])

    outcome = await drive(host, required_tool="write_note")

    assert outcome.status is TerminalStatus.COMPLETED
    assert [r.name for r in host.requests] == ["write_note"]
    assert host.of("protocol.failed") == []


@pytest.mark.rule("R-252")
def test_the_controllers_staged_names_are_the_registrys_staged_protocol() -> None:
    # The controller may not import the tool layer, so the port carries the names; they must
    # be exactly the built-in staged protocol group.
    assert STAGED_PROTOCOL_OPERATIONS == STAGED_ARTIFACT_TOOLS
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    group = {d.name for d in registry.descriptors() if d.protocol_group == STAGED_PROTOCOL_GROUP}
    assert group == STAGED_PROTOCOL_OPERATIONS
