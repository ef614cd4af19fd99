"""The member's per-conversation source tool choices, at the store (both databases through the
``store`` fixture): their own, names of the source tree only, replaced whole."""

from __future__ import annotations

import pytest

from kaizen_server_extension.protocol.errors import NotFound, SchemaViolation
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.tool_choices import ToolChoices, is_source_name, left_out


async def _room(store: Store, owner: str = "alice") -> str:
    await store.members.ensure(owner)
    await store.agents.ensure_system_agent("general", "General", persona="p", mode="chat",
                                           tool_ceiling=["list_available_agents"])
    return (await store.conversations.create(owner, "general", "room", False)).id


@pytest.mark.parametrize(("name", "ok"), [
    ("sources", True), ("mcp", True), ("openapi", True), ("mcp__local", True),
    ("mcp__local__lookup", True), ("openapi__s0123456789__getItem", True),
    ("run_code", False), ("tool_search", False), ("mcp__", False), ("mcpx", False),
    ("source_catalog", False), ("openapi_x", False)])
def test_only_levels_of_the_source_tree_can_be_chosen(name: str, ok: bool) -> None:
    assert is_source_name(name) is ok


def test_a_choice_of_an_ancestor_leaves_the_tool_out() -> None:
    ancestors = ("sources", "mcp", "mcp__local")
    assert left_out("mcp__local__lookup", ancestors, frozenset({"mcp__local"}))
    assert left_out("mcp__local__lookup", ancestors, frozenset({"sources"}))
    assert not left_out("mcp__local__lookup", ancestors, frozenset({"mcp__web"}))


async def test_choices_are_the_members_own_and_replaced_whole(store: Store) -> None:
    room = await _room(store)
    choices = ToolChoices(store)
    assert await choices.replace("alice", room, ["mcp__local", "mcp__local"]) == ["mcp__local"]
    assert await choices.replace("alice", room, ["openapi"]) == ["openapi"]
    assert await choices.off_for("alice", room) == frozenset({"openapi"})
    await store.members.ensure("bob")
    with pytest.raises(NotFound):
        await choices.replace("bob", room, ["mcp"])
    with pytest.raises(NotFound):
        await choices.list_for("bob", room)
    assert await choices.off_for("bob", room) == frozenset()
    with pytest.raises(SchemaViolation):
        await choices.replace("alice", room, ["run_code"])
    assert await choices.list_for("alice", room) == ["openapi"]
