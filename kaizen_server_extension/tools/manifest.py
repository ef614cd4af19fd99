"""The closed built-in set: every first-party tool, by name, with the module that implements it.

Adding a Kaizen-owned tool widens the loop's trust surface, so it is a deliberate two-place
change: the ``@tool`` implementation and a line here. ``tests/test_builtin_manifest.py`` walks the
source and fails when the two disagree; the registry refuses, at start-up, a first-party tool
that is missing here or registered from another module, and a third-party tool that takes one of
these names (spec: The closed built-in registry).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Modules holding first-party tools that are part of the tool layer itself rather than a plugin
# family; the registry loads them exactly as it loads DEFAULT_PLUGINS.
CORE_PLUGINS: tuple[str, ...] = ("kaizen_server_extension.tools.discovery",)

BUILTIN_TOOLS: Mapping[str, str] = MappingProxyType(
    {
        "tool_search": "kaizen_server_extension.tools.discovery",
        "list_available_agents": "kaizen_plugins.roster",
        "show_chat_canvas": "kaizen_plugins.canvas",
        "visualize_read_me": "kaizen_plugins.readme",
        "run_code": "kaizen_plugins.code",
        "create_artifact": "kaizen_plugins.artifacts",
        "update_artifact": "kaizen_plugins.artifacts",
        "read_artifact": "kaizen_plugins.artifacts",
        "edit_artifact": "kaizen_plugins.artifacts",
        "begin_artifact": "kaizen_plugins.artifacts",
        "append_artifact": "kaizen_plugins.artifacts",
        "finalize_artifact": "kaizen_plugins.artifacts",
        "discard_artifact": "kaizen_plugins.artifacts",
        "inspect_library": "kaizen_plugins.library",
        "manage_library": "kaizen_plugins.library",
        "read_workspace": "kaizen_plugins.workspace", "edit_workspace": "kaizen_plugins.workspace",
    }
)
