"""Staged creation's own round allowance (spec: Budgets and the synthesis grant; guardrails:
The budget table).

A round that calls only the staged artifact protocol (begin/append/finalize/discard) is paid
from a separate 52-round allowance, not from AGENT_LOOP_MAX_CYCLES (R-039, R-074). These run
the real controller over the scripted host: the model keeps asking for rounds, and the tests
watch when the controller stops granting them (the synthesis step has no tools).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kaizen_server_extension.protocol.model import ChatMessage
from kaizen_server_extension.protocol.tools import (
    Capability,
    ToolCall,
    ToolCallResult,
    ToolOutcome,
)
from kaizen_server_extension.runtime.controller import TurnController
from kaizen_server_extension.runtime.port import (
    STAGED_PROTOCOL_ROUNDS,
    Budgets,
    ResumePoint,
    TerminalStatus,
)
from kaizen_server_extension.settings import KaizenSettings
from kaizen_server_extension.tools.manifest import BUILTIN_TOOLS, STAGED_ARTIFACT_TOOLS
from kaizen_server_extension.tools.registry import ToolRegistry

from .fakes import CATALOG, FakeHost, Item, call, drive, finished, manifest, say, tool

STAGED = frozenset(STAGED_ARTIFACT_TOOLS)
STAGED_CATALOG = (*CATALOG, *(tool(name, Capability.WRITE) for name in sorted(STAGED)))


def staged(name: str, n: int) -> list[Item]:
    """One model step calling one staged protocol tool."""
    return [call(f"{name}-{n}", name), finished()]


def general(n: int) -> list[Item]:
    return [call(f"search-{n}", "search_docs"), finished()]


def creation(appends: int) -> list[list[Item]]:
    """begin, ``appends`` appends, finalize: one round each, as the protocol needs."""
    return [staged("begin_artifact", 0),
            *(staged("append_artifact", i) for i in range(1, appends + 1)),
            staged("finalize_artifact", appends + 1)]


def synthesis_steps(host: FakeHost) -> list[int]:
    return [s["step"] for s in host.of("model.step.started") if s["synthesis"]]


async def run(host: FakeHost, *, max_cycles: int, staged_rounds: int = STAGED_PROTOCOL_ROUNDS,
              staged_tools: frozenset[str] = STAGED) -> TerminalStatus:
    outcome = await drive(host, catalog=STAGED_CATALOG, staged_protocol=staged_tools,
                          budgets=Budgets(max_cycles=max_cycles,
                                          staged_protocol_rounds=staged_rounds))
    return outcome.status


@pytest.mark.rule("R-039", "R-074")
def test_the_allowance_is_52_rounds_whatever_the_general_budget_is() -> None:
    assert STAGED_PROTOCOL_ROUNDS == 52
    assert Budgets().staged_protocol_rounds == 52
    for cycles in ("1", "10", "100"):
        budgets = KaizenSettings.from_environ({"AGENT_LOOP_MAX_CYCLES": cycles}).budgets()
        assert budgets.max_cycles == int(cycles)
        assert budgets.staged_protocol_rounds == 52


@pytest.mark.rule("R-039", "R-074")
async def test_a_full_52_round_creation_leaves_the_general_budget_untouched() -> None:
    # begin + 50 appends + finalize = 52 staged rounds, then a general round, then the
    # answer: with a general budget of 2 no synthesis was forced.
    steps = [*creation(50), general(1), say("Created it.")]
    host = FakeHost(steps)

    assert await run(host, max_cycles=2) is TerminalStatus.COMPLETED
    assert synthesis_steps(host) == []
    assert len(host.requests) == 53
    assert [r.name for r in host.requests[:2]] == ["begin_artifact", "append_artifact"]
    assert host.requests[51].name == "finalize_artifact"
    assert host.requests[52].name == "search_docs"
    assert not host.remaining


@pytest.mark.rule("R-039")
async def test_general_rounds_still_end_at_max_cycles_between_staged_rounds() -> None:
    steps = [staged("begin_artifact", 0), general(1), staged("append_artifact", 1),
             general(2), say("Answer from the evidence.")]  # the last is the synthesis
    host = FakeHost(steps)

    assert await run(host, max_cycles=2) is TerminalStatus.COMPLETED
    # Two general rounds spent the budget: the step after them is the forced synthesis,
    # without tools, however many staged rounds came between.
    assert [r.name for r in host.requests] == ["begin_artifact", "search_docs",
                                              "append_artifact", "search_docs"]
    assert synthesis_steps(host) == [5]
    assert host.snapshots[-1].tools == ()


@pytest.mark.rule("R-039")
async def test_a_round_mixing_in_another_tool_is_a_general_round() -> None:
    mixed = [call("b", "begin_artifact"), call("s", "search_docs"), finished()]
    host = FakeHost([mixed, say("Synthesized.")])

    assert await run(host, max_cycles=1) is TerminalStatus.COMPLETED
    assert synthesis_steps(host) == [2]


@pytest.mark.rule("R-039", "R-074")
async def test_past_the_allowance_staged_rounds_draw_from_the_general_budget() -> None:
    # Allowance 3, general budget 2: three staged rounds are free, the next two are paid
    # from the general budget, and then the turn is synthesized. The turn never runs more
    # than allowance + max_cycles tool rounds.
    steps = [*(staged("append_artifact", i) for i in range(5)), say("Synthesized.")]
    host = FakeHost(steps)

    assert await run(host, max_cycles=2, staged_rounds=3) is TerminalStatus.COMPLETED
    assert len(host.requests) == 5
    assert synthesis_steps(host) == [6]


@pytest.mark.rule("R-074")
async def test_only_the_manifests_staged_tools_earn_the_allowance() -> None:
    # The lane names the staged tools of the frozen catalog; without them in the manifest
    # the same calls are ordinary rounds.
    steps = [staged("begin_artifact", 0), say("Synthesized.")]
    host = FakeHost(steps)

    assert await run(host, max_cycles=1, staged_tools=frozenset()) is TerminalStatus.COMPLETED
    assert [r.name for r in host.requests] == ["begin_artifact"]
    assert synthesis_steps(host) == [2]


def _round(call_id: str, name: str) -> Sequence[ChatMessage]:
    return (ChatMessage("assistant", "", (ToolCall(call_id, name, "{}"),)),
            ChatMessage("tool", "ok", tool_call_id=call_id, name=name))


@pytest.mark.rule("R-039")
async def test_a_resumed_run_keeps_its_staged_rounds_out_of_the_general_budget() -> None:
    # Recovery hands back four committed rounds: three staged, one general. With a general
    # budget of 2 one more general round is left, not none.
    history = [*_round("b", "begin_artifact"), *_round("a1", "append_artifact"),
               *_round("s", "search_docs"), *_round("a2", "append_artifact")]
    point = ResumePoint(
        messages=tuple(history), steps_started=4, rounds_used=4,
        results=tuple(ToolCallResult(cid, name, ToolOutcome.OK, "ok")
                      for cid, name in (("b", "begin_artifact"), ("a1", "append_artifact"),
                                        ("s", "search_docs"), ("a2", "append_artifact"))))
    host = FakeHost([general(5), say("Synthesized.")])
    controller = TurnController(
        host, manifest(catalog=STAGED_CATALOG, staged_protocol=STAGED,
                       budgets=Budgets(max_cycles=2)),
        clock=host.clock, resume=point)

    outcome = await controller.run()

    assert outcome.status is TerminalStatus.COMPLETED
    assert [r.name for r in host.requests] == ["search_docs"]
    assert synthesis_steps(host) == [6]


@pytest.mark.rule("R-074")
def test_the_staged_tools_are_exactly_the_first_party_staged_protocol() -> None:
    # Reserved built-in names, so no third-party tool can claim the allowance; and the
    # registry's staged protocol group is exactly this set.
    assert STAGED_ARTIFACT_TOOLS <= set(BUILTIN_TOOLS)
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    group = {d.name for d in registry.descriptors() if d.protocol_group == "staged_artifact"}
    assert group == STAGED_ARTIFACT_TOOLS
    assert all(registry.get(name) is not None
               and registry.get(name).descriptor.first_party  # type: ignore[union-attr]
               for name in group)
