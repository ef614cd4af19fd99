"""Source-defined agents: what ``kaizen_register_agents`` hooks register.

An agent is configuration, not authority: its tool list is a ceiling and its knowledge scope
only narrows (spec: What an agent is). A definition is validated here and seeded as an
immutable agent version at start-up; a changed definition becomes a new version.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class AgentDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_id: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    mode: Literal["search", "chat"]
    persona: Annotated[str, StringConstraints(min_length=1, max_length=20_000)]
    tool_ceiling: Annotated[tuple[str, ...], Field(max_length=200)] = ()


class AgentRegistrationError(ValueError):
    """A plugin registered an invalid or duplicate agent; start-up stops naming it."""


def collect_agents(registrations: list[tuple[str, object]]) -> tuple[AgentDefinition, ...]:
    """Validate ``(plugin, item)`` pairs from ``kaizen_register_agents``; ids are unique."""
    seen: dict[str, str] = {}
    agents: list[AgentDefinition] = []
    for plugin, item in registrations:
        try:
            agent = item if isinstance(item, AgentDefinition) else \
                AgentDefinition.model_validate(item)
        except ValueError as exc:
            raise AgentRegistrationError(f"plugin {plugin} registered an invalid agent: "
                                         f"{exc}") from None
        if agent.agent_id in seen:
            raise AgentRegistrationError(
                f"agent id {agent.agent_id!r} registered by both {seen[agent.agent_id]} and "
                f"{plugin}")
        seen[agent.agent_id] = plugin
        agents.append(agent)
    return tuple(agents)
