"""source_catalog: the run's own source tools, by source; authoritative, granting nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.catalog import TOOL_SEARCH_NAME, freeze_catalog
from kaizen_server_extension.tools.source_catalog import MAX_LISTED, inventory, source_catalog
from kaizen_server_extension.tools.types import RoomClass, ToolDescriptor
from tests.support.services import tool_services

SCHEMA = {"type": "object", "properties": {}}


def mk(name: str, *, first_party: bool = False, **extra: Any) -> ToolDescriptor:
    return ToolDescriptor(name=name, description=name, input_schema=SCHEMA,
                          capability=Capability.READ, room_class=RoomClass.AUDIENCE_SAFE_READ,
                          first_party=first_party, extra=extra)


SEARCH = mk(TOOL_SEARCH_NAME, first_party=True)


@dataclass
class Ctx:
    services: Any = None

    def __post_init__(self) -> None:
        self.services = tool_services(self.services or {})


def _catalog(*tools: ToolDescriptor, ceiling: set[str] | None = None) -> Any:
    return freeze_catalog([SEARCH, *tools], agent_ceiling=ceiling, room_shared=False,
                          roster_is_only_initiator=True, discovery_enabled=True)


@pytest.mark.rule("R-308")
def test_an_empty_allowlist_is_an_authoritative_empty_inventory() -> None:
    # The source tools exist but the agent's ceiling grants none of them.
    catalog = _catalog(mk("mcp__w__lookup", mcp_server="w"), ceiling={"list_available_agents"})
    assert inventory(catalog, set()) == {"authoritative": True, "tools_total": 0,
                                         "truncated": False, "sources": []}


def test_the_inventory_lists_the_catalogs_source_tools_by_source() -> None:
    catalog = _catalog(
        mk("mcp__w__lookup", mcp_server="w"), mk("mcp__w__note", mcp_server="w"),
        mk("openapi__s0123456789__getItem", openapi_source="s0123456789"),
        # A first-party tool is no source's, whatever its descriptor carries.
        mk("list_available_agents", first_party=True, mcp_server="w"),
        mk("pkg_hello"))
    found = inventory(catalog, {"mcp__w__lookup"})
    assert found["tools_total"] == 3 and found["truncated"] is False
    assert [(s["source"], [(t["name"], t["callable"]) for t in s["tools"]])
            for s in found["sources"]] == [
        ("mcp__w", [("mcp__w__lookup", "now"), ("mcp__w__note", "after_tool_search")]),
        ("openapi__s0123456789", [("openapi__s0123456789__getItem", "after_tool_search")])]
    only = inventory(catalog, set(), "openapi__s0123456789")
    assert [s["source"] for s in only["sources"]] == ["openapi__s0123456789"]


def test_the_listing_is_bounded_and_the_counts_stay_exact() -> None:
    many = [mk(f"mcp__w__t{n}", mcp_server="w") for n in range(MAX_LISTED + 5)]
    found = inventory(_catalog(*many), set())
    assert found["truncated"] is True and found["tools_total"] == MAX_LISTED + 5
    [source] = found["sources"]
    assert source["tools_total"] == MAX_LISTED + 5 and len(source["tools"]) == MAX_LISTED


async def test_the_tool_reads_only_the_runs_catalog() -> None:
    catalog = _catalog(mk("mcp__w__lookup", mcp_server="w"))
    answer = await source_catalog.impl(Ctx({"catalog": catalog}))
    assert answer["tools_total"] == 1
    with pytest.raises(MemberSafeError):
        await source_catalog.impl(Ctx())
