"""An operator plugin (KAIZEN_PLUGINS) with one agent whose ceiling is the test package's
tools (tests/tools/test_package_tools_rest.py)."""

from __future__ import annotations

from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": "packaged", "name": "Packaged", "mode": "chat",
              "persona": "You use the installed package tools.",
              "tool_ceiling": ["acme_env", "acme_sum"]})
