"""The plugin ``bench/e2e_overhead.py`` loads into a real server (KAIZEN_PLUGINS): a no-op
READ tool and an agent whose ceiling is that tool alone, so every step's cost is Kaizen's."""

from __future__ import annotations

from typing import Any

from kaizen_server_extension.tools import Capability, RoomClass, ToolContext, hookimpl, tool
from kaizen_server_extension.tools.hookspecs import Registrar, ToolRegistrar

NOOP_TOOL = "bench_noop"
E2E_AGENT = "bench-e2e"


@tool(name=NOOP_TOOL, capability=Capability.READ, room_class=RoomClass.AUDIENCE_SAFE_READ,
      timeout_s=5)
async def bench_noop(ctx: ToolContext) -> dict[str, Any]:
    """Return a constant: the benchmark's no-op read."""
    return {"ok": True}


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(bench_noop)


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": E2E_AGENT, "name": "Bench", "mode": "chat",
              "persona": "You are a benchmark.", "tool_ceiling": [NOOP_TOOL]})
