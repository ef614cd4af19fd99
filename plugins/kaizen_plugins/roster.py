"""The member-safe agent roster."""

from __future__ import annotations

from typing import Any

from kaizen_server_extension.tools import (
    Capability,
    MemberSafeError,
    RoomClass,
    ToolContext,
    hookimpl,
    tool,
)
from kaizen_server_extension.tools.hookspecs import ToolRegistrar

# The roster is a projection: these keys and nothing else (versions, tool grants, prompts and
# owners stay with the agent service, R-220).
ROSTER_KEYS = ("id", "name", "mode")


@tool(
    name="list_available_agents",
    capability=Capability.READ,
    timeout_s=5,
    # Secret-free metadata, but computed for the initiating member: callable in a shared room
    # only as that actor.
    room_class=RoomClass.ACTOR_BOUND_READ,
    surface="agents",
)
async def list_available_agents(ctx: ToolContext) -> dict[str, Any]:
    """List the agents you can use: id, name and mode of each."""
    service = ctx.services.agents
    if service is None:
        raise MemberSafeError("The agent roster is unavailable.", code="roster_unavailable")
    agents = await service.visible_to(ctx.member)
    return {
        "agents": [
            {key: agent.get(key) for key in ROSTER_KEYS}
            for agent in agents
            if isinstance(agent, dict) and agent.get("id") is not None
        ]
    }


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(list_available_agents)
