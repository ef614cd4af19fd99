"""A controller resumed from a recovery's :class:`ResumePoint` (R-054): it continues after
the committed steps, never asks the model for them again, and their budgets stay used."""

from __future__ import annotations

import pytest

from kaizen_server_extension.protocol.model import ChatMessage
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCall,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.runtime.controller import TurnController
from kaizen_server_extension.runtime.port import Budgets, ResumePoint, TerminalStatus
from kaizen_server_extension.runtime.registry import CONTROLLERS, TURN_ENGINE, controller_for

from .fakes import FakeHost, calls, manifest, say

LOOKUP = ToolCall("call-1", "search_docs", '{"q": "x"}')
REBUILT = "The server stopped while this call was running; its outcome is unknown."


def _point(rounds: int = 1, **overrides: object) -> ResumePoint:
    values: dict[str, object] = {
        "messages": (ChatMessage("assistant", "", (LOOKUP,)),
                     ChatMessage("tool", REBUILT, tool_call_id="call-1", name="search_docs")),
        "steps_started": 1,
        "rounds_used": rounds,
        "results": (ToolCallResult("call-1", "search_docs", ToolOutcome.ERROR, REBUILT,
                                   Capability.READ),),
        "required_attempted": True,
    }
    values.update(overrides)
    return ResumePoint(**values)  # type: ignore[arg-type]


async def _resume(host: FakeHost, point: ResumePoint, **overrides: object) -> object:
    controller = TurnController(host, manifest(**overrides), clock=host.clock, resume=point)
    return await controller.run()


@pytest.mark.rule("R-054")
async def test_a_resumed_turn_continues_after_the_committed_step_with_its_history() -> None:
    host = FakeHost([say("Done after the restart.")])
    outcome = await _resume(host, _point())

    assert outcome == host.terminals[0]
    assert host.terminals[0].status is TerminalStatus.COMPLETED
    # One model request: the next step, numbered after the committed one.
    assert [s.step for s in host.snapshots] == [2]
    sent = host.snapshots[0].messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[2].tool_calls == (LOOKUP,) and sent[3].content == REBUILT
    assert [d["step"] for d in host.of("model.step.started")] == [2]
    assert host.requests == []  # the committed call is not dispatched again


async def test_the_rounds_a_crashed_holder_used_stay_used() -> None:
    # Two rounds allowed, both used before the crash: the resumed run goes straight to its
    # one synthesis step, without tools.
    host = FakeHost([say("Synthesized.")])
    await _resume(host, _point(rounds=2), budgets=Budgets(max_cycles=2))
    assert len(host.snapshots) == 1
    assert host.snapshots[0].tools == ()
    assert host.of("model.step.started")[0]["synthesis"] is True
    assert host.snapshots[0].messages[-1].content == "SYNTH-AFTER-FAILURE"


async def test_with_a_round_left_the_resumed_run_may_call_tools_again() -> None:
    host = FakeHost([calls(("call-2", "search_docs")), say("Found it.")])
    outcome = await _resume(host, _point(rounds=1), budgets=Budgets(max_cycles=2))
    assert [r.call_id for r in host.requests] == ["call-2"]
    assert [s.step for s in host.snapshots] == [2, 3]
    assert host.snapshots[1].tools == ()  # the second round was the last: synthesis
    assert outcome == host.terminals[0]


async def test_a_required_tool_attempted_before_the_crash_is_not_required_again() -> None:
    host = FakeHost([say("Answer.")])
    await _resume(host, _point(), required_tool="search_docs")
    assert host.snapshots[0].required_tool is None
    assert {t.name for t in host.snapshots[0].tools} == {"search_docs", "tool_search",
                                                        "write_note"}
    # Without the attempt it still is.
    fresh = FakeHost([calls(("c", "search_docs")), say("Answer.")])
    await _resume(fresh, _point(required_attempted=False, messages=(), results=(),
                                rounds_used=0, steps_started=0),
                  required_tool="search_docs")
    assert fresh.snapshots[0].required_tool == "search_docs"


@pytest.mark.rule("R-003")
def test_controllers_come_from_a_static_registry_and_an_unknown_name_gets_none() -> None:
    host = FakeHost([])
    chosen = controller_for(TURN_ENGINE, host, manifest(), resume=_point())
    assert isinstance(chosen, TurnController)
    for name in ("other_engine", "", None, 7):
        assert controller_for(name, host, manifest()) is None
    with pytest.raises(TypeError):
        CONTROLLERS["other_engine"] = TurnController  # type: ignore[index]
    assert list(CONTROLLERS) == [TURN_ENGINE]
