"""An operator plugin (KAIZEN_PLUGINS) for the OpenAPI source tests: an agent whose tool list
grants the whole OpenAPI family (every source of the run's member), the approval-gated
manage_openapi_sources tool and one read built-in."""

from __future__ import annotations

from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar

OPENAPI_AGENT = "api-user"


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": OPENAPI_AGENT, "name": "API user", "mode": "chat",
              "persona": "You use the API tools you are given.",
              "tool_ceiling": ["list_available_agents", "openapi", "manage_openapi_sources"]})
