"""Crash recovery reads a delegated child's events as the child's, not the run's own: they never
enter the resumed transcript or its step and synthesis counts, yet a child call that never
settled is still a dangling call of the run, so a child's write makes the outcome ambiguous
exactly as the run's own would (R-054, R-446, R-060)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kaizen_server_extension.lanes.resume import RunJournal
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.store.records import EventRecord

MARKER = {"id": "dlg-1", "agent_id": "writer", "agent_version": 1, "depth": 1}


def _events(*items: tuple[str, dict[str, Any]]) -> list[EventRecord]:
    return [EventRecord(conversation_id="c", seq=n, run_id="r", type=kind, actor="alice",
                        at=datetime.now(UTC), data=data)
            for n, (kind, data) in enumerate(items, start=1)]


def _delegated(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "delegation": MARKER}


@pytest.mark.rule("R-054", "R-060")
def test_a_childs_events_stay_out_of_the_resumed_transcript_but_its_calls_dangle() -> None:
    journal = RunJournal.read(_events(
        ("model.step.started", {"step": 1, "attempt": 1, "synthesis": False}),
        ("tool.requested", {"step": 1, "call_id": "c1", "name": "invoke_agent",
                            "arguments": {"agent_id": "writer", "task": "t"}}),
        ("model.step.started", _delegated({"step": 7, "attempt": 1, "synthesis": True})),
        ("tool.requested", _delegated({"step": 1, "call_id": "dlg-1:c1", "name": "search"})),
        ("tool.settled", _delegated({"step": 1, "call_id": "dlg-1:c1", "name": "search",
                                     "outcome": "ok", "capability": "read",
                                     "content": "{}", "closes_turn": True})),
        ("tool.requested", _delegated({"step": 2, "call_id": "dlg-1:c2",
                                       "name": "create_artifact"})),
    ))
    # The child's step numbers, synthesis and closing call are not the run's.
    assert journal.steps_started == 1
    assert not journal.synthesis_started and not journal.turn_closed
    dangling = {call.call_id: call for call in journal.dangling}
    assert set(dangling) == {"c1", "dlg-1:c2"}
    child_write = dangling["dlg-1:c2"]
    assert child_write.delegation == MARKER
    rebuilt = [call.rebuilt(Capability.READ if call.name == "invoke_agent"
                            else Capability.WRITE) for call in journal.dangling]
    assert next(r for r in rebuilt if r["call_id"] == "dlg-1:c2")["delegation"] == MARKER
    point = journal.resume_point(rebuilt, ())
    assert point is not None
    # Only the run's own round is replayed: the invoke_agent call, rebuilt as interrupted.
    assert [m.role for m in point.messages] == ["assistant", "tool"]
    assert [c.name for c in point.messages[0].tool_calls] == ["invoke_agent"]
    assert [r.name for r in point.results] == ["invoke_agent"] and point.rounds_used == 1


@pytest.mark.rule("R-049")
def test_a_resumed_run_still_knows_it_delegated() -> None:
    """The fallback's check-the-activity suggestion holds after a takeover too: the journaled
    tool.settled says the call delegated."""
    journal = RunJournal.read(_events(
        ("model.step.started", {"step": 1, "attempt": 1, "synthesis": False}),
        ("tool.requested", {"step": 1, "call_id": "c1", "name": "invoke_agent"}),
        ("tool.settled", {"step": 1, "call_id": "c1", "name": "invoke_agent",
                          "outcome": "ok", "capability": "read", "delegated": True,
                          "content": "{\"answer\": \"42\"}", "closes_turn": False}),
    ))
    point = journal.resume_point([], ())
    assert point is not None
    [result] = point.results
    assert result.delegated and not result.failed
