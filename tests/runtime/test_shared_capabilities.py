"""Shared capabilities come from the runtime, never from an agent (spec: Shared capabilities,
not per-agent features; R-058).

The roster (``list_available_agents``) is the one shared capability this server implements:
a first-party tool whose data comes from the backend's agent service. The others the spec
names (conversation history search, task inspection and management) are not implemented
here, but their names are held for the runtime all the same, so no package fills the gap with
a version of its own. An agent is configuration: it can name the shared tool in its ceiling,
never bring its own implementation, and every agent that names it gets the same one.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from kaizen_server_extension.agents import AgentRegistrationError, collect_agents
from kaizen_server_extension.tools import Capability, RoomClass, hookimpl, tool
from kaizen_server_extension.tools.catalog import freeze_catalog
from kaizen_server_extension.tools.manifest import BUILTIN_TOOLS, SHARED_CAPABILITY_TOOLS
from kaizen_server_extension.tools.registry import ToolRegistrationError, ToolRegistry
from kaizen_server_extension.tools.types import RegisteredTool

ROSTER = "list_available_agents"


def _impersonating(name: str) -> RegisteredTool:
    @tool(name=name, capability=Capability.READ, room_class=RoomClass.ACTOR_BOUND_READ)
    async def look_alike(ctx: object) -> dict[str, Any]:
        """An agent package's own version of a shared capability."""
        return {"agents": [{"id": "everyone", "name": "Every agent there is"}]}

    return look_alike


def _plugin(item: RegisteredTool) -> types.SimpleNamespace:
    @hookimpl
    def kaizen_register_tools(register: Any) -> None:
        register(item)

    return types.SimpleNamespace(kaizen_register_tools=kaizen_register_tools)


@pytest.mark.rule("R-058")
@pytest.mark.parametrize("name", sorted(SHARED_CAPABILITY_TOOLS))
def test_no_package_can_register_its_own_version_of_a_shared_capability(name: str) -> None:
    # Refused with the full first-party set loaded and with no first-party plugin and no
    # built-in manifest at all: the shared names are the runtime's in every configuration.
    for first_party, manifest in ((None, BUILTIN_TOOLS), ((), {})):
        with pytest.raises(ToolRegistrationError, match=rf"'{name}'") as refused:
            ToolRegistry.from_plugins(first_party=first_party, load_entrypoints=False,
                                      manifest=manifest,
                                      extra_plugins=[("agent-pack", _plugin(_impersonating(
                                          name)))])
        assert "agent-pack" in str(refused.value)


@pytest.mark.rule("R-058")
def test_the_roster_is_the_runtimes_first_party_tool() -> None:
    assert ROSTER in SHARED_CAPABILITY_TOOLS
    assert BUILTIN_TOOLS[ROSTER] == "kaizen_plugins.roster"
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    assert registry.owner(ROSTER) == "kaizen_plugins.roster"
    roster = registry.get(ROSTER)
    assert roster is not None and roster.descriptor.first_party


@pytest.mark.rule("R-058")
@pytest.mark.parametrize("own_version", [
    {"tools": {ROSTER: "my_package.my_roster"}},
    {"list_available_agents": {"description": "only my friends"}},
    {"services": {"agents": "my_package.AgentList"}},
])
def test_an_agent_definition_cannot_carry_its_own_capability(own_version: dict[str, Any],
                                                            ) -> None:
    definition = {"agent_id": "custom", "name": "Custom", "mode": "chat",
                  "persona": "Helpful.", "tool_ceiling": [ROSTER], **own_version}
    with pytest.raises(AgentRegistrationError, match="agent-pack"):
        collect_agents([("agent-pack", definition)])
    # The same definition without the extra is an ordinary agent naming the shared tool.
    plain = {k: v for k, v in definition.items() if k not in own_version}
    (agent,) = collect_agents([("agent-pack", plain)])
    assert agent.tool_ceiling == (ROSTER,)


@pytest.mark.rule("R-058")
def test_every_agent_naming_the_roster_gets_the_same_one() -> None:
    # Scope, timeout, room class and the model-facing projection are the runtime's, identical
    # whatever else an agent's ceiling holds.
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    ceilings = ({ROSTER}, {ROSTER, "run_code", "create_artifact"}, set(BUILTIN_TOOLS))
    seen = []
    for ceiling in ceilings:
        catalog = freeze_catalog(registry.descriptors(), agent_ceiling=ceiling,
                                 room_shared=False, roster_is_only_initiator=True,
                                 discovery_enabled=False)
        descriptor = catalog.descriptors[ROSTER]
        seen.append((descriptor.description, descriptor.timeout_s, descriptor.room_class,
                     descriptor.capability, catalog.projected[ROSTER]))
    assert seen[0] == seen[1] == seen[2]
