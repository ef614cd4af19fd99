"""R-140: a Library surface the deployment does not expose is indistinguishable from one that
does not exist.

``KAIZEN_LIBRARY_ENABLED`` off withholds the tools of the ``library`` surface from the registry.
Each test builds three registries from the real first-party plugins: the Library withheld, the
Library plugin never installed at all (the reference for "does not exist"), and the Library on;
the withheld one must match the never-installed one in every view a member or a model gets,
and the Library on must be the control that shows the view could tell them apart. The views
that need a store (the real guarded caller, its audit rows) run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from kaizen_plugins.agents import GENERAL
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from kaizen_server_extension.host.bundle import resource_digest
from kaizen_server_extension.host.tool_backend import PipelineToolBackend
from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import ToolCallRequest, ToolCallResult
from kaizen_server_extension.settings import LIBRARY_SURFACE, withheld_surfaces
from kaizen_server_extension.store import Store
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.runs import Admission, RunLane
from kaizen_server_extension.tools.catalog import FrozenCatalog, freeze_catalog
from kaizen_server_extension.tools.discovery import TOOL_SEARCH_NAME, search_tools
from kaizen_server_extension.tools.metrics import ToolMetrics
from kaizen_server_extension.tools.registry import (
    ToolRegistrationError,
    ToolRegistry,
    default_plugin_modules,
)
from tests.policy.fakes import make_tool, returning

LIBRARY_TOOLS = ("inspect_library", "manage_library")
LIBRARY_MODULE = "kaizen_plugins.library"
# A name no plugin has ever registered: what "does not exist" looks like to a caller.
NEVER_EXISTED = "inspect_librarx"
MEMBER = "alice"


def _registry(*, library_enabled: bool = True, installed: bool = True) -> ToolRegistry:
    modules = [name for name in default_plugin_modules()
               if installed or name != LIBRARY_MODULE]
    return ToolRegistry.from_plugins(
        first_party=modules, load_entrypoints=False,
        withheld_surfaces=withheld_surfaces(library_enabled=library_enabled))


def _freeze(registry: ToolRegistry, *, shared: bool = False, discovery: bool = True,
            request: str = "") -> FrozenCatalog:
    return freeze_catalog(registry.descriptors(), agent_ceiling=set(GENERAL.tool_ceiling),
                          room_shared=shared, roster_is_only_initiator=not shared,
                          discovery_enabled=discovery, member_request=request)


def _view(catalog: FrozenCatalog) -> dict[str, Any]:
    """Everything a frozen catalog shows the model and the run's bookkeeping."""
    return {
        "digest": catalog.digest,
        "advertised": [a.name for a in catalog.advertised],
        "first_step": [a.name for a in catalog.first_step],
        "deferred": list(catalog.deferred),
        "names": list(catalog.names),
        "required_tool": catalog.required_tool,
        "surfaces": sorted({d.surface for d in catalog.descriptors.values()}),
    }


def _mentions_library(value: object) -> bool:
    text = json.dumps(value)
    return any(name in text for name in LIBRARY_TOOLS) or f'"{LIBRARY_SURFACE}"' in text


def test_the_flag_defaults_on_and_names_only_the_library_surface() -> None:
    # (OpenAPI sources answer to their own flag: on here, so only the Library's counts.)
    assert withheld_surfaces(library_enabled=True, openapi_sources_enabled=True) == frozenset()
    assert withheld_surfaces(library_enabled=False, openapi_sources_enabled=True) == \
        frozenset({LIBRARY_SURFACE})
    on = _registry()
    assert all(on.get(name).descriptor.surface == LIBRARY_SURFACE  # type: ignore[union-attr]
               for name in LIBRARY_TOOLS)


@pytest.mark.rule("R-140")
def test_a_withheld_library_leaves_the_same_registry_as_one_never_installed() -> None:
    off, absent, on = (_registry(library_enabled=False), _registry(installed=False),
                       _registry())
    assert off.names() == absent.names()
    assert off.descriptors() == absent.descriptors()
    assert all(name not in off and off.get(name) is None and off.owner(name) is None
               for name in LIBRARY_TOOLS)
    assert set(LIBRARY_TOOLS) <= set(on.names())  # control: the flag on keeps them


@pytest.mark.rule("R-140")
@pytest.mark.parametrize("shared", [False, True], ids=["private_room", "shared_room"])
@pytest.mark.parametrize("discovery", [True, False], ids=["discovery_on", "discovery_off"])
@pytest.mark.parametrize("request_text", [
    "",
    "list my collections",
    # An exact tool name earns a first-step slot and "must call" binds a required tool
    # neither may resurrect a withheld tool.
    "You must call inspect_library exactly once.",
    "use manage_library to file my notes into my Research collection",
])
def test_every_frozen_catalog_is_the_one_a_server_without_the_library_freezes(
        shared: bool, discovery: bool, request_text: str) -> None:
    off = _freeze(_registry(library_enabled=False), shared=shared, discovery=discovery,
                  request=request_text)
    absent = _freeze(_registry(installed=False), shared=shared, discovery=discovery,
                     request=request_text)
    assert _view(off) == _view(absent)
    assert not _mentions_library(_view(off))
    assert not _mentions_library([a.description for a in off.advertised])
    on = _freeze(_registry(), shared=shared, discovery=discovery, request=request_text)
    assert set(LIBRARY_TOOLS) <= set(on.names)  # control
    assert _view(on) != _view(off)


@pytest.mark.rule("R-140")
@pytest.mark.parametrize("query", ["library", "collections projects file link",
                                   "inspect_library", "manage_library", ""])
def test_tool_search_finds_a_withheld_tool_exactly_as_often_as_a_missing_one(
        query: str) -> None:
    off, absent = (_freeze(_registry(library_enabled=False)),
                   _freeze(_registry(installed=False)))
    found = search_tools(off, query)
    assert found == search_tools(absent, query)
    assert not _mentions_library(found)


@pytest.mark.rule("R-140")
def test_tool_search_finds_the_library_when_it_is_on() -> None:
    found = search_tools(_freeze(_registry()), "library collections projects")
    assert {m["name"] for m in found["matches"]} >= set(LIBRARY_TOOLS)


def test_a_withheld_tool_still_holds_its_name_against_a_collision() -> None:
    """Withholding is not a loophole: a plugin taking a withheld tool's name is refused
    exactly as when the surface is on, so start-up does not depend on the flag."""
    registry = ToolRegistry(manifest={}, withheld_surfaces={LIBRARY_SURFACE})
    registry.register(make_tool("shelf", returning("x"), surface=LIBRARY_SURFACE),
                      owner="first")
    assert "shelf" not in registry
    with pytest.raises(ToolRegistrationError, match="collision"):
        registry.register(make_tool("shelf", returning("y")), owner="second")


# --- through the real guarded caller, on both databases ----------------------------------


async def _caller(store: Store, registry: ToolRegistry, *, request_text: str = "go"
                  ) -> tuple[AuthorityBundle, Any]:
    """A fresh admitted run of the General agent (whose grant names the Library tools) in a
    private room, with the run's real guarded caller over ``registry``."""
    await store.members.ensure(MEMBER)
    await store.members.update_settings(MEMBER, approval_mode="never_ask", model=None)
    agent = await store.agents.ensure_system_agent(
        GENERAL.agent_id, GENERAL.name, persona=GENERAL.persona, mode=GENERAL.mode,
        tool_ceiling=list(GENERAL.tool_ceiling))
    conversation = await store.conversations.create(MEMBER, agent.id, "room", shared=False)
    backend = PipelineToolBackend(store, registry, discovery_enabled=True,
                                  metrics=ToolMetrics(CollectorRegistry()))
    lane = RunLane(store)
    await store.inputs.accept(conversation.id, MEMBER, request_text, kind="message",
                              idempotency_key=None)
    run = await lane.claim_next(conversation.id, "test", timedelta(minutes=5))
    assert run is not None
    live = await store.runs.conversation_of(run.conversation_id)
    tools = backend.freeze(agent=agent, conversation=live, member=MEMBER,
                           request_text=request_text)
    bundle = AuthorityBundle(
        run_id=run.id, conversation_id=run.conversation_id, input_position=run.input_position,
        member=run.member, agent_version_id=agent.version_id,
        audience_version=live.audience_version,
        resource_digest=resource_digest(live, agent, tools.digest), fence=run.fence)
    assert await lane.admit(run.id, run.fence, Admission(
        agent_version_id=agent.version_id, audience_version=live.audience_version,
        resource_digest=bundle.resource_digest, catalog_digest=tools.digest, model="fake",
    ), {"input_position": run.input_position})
    return bundle, backend.caller(bundle=bundle, tools=tools, cancelled=asyncio.Event())


async def _call(store: Store, registry: ToolRegistry, name: str,
                arguments: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One call in its own run: the settled result and the run's tool audit rows, with the
    identifiers that necessarily differ (ids, the tool name itself) taken out."""
    bundle, caller = await _caller(store, registry)
    result: ToolCallResult = await caller(
        bundle, ToolCallRequest("call-1", name, json.dumps(arguments), 1))
    async with store.transaction() as tx:
        rows = (await tx.session.execute(
            select(m.AuditEvent.actor, m.AuditEvent.data)
            .where(m.AuditEvent.run_id == bundle.run_id, m.AuditEvent.action == "tool.call")
            .order_by(m.AuditEvent.id))).all()
    view = {k: v for k, v in _fields(result).items() if k not in ("call_id", "name")}
    audit = [{"actor": actor, **{k: v for k, v in dict(data).items()
                                 if k not in ("tool", "call_id")}} for actor, data in rows]
    return view, audit


def _fields(result: ToolCallResult) -> dict[str, Any]:
    return {name: getattr(result, name) for name in result.__dataclass_fields__}


async def _search(store: Store, registry: ToolRegistry, query: str) -> Any:
    bundle, caller = await _caller(store, registry)
    result: ToolCallResult = await caller(
        bundle, ToolCallRequest("s-1", TOOL_SEARCH_NAME, json.dumps({"query": query}), 1))
    assert not result.failed, result.content
    return json.loads(result.content)


@pytest.mark.rule("R-140")
@pytest.mark.parametrize("name, arguments", [
    ("inspect_library", {"surface": "collections"}),
    ("manage_library", {"action": "file_into_collection", "destination_id": "c",
                        "item_id": "a"}),
])
async def test_calling_a_withheld_tool_by_name_is_refused_exactly_like_an_unknown_tool(
        store: Store, name: str, arguments: dict[str, Any]) -> None:
    off = _registry(library_enabled=False)
    withheld = await _call(store, off, name, arguments)
    unknown = await _call(store, off, NEVER_EXISTED, arguments)
    assert withheld == unknown
    result, audit = withheld
    assert result["outcome"].value == "error" and result["close_reason"] == "over_ceiling"
    assert not _mentions_library(result["content"]) and not _mentions_library(audit)
    assert [row["outcome"] for row in audit] == ["error"]  # audited like any refused call
    # Control: with the Library on, the same call is not refused as unknown.
    enabled, _ = await _call(store, _registry(), name, arguments)
    assert enabled["close_reason"] != "over_ceiling"


@pytest.mark.rule("R-140")
async def test_the_inspect_tool_answers_again_with_the_flag_on(store: Store) -> None:
    result, _ = await _call(store, _registry(), "inspect_library", {"surface": "collections"})
    assert result["outcome"].value == "ok", result["content"]
    assert json.loads(result["content"]) == {"surface": "collections", "items": []}


@pytest.mark.rule("R-140")
async def test_tool_search_in_a_run_does_not_find_a_withheld_library(store: Store) -> None:
    query = "library collections projects inspect_library manage_library"
    off = await _search(store, _registry(library_enabled=False), query)
    absent = await _search(store, _registry(installed=False), query)
    assert off == absent and not _mentions_library(off)
    on = await _search(store, _registry(), query)
    assert {match["name"] for match in on["matches"]} >= set(LIBRARY_TOOLS)
