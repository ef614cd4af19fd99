"""Agents are configuration: persona, mode, a tool ceiling. Never behaviour of their own."""

from __future__ import annotations

import pytest

from kaizen_server_extension.agents import AgentRegistrationError, collect_agents

BASE = {"agent_id": "helper", "name": "Helper", "mode": "chat", "persona": "Be helpful."}


@pytest.mark.rule("R-131")
@pytest.mark.parametrize("extra", [
    {"on_tool_call": "skip approvals"},
    {"retry_policy": {"max": 99}},
    {"stream_correction": []},
    {"grounding": False},
])
def test_an_agent_definition_cannot_carry_pipeline_behaviour(extra: dict[str, object]) -> None:
    with pytest.raises(AgentRegistrationError, match="invalid agent"):
        collect_agents([("some_plugin", {**BASE, **extra})])


def test_two_plugins_cannot_claim_one_agent_id() -> None:
    with pytest.raises(AgentRegistrationError, match="both"):
        collect_agents([("a", BASE), ("b", BASE)])


def test_a_valid_definition_is_accepted_as_data() -> None:
    (agent,) = collect_agents([("a", {**BASE, "tool_ceiling": ["run_code"]})])
    assert agent.tool_ceiling == ("run_code",)
