"""Tool requests: dispatch, the parallel bound, closing results, discovery and required tools."""

from __future__ import annotations

import pytest

from kaizen_server_extension.protocol.model import TextDelta
from kaizen_server_extension.protocol.tools import Capability, ToolOutcome
from kaizen_server_extension.runtime.controller import TOOL_SEARCH, TurnController
from kaizen_server_extension.runtime.port import Budgets, TerminalStatus

from .fakes import CATALOG, FakeHost, call, calls, drive, finished, manifest, returns, say


@pytest.mark.rule("R-256")
async def test_tool_results_return_to_context_and_an_error_result_does_not_end_the_turn() -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), say("Could not find it.")],
        tools={"search_docs": returns(ToolOutcome.ERROR, content="index unavailable")},
    )
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.COMPLETED
    request = host.requests[0]
    assert (request.call_id, request.name, request.arguments, request.step) == (
        "c1",
        "search_docs",
        "{}",
        1,
    )
    tool_message = host.snapshots[1].messages[-1]
    assert (tool_message.role, tool_message.tool_call_id, tool_message.content) == (
        "tool",
        "c1",
        "index unavailable",
    )
    assert host.of("tool.requested") == [
        {"step": 1, "call_id": "c1", "name": "search_docs", "arguments": "{}"}]
    assert host.log.index("publish:tool.requested") < host.log.index("call_tool:c1")


@pytest.mark.rule("R-041", "R-295")
@pytest.mark.parametrize("bound", [1, 2, 3])
async def test_parallel_calls_never_exceed_the_server_side_bound(bound: int) -> None:
    five = [(f"c{i}", "search_docs") for i in range(5)]
    host = FakeHost([calls(*five), say("All done")], tools={"search_docs": returns(delay=0.005)})
    outcome = await drive(host, budgets=Budgets(max_parallel_tools=bound))

    assert outcome.status is TerminalStatus.COMPLETED
    assert host.max_active_tools == bound
    # Results come back in the order the model asked for them.
    ids = [m.tool_call_id for m in host.snapshots[1].messages if m.role == "tool"]
    assert ids == [f"c{i}" for i in range(5)]


@pytest.mark.rule("R-261")
async def test_a_closing_result_ends_the_turn_failed_with_its_reason() -> None:
    host = FakeHost(
        [calls(("c1", "write_note"), ("c2", "search_docs")), say("unreachable")],
        tools={
            "write_note": returns(
                ToolOutcome.RAISED,
                closes_turn=True,
                close_reason="ambiguous_write",
                capability=Capability.WRITE,
            )
        },
    )
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "ambiguous_write"
    assert [r.call_id for r in host.requests] == ["c1"]  # c2 was queued, never dispatched
    assert len(host.snapshots) == 1  # the model does not keep reasoning
    assert "check the activity" in (outcome.answer or "")


@pytest.mark.rule("R-258")
async def test_four_searches_without_progress_end_the_turn_with_an_explanation() -> None:
    host = FakeHost([calls((f"s{i}", TOOL_SEARCH)) for i in range(4)] + [say("unreachable")])
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "tool_discovery_exhausted"
    assert "searched for a suitable tool four times" in (outcome.answer or "")
    assert len(host.snapshots) == 4


@pytest.mark.rule("R-258")
async def test_a_successful_call_to_another_tool_resets_the_search_bound() -> None:
    script = [calls((f"s{i}", TOOL_SEARCH)) for i in range(3)]
    script.append(calls(("ok", "search_docs")))
    script += [calls((f"t{i}", TOOL_SEARCH)) for i in range(3)]
    script.append(say("Answer"))
    host = FakeHost(script)
    outcome = await drive(host)

    assert outcome.status is TerminalStatus.COMPLETED


@pytest.mark.rule("R-258")
async def test_a_failed_call_to_another_tool_does_not_reset_the_search_bound() -> None:
    script = [calls((f"s{i}", TOOL_SEARCH)) for i in range(3)]
    script.append(calls(("bad", "search_docs")))
    script.append(calls(("s3", TOOL_SEARCH)))
    host = FakeHost(script, tools={"search_docs": returns(ToolOutcome.ERROR)})
    outcome = await drive(host)

    assert outcome.reason == "tool_discovery_exhausted"


# --- required tool --------------------------------------------------------------------


@pytest.mark.rule("R-302", "R-303", "R-304", "R-305")
async def test_required_tool_narrows_the_first_step_until_it_is_attempted() -> None:
    host = FakeHost(
        [
            say("Here is a prose answer instead"),  # text-only: retry
            [TextDelta("calling a substitute"), call("x1", "search_docs"), finished()],
            calls(("r1", "write_note")),  # the required tool
            say("Wrote the note."),
        ]
    )
    outcome = await drive(host, required_tool="write_note")

    assert outcome.status is TerminalStatus.COMPLETED
    narrow = [s for s in host.snapshots if s.required_tool == "write_note"]
    assert len(narrow) == 3
    assert all([t.name for t in s.tools] == ["write_note"] for s in narrow)
    assert host.snapshots[3].tools == CATALOG and host.snapshots[3].required_tool is None
    # Substitutes are held, prose is suppressed while pending.
    assert [r.name for r in host.requests] == ["write_note"]
    deltas = [d["text"] for d in host.of("answer.delta")]
    assert deltas == ["Wrote the note."]
    held = [m for m in host.snapshots[2].messages if m.tool_call_id == "x1"]
    assert held and held[0].content.startswith("Not run")


@pytest.mark.rule("R-304")
async def test_a_required_tool_never_called_fails_instead_of_escaping() -> None:
    host = FakeHost([say("prose"), say("more prose")])
    outcome = await drive(host, required_tool="write_note", budgets=Budgets(max_cycles=2))

    assert outcome.status is TerminalStatus.FAILED
    assert outcome.reason == "required_tool_not_called"
    assert host.of("answer.delta") == []
    assert host.requests == []


@pytest.mark.rule("R-306")
async def test_a_required_name_absent_from_the_catalog_creates_no_requirement() -> None:
    host = FakeHost([say("Plain answer")])
    outcome = await drive(host, required_tool="not_in_catalog")

    assert outcome.answer == "Plain answer"
    assert host.snapshots[0].tools == CATALOG
    assert host.snapshots[0].required_tool is None


@pytest.mark.rule("R-038", "R-043")
async def test_each_tool_bearing_round_counts_against_the_cycle_budget() -> None:
    host = FakeHost(
        [calls(("c1", "search_docs")), calls(("c2", "search_docs")), say("From evidence")],
        tools={"search_docs": returns(evidence=True)},
    )
    outcome = await drive(host, budgets=Budgets(max_cycles=2))

    assert outcome.answer == "From evidence"
    assert [len(s.tools) for s in host.snapshots] == [len(CATALOG), len(CATALOG), 0]
    assert host.snapshots[2].messages[-1].content == "SYNTH-WITH-EVIDENCE"


@pytest.mark.rule("R-265")
async def test_an_active_tool_call_holds_the_inactivity_lease() -> None:
    """A call running several times longer than the inactivity budget (on the real clock)
    keeps the turn alive by heartbeating the backend's lease."""
    host = FakeHost(
        [calls(("c1", "search_docs")), say("Done")], tools={"search_docs": returns(delay=0.15)}
    )
    controller = TurnController(host, manifest(budgets=Budgets(inactivity_ms=40)))
    outcome = await controller.run()

    assert outcome.status is TerminalStatus.COMPLETED
    assert host.heartbeats >= 1
    assert [kind for kind, _ in host.bundles].count("heartbeat") == host.heartbeats


@pytest.mark.rule("R-297")
async def test_a_revealed_deferred_tool_is_advertised_from_the_next_step_only() -> None:
    from .fakes import tool

    hidden, foreign = tool("deep_search"), "not_frozen"
    host = FakeHost(
        [calls(("c1", TOOL_SEARCH)), calls(("c2", "deep_search")), say("Found it.")],
        tools={TOOL_SEARCH: returns(reveals=("deep_search", foreign)),
               "deep_search": returns()},
    )
    outcome = await drive(host, deferred=(hidden,))

    assert outcome.status is TerminalStatus.COMPLETED
    first, second = ({t.name for t in s.tools} for s in host.snapshots[:2])
    assert "deep_search" not in first
    assert "deep_search" in second
    # A name the backend never froze as deferred cannot be advertised, whatever a result says.
    assert all(foreign not in {t.name for t in s.tools} for s in host.snapshots)
