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
CORE_PLUGINS: tuple[str, ...] = ("kaizen_server_extension.tools.discovery",
                                  "kaizen_server_extension.tools.source_catalog")

#: The first-party plugin modules (``plugins/kaizen_plugins``), loaded by name through the same
#: hooks a third-party package uses. Named here, not imported, so the tool layer never imports
#: the plugins that import it.
DEFAULT_PLUGINS: tuple[str, ...] = (
    "kaizen_plugins.roster",
    "kaizen_plugins.canvas",
    "kaizen_plugins.readme",
    "kaizen_plugins.code",
    "kaizen_plugins.artifacts",
    "kaizen_plugins.library",
    "kaizen_plugins.workspace",
    "kaizen_plugins.agents",
    # The member's attached notebook, its kernel (with their permission), reviewed edits.
    "kaizen_plugins.notebook",
    # The member's durable tasks (shared capabilities of the runtime, R-058).
    "kaizen_plugins.tasks",
    # The built-in model providers (openai-compatible, local), through the provider hook.
    "kaizen_plugins.providers",
    # Retrieval with citations over the member's documents and prior conversations.
    "kaizen_plugins.retrieval",
    # Kaizen's own documentation, bundled in the wheel.
    "kaizen_plugins.about",
    # Delegation to another agent within the run's authority.
    "kaizen_plugins.delegation",
    # The member's external OpenAPI sources, approval-gated (withheld unless enabled, R-377).
    "kaizen_plugins.openapi_sources",
)

BUILTIN_TOOLS: Mapping[str, str] = MappingProxyType(
    {
        "tool_search": "kaizen_server_extension.tools.discovery",
        "source_catalog": "kaizen_server_extension.tools.source_catalog",
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
        "read_notebook": "kaizen_plugins.notebook",
        "inspect_notebook_kernel": "kaizen_plugins.notebook",
        "propose_notebook_edit": "kaizen_plugins.notebook",
        "inspect_tasks": "kaizen_plugins.tasks",
        "manage_tasks": "kaizen_plugins.tasks",
        "search": "kaizen_plugins.retrieval",
        "query_document": "kaizen_plugins.retrieval",
        "conversation_history_search": "kaizen_plugins.retrieval",
        "request_document": "kaizen_plugins.retrieval",
        "search_about": "kaizen_plugins.about",
        "invoke_agent": "kaizen_plugins.delegation",
        "manage_openapi_sources": "kaizen_plugins.openapi_sources",
    }
)

#: The staged artifact protocol, by built-in name. A round that calls only these is paid from
#: the run's separate staged-creation allowance, not the general cycle budget (R-039, R-074).
#: The names are reserved built-ins, so no third-party tool can claim the allowance.
STAGED_ARTIFACT_TOOLS: frozenset[str] = frozenset(
    {"begin_artifact", "append_artifact", "finalize_artifact", "discard_artifact"}
)

#: Shared capabilities (spec: Shared capabilities, not per-agent features; R-058). The common
#: runtime provides them to every agent, with one scope, timeout, result limit and access
#: check; an agent package cannot define its own version. The registry therefore refuses these
#: names from any third-party plugin, including the ones this server does not implement yet
#: (history search, tasks): a package must not fill the gap with a look-alike.
SHARED_CAPABILITY_TOOLS: frozenset[str] = frozenset(
    {"conversation_history_search", "list_available_agents", "inspect_tasks", "manage_tasks"}
)
