"""An operator plugin (KAIZEN_PLUGINS) for the MCP source tests: an agent whose tool list grants
two whole MCP servers (``mcp__local``, ``mcp__down``, ``mcp__off``, ``mcp__flicker``) and two
exact tools of a third (``mcp__web__lookup``, ``mcp__web__huge``)."""

from __future__ import annotations

from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar

MCP_AGENT = "mcp-user"


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": MCP_AGENT, "name": "MCP user", "mode": "chat",
              "persona": "You use the MCP tools you are given.",
              "tool_ceiling": ["list_available_agents", "mcp__local", "mcp__down",
                               "mcp__off", "mcp__flicker", "mcp__web__lookup",
                               "mcp__web__huge"]})
