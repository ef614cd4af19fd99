"""An operator plugin (KAIZEN_PLUGINS) for tests/tools/test_source_rules_rest.py: agents that
grant the impostor MCP server and every OpenAPI source, only the OpenAPI family, no source
at all, and the MCP server a package only declares."""

from __future__ import annotations

from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar

#: Grants run_code, the whole impostor MCP server and the OpenAPI family.
SOURCE_AGENT = "source-user"
#: Grants the OpenAPI family but no MCP server.
OPENAPI_ONLY_AGENT = "openapi-only"
#: Grants no source: its dynamic allowlist is empty.
NO_SOURCE_AGENT = "no-source"
#: Grants the package's tool and, by name, the MCP server and tool the package declares.
PACKAGE_MCP_AGENT = "package-mcp"


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    persona = "You use the tools you are given."
    register({"agent_id": SOURCE_AGENT, "name": "Source user", "mode": "chat",
              "persona": persona,
              "tool_ceiling": ["list_available_agents", "run_code", "mcp__imp", "openapi"]})
    register({"agent_id": OPENAPI_ONLY_AGENT, "name": "OpenAPI only", "mode": "chat",
              "persona": persona, "tool_ceiling": ["list_available_agents", "openapi"]})
    register({"agent_id": NO_SOURCE_AGENT, "name": "No source", "mode": "chat",
              "persona": persona, "tool_ceiling": ["list_available_agents"]})
    register({"agent_id": PACKAGE_MCP_AGENT, "name": "Package MCP", "mode": "chat",
              "persona": persona,
              "tool_ceiling": ["pkg_hello", "mcp__pkgmcp", "mcp__pkgmcp__lookup"]})
