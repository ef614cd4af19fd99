"""``source_catalog``: the run's authoritative inventory of its source tools (MCP servers,
OpenAPI sources).

A baseline read (spec: Tool discovery, R-308): it is in every run's catalog while a source
family is configured (MCP servers, or the OpenAPI sources feature), whatever the agent grants,
because it reads nothing but the run's own frozen catalog. So it reports exactly the source
tools this member, this agent, the deployment's policy and this room left the run: an agent
whose source allowlist is empty gets an empty inventory that says it is complete, and the
tools it does not have stay absent from the catalog — listing grants nothing, and nothing it
lists becomes callable by being listed (deferred tools still wait for ``tool_search``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.catalog import FrozenCatalog
from kaizen_server_extension.tools.decorators import tool
from kaizen_server_extension.tools.hookspecs import ToolRegistrar, hookimpl
from kaizen_server_extension.tools.types import RoomClass, ToolContext, ToolDescriptor

SOURCE_CATALOG_NAME = "source_catalog"
#: Tools listed in one answer; the counts per source stay exact beyond it.
MAX_LISTED = 100
#: The descriptor ``extra`` key naming a source tool's source, by family (set by
#: ``tools/mcp_sources.py`` and ``tools/openapi_sources.py`` when they build a descriptor).
_SOURCE_KEYS: Mapping[str, str] = {"mcp": "mcp_server", "openapi": "openapi_source"}


def source_of(descriptor: ToolDescriptor) -> str | None:
    """The source selector (``mcp__<id>``, ``openapi__<id>``) a catalog tool came from, or
    None for a tool that is no source's (first-party tools never are, whatever they carry)."""
    if descriptor.first_party:
        return None
    for family, key in _SOURCE_KEYS.items():
        source = descriptor.extra.get(key)
        if isinstance(source, str) and source:
            return f"{family}__{source}"
    return None


def inventory(catalog: FrozenCatalog, callable_now: set[str],
              source: str = "") -> dict[str, Any]:
    """The source tools of ``catalog`` (of one ``source`` when named), grouped by source."""
    grouped: dict[str, list[ToolDescriptor]] = {}
    for name in sorted(catalog.descriptors):
        descriptor = catalog.descriptors[name]
        selector = source_of(descriptor)
        if selector is not None and (not source or selector == source):
            grouped.setdefault(selector, []).append(descriptor)
    listed = 0
    sources: list[dict[str, Any]] = []
    for selector in sorted(grouped):
        members = grouped[selector]
        shown = members[:max(0, MAX_LISTED - listed)]
        listed += len(shown)
        sources.append({
            "source": selector,
            "tools_total": len(members),
            "tools": [{"name": d.name, "capability": d.capability.value,
                       "callable": "now" if d.name in callable_now else "after_tool_search"}
                      for d in shown],
        })
    total = sum(len(m) for m in grouped.values())
    return {"authoritative": True, "tools_total": total, "truncated": listed < total,
            "sources": sources}


@tool(
    name="source_catalog",
    capability=Capability.READ,
    timeout_s=5,
    room_class=RoomClass.AUDIENCE_SAFE_READ,
    surface="discovery",
    # Never offered by default nor over Kaizen's own MCP endpoint (it needs a run): the
    # backend puts it in a run's catalog exactly when a source family is configured.
    explicit_grant_only=True,
)
async def source_catalog(
    ctx: ToolContext,
    source: Annotated[str, Field(
        max_length=100, description="Only this source (e.g. 'mcp__weather'); empty for all.")
    ] = "",
) -> dict[str, Any]:
    """List the MCP and OpenAPI source tools you may use in this conversation, by source.
    The list is complete: a tool that is not in it is not available to you here."""
    catalog = ctx.services.catalog
    if not isinstance(catalog, FrozenCatalog):
        raise MemberSafeError("The source catalog is unavailable in this turn.",
                              code="no_catalog")
    # The live set: grows as tool_search reveals deferred tools (host/tool_backend.py).
    return inventory(catalog, set(ctx.services.callable_tools), source)


@hookimpl
def kaizen_register_tools(register: ToolRegistrar) -> None:
    register(source_catalog)
