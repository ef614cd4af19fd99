"""An operator plugin (KAIZEN_PLUGINS) registering an agent with search, request_document and
run_code, the one combination in which request_document enters a private turn (R-180)."""

from __future__ import annotations

from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar

RESEARCHER = "researcher"


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": RESEARCHER, "name": "Researcher", "mode": "search",
              "persona": "You find documents and analyse them with code.",
              "tool_ceiling": ["search", "query_document", "request_document", "run_code"]})
