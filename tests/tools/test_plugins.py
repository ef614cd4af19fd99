"""The baseline first-party tool families in plugins/kaizen_plugins."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from kaizen_plugins.canvas import MAX_CANVAS_CHARS, show_chat_canvas
from kaizen_plugins.readme import GUIDELINES, visualize_read_me
from kaizen_plugins.roster import list_available_agents

from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.protocol.tools import ON_SCREEN, markdown_item
from kaizen_server_extension.tools import MemberSafeError, RoomClass, ToolRegistry
from kaizen_server_extension.tools.catalog import freeze_catalog, project
from kaizen_server_extension.tools.schema import InvalidArguments, validate_arguments
from tests.support.services import tool_services


@dataclass
class Ctx:
    services: Mapping[str, Any] = field(default_factory=dict)
    member: str = "alice"
    bundle: AuthorityBundle = field(default_factory=lambda: AuthorityBundle(
        "run", "conv", 1, "alice", "agent-v1", 1, "digest", 1))

    def __post_init__(self) -> None:
        self.services = tool_services(self.services)  # type: ignore[assignment]


class Agents:
    def __init__(self) -> None:
        self.asked_for: list[str] = []

    async def visible_to(self, member: str) -> list[dict[str, Any]]:
        self.asked_for.append(member)
        return [
            {"id": "a1", "name": "Helper", "mode": "chat", "prompt": "SECRET PROMPT",
             "owner": "bob", "tools": ["run_code"], "acl": ["bob", "carol"]},
            {"id": "a2", "name": "Analyst", "mode": "task", "version": 7},
        ]


def test_default_plugins_register_every_family():
    import importlib

    from kaizen_server_extension.tools.manifest import BUILTIN_TOOLS, DEFAULT_PLUGINS

    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    # Every built-in is registered by the module the manifest names for it...
    assert {n: registry.owner(n) for n in BUILTIN_TOOLS} == dict(BUILTIN_TOOLS)
    # ...and every default plugin with a tool hook owns at least one of them.
    tool_families = {m for m in DEFAULT_PLUGINS
                     if hasattr(importlib.import_module(m), "kaizen_register_tools")}
    assert tool_families <= set(BUILTIN_TOOLS.values())


@pytest.mark.rule("R-220")
async def test_roster_returns_only_id_name_and_mode_for_the_member():
    agents = Agents()
    result = await list_available_agents.impl(Ctx({"agents": agents}, member="alice"))
    assert result == {"agents": [{"id": "a1", "name": "Helper", "mode": "chat"},
                                 {"id": "a2", "name": "Analyst", "mode": "task"}]}
    assert agents.asked_for == ["alice"]  # acts as the member, never as the server
    assert "SECRET" not in json.dumps(result) and "carol" not in json.dumps(result)


@pytest.mark.rule("R-213")
def test_roster_is_an_actor_bound_read_callable_in_a_shared_room():
    d = list_available_agents.descriptor
    assert d.room_class is RoomClass.ACTOR_BOUND_READ and d.capability.value == "read"
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    catalog = freeze_catalog(registry.descriptors(), agent_ceiling=None, room_shared=True,
                             roster_is_only_initiator=False, discovery_enabled=False)
    assert "list_available_agents" in catalog


async def test_roster_without_its_service_fails_member_safely():
    with pytest.raises(MemberSafeError, match="unavailable"):
        await list_available_agents.impl(Ctx())


@pytest.mark.rule("R-230")
async def test_canvas_is_bounded_markdown_with_no_persistence_or_services():
    d = show_chat_canvas.descriptor
    text = "# Title\n\n<script>alert(1)</script>"
    args = validate_arguments(d, json.dumps({"markdown": text, "title": "T"}))
    result = await show_chat_canvas.impl(Ctx(services={}), **args)  # needs no backend service
    assert result["persisted"] is False
    # The Markdown travels on the trusted canvas; the payload says it is on screen.
    assert result["presentation"] == {"kind": "canvas", "format": "markdown", "title": "T",
                                      "html": "escape", "shown": ON_SCREEN}
    assert result.canvas == (markdown_item(text, "T"),)
    with pytest.raises(InvalidArguments, match="longer than 20000"):
        validate_arguments(d, json.dumps({"markdown": "x" * (MAX_CANVAS_CHARS + 1)}))
    with pytest.raises(InvalidArguments):
        validate_arguments(d, json.dumps({"markdown": ""}))


@pytest.mark.rule("R-335", "R-336")
def test_canvas_bound_is_stripped_from_the_advertisement_but_declared_on_the_tool():
    d = show_chat_canvas.descriptor
    assert "maxLength" not in project(d).parameters["properties"]["markdown"]
    assert d.input_schema["properties"]["markdown"]["maxLength"] == MAX_CANVAS_CHARS


@pytest.mark.rule("R-231")
def test_canvas_description_sends_saving_to_the_artifact_tools():
    assert "artifact tools" in show_chat_canvas.descriptor.description


async def test_read_me_loads_each_bundled_guideline():
    assert {"overview", "tables", "charts", "diagrams", "canvas"} <= set(GUIDELINES)
    d = visualize_read_me.descriptor
    assert d.input_schema["properties"]["topic"]["enum"] == sorted(GUIDELINES)
    result = await visualize_read_me.impl(Ctx(), **validate_arguments(d, '{"topic": "charts"}'))
    assert result["topic"] == "charts" and result["guideline"].startswith("# Charts")
    assert result["topics"] == sorted(GUIDELINES)
    default = await visualize_read_me.impl(Ctx(), **validate_arguments(d, "{}"))
    assert default["topic"] == "overview"


def test_read_me_refuses_an_unknown_topic():
    with pytest.raises(InvalidArguments):
        validate_arguments(visualize_read_me.descriptor, '{"topic": "../../etc/passwd"}')
