"""tool_search: BM25 over the frozen catalog; reports, never grants."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.errors import MemberSafeError
from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.catalog import TOOL_SEARCH_NAME, FrozenCatalog, freeze_catalog
from kaizen_server_extension.tools.discovery import (
    MAX_PARENTS,
    index_for,
    search_surfaces,
    search_tools,
    tokenize,
    tool_search,
)
from kaizen_server_extension.tools.types import RoomClass, ToolDescriptor
from tests.support.services import tool_services

SCHEMA = {"type": "object", "properties": {"body": {"type": "string", "maxLength": 8000}}}


def mk(name: str, description: str, surface: str = "general", *, first_party: bool = False,
       capability: Capability = Capability.READ) -> ToolDescriptor:
    return ToolDescriptor(name=name, description=description, input_schema=SCHEMA,
                          capability=capability, room_class=RoomClass.AUDIENCE_SAFE_READ,
                          first_party=first_party, surface=surface)


SEARCH = ToolDescriptor(name=TOOL_SEARCH_NAME, description="Search tools.",
                        input_schema={"type": "object"}, capability=Capability.READ,
                        room_class=RoomClass.AUDIENCE_SAFE_READ, first_party=True)
TOOLS = [
    SEARCH,
    mk("list_available_agents", "The agents this member may use.", "agents", first_party=True),
    mk("kz_api_create_connector", "Create a connector for a data source.", "connectors"),
    mk("kz_api_delete_connector", "Delete a connector.", "connectors",
       capability=Capability.SENSITIVE),
    mk("kz_api_list_models", "List deployed models.", "models"),
    mk("secret_admin_purge", "Purge every connector and agent in the deployment.", "admin"),
]


def freeze(ceiling: set[str] | None = None) -> FrozenCatalog:
    if ceiling is None:
        ceiling = {d.name for d in TOOLS} - {"secret_admin_purge"}
    return freeze_catalog(TOOLS, agent_ceiling=ceiling, room_shared=False,
                          roster_is_only_initiator=True, discovery_enabled=True,
                          member_request="")


def test_tokens_split_names_and_fold_plurals():
    assert tokenize("list_available_agents") == ["list", "available", "agent"]
    assert tokenize("Connectors, kebab-case") == ["connector", "kebab", "case"]


@pytest.mark.rule("R-296")
def test_search_never_returns_a_tool_outside_the_frozen_catalog():
    catalog = freeze()
    for query in ("purge connector agent deployment", "secret admin purge", "connector"):
        names = [m["name"] for m in search_tools(catalog, query)["matches"]]
        assert "secret_admin_purge" not in names
        assert set(names) <= set(catalog.names)
    assert "admin" not in [s["surface"] for s in search_surfaces(catalog)["surfaces"]]


@pytest.mark.rule("R-297")
def test_callable_matches_are_reported_and_deferred_matches_become_callable_next_step():
    catalog = freeze()
    assert "kz_api_create_connector" in catalog.deferred
    first = search_tools(catalog, "agents")
    assert first["matches"][0]["name"] == "list_available_agents"
    assert first["matches"][0]["callable"] == "now"  # not mistaken for a missing capability
    assert first["newly_callable"] == []
    deferred = search_tools(catalog, "create a connector")
    top = deferred["matches"][0]
    assert top["name"] == "kz_api_create_connector" and top["callable"] == "next_step"
    assert "kz_api_create_connector" in deferred["newly_callable"]
    # The advertised (projected) schema comes with it, never the raw bound.
    assert "maxLength" not in top["parameters"]["properties"]["body"]
    assert search_tools(catalog, "create a connector") == deferred  # idempotent


@pytest.mark.rule("R-297")
def test_a_tool_already_made_callable_by_discovery_is_reported_as_callable():
    catalog = freeze()
    result = search_tools(catalog, "connector",
                          callable_now={"list_available_agents", "kz_api_create_connector"})
    by_name = {m["name"]: m for m in result["matches"]}
    assert by_name["kz_api_create_connector"]["callable"] == "now"
    assert "kz_api_create_connector" not in result["newly_callable"]


@pytest.mark.rule("R-325")
def test_matches_are_bounded_exact_catalog_tools():
    many = [SEARCH] + [mk(f"op_{i}", f"Report operation number {i}.", f"s{i % 3}")
                       for i in range(30)]
    catalog = freeze_catalog(many, agent_ceiling=None, room_shared=False,
                             roster_is_only_initiator=True, discovery_enabled=True)
    matches = search_tools(catalog, "report operation")["matches"]
    assert len(matches) == 8
    assert all(m["name"] in catalog.descriptors for m in matches)
    assert search_tools(catalog, "")["matches"] == []
    assert search_tools(catalog, "zebra")["matches"] == []


@pytest.mark.rule("R-324")
def test_surfaces_view_lists_at_most_eight_parents_without_names_or_schemas():
    many = [SEARCH] + [mk(f"op_{i}", f"Operation {i} on things.", f"surface{i % 12}",
                          capability=Capability.WRITE if i % 2 else Capability.READ)
                       for i in range(36)]
    catalog = freeze_catalog(many, agent_ceiling=None, room_shared=False,
                             roster_is_only_initiator=True, discovery_enabled=True)
    view = search_surfaces(catalog)
    assert len(view["surfaces"]) == MAX_PARENTS
    assert all(s["tools"] == 3 for s in view["surfaces"])
    assert view["surfaces"][0]["effects"] in (["read"], ["write"])
    text = json.dumps(view)
    assert "op_" not in text and "properties" not in text
    ranked = search_surfaces(freeze(), "models")["surfaces"]
    assert ranked == [{"surface": "models", "tools": 1, "effects": ["read"]}]


def test_the_index_is_built_once_per_catalog():
    catalog = freeze()
    assert index_for(catalog) is index_for(freeze())  # same digest, same index
    assert index_for(freeze({"list_available_agents", TOOL_SEARCH_NAME})) is not \
        index_for(catalog)


@dataclass
class Ctx:
    services: Mapping[str, Any] = field(default_factory=dict)
    member: str = "alice"
    bundle: AuthorityBundle = field(default_factory=lambda: AuthorityBundle(
        "run", "conv", 1, "alice", "agent-v1", 1, "digest", 1))

    def __post_init__(self) -> None:
        self.services = tool_services(self.services)  # type: ignore[assignment]


async def test_tool_search_tool_reads_the_catalog_from_the_context():
    catalog = freeze()
    result = await tool_search.impl(Ctx({"catalog": catalog}), query="models")
    assert result["matches"][0]["name"] == "kz_api_list_models"
    surfaces = await tool_search.impl(Ctx({"catalog": catalog}), view="surfaces")
    assert surfaces["view"] == "surfaces"
    with pytest.raises(MemberSafeError):
        await tool_search.impl(Ctx(), query="models")


def _connectors() -> FrozenCatalog:
    """One parent surface with constructive, supporting-read and destructive operations."""
    surface = "openapi:s0123456789"
    tools = [SEARCH,
             mk("createConnector", "Create a connector and its configuration.", surface,
                capability=Capability.WRITE),
             mk("updateConnector", "Update or configure a connector.", surface,
                capability=Capability.WRITE),
             mk("getConnectorTypeSchema", "Read a connector type's configuration schema.",
                surface),
             mk("deleteConnector", "Delete a connector and its configuration.", surface,
                capability=Capability.SENSITIVE),
             # A POST that disconnects: a write by its method, destructive by what it does.
             mk("disconnectConnector", "Disconnect a connector from its configuration.",
                surface, capability=Capability.WRITE)]
    return freeze_catalog(tools, agent_ceiling=None, room_shared=False,
                          roster_is_only_initiator=True, discovery_enabled=True)


@pytest.mark.rule("R-333")
@pytest.mark.parametrize("query", ["configure a connector", "create a new connector",
                                   "set up the connector configuration",
                                   "update connector config"])
def test_a_constructive_query_gets_no_destructive_sibling(query: str) -> None:
    result = search_tools(_connectors(), query)
    names = {m["name"] for m in result["matches"]}
    assert names & {"createConnector", "updateConnector"}
    assert not names & {"deleteConnector", "disconnectConnector"}
    assert not set(result["newly_callable"]) & {"deleteConnector", "disconnectConnector"}
    assert result["destructive_withheld"] == 2


@pytest.mark.rule("R-333")
def test_a_constructive_query_keeps_its_supporting_read() -> None:
    names = {m["name"] for m in search_tools(
        _connectors(), "configure a connector type schema")["matches"]}
    assert "getConnectorTypeSchema" in names and "deleteConnector" not in names


@pytest.mark.parametrize(("query", "expected"), [
    ("delete the connector", "deleteConnector"),
    ("disconnect the connector", "disconnectConnector"),
    # Asking for both a change and a removal is asking for the removal too.
    ("update the connector, then remove it", "deleteConnector"),
    # A query that builds nothing is not narrowed.
    ("connector", "deleteConnector"),
])
def test_a_destructive_or_neutral_query_still_finds_destructive_operations(
        query: str, expected: str) -> None:
    result = search_tools(_connectors(), query)
    assert expected in {m["name"] for m in result["matches"]}
    assert "destructive_withheld" not in result
