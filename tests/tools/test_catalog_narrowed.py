"""A delegated child's catalog: the parent's frozen catalog narrowed by the child agent's
ceiling, never widened (R-060, R-410)."""

from __future__ import annotations

import dataclasses

import pytest

from kaizen_server_extension.tools.catalog import TOOL_SEARCH_NAME, narrowed
from tests.tools.test_catalog import freeze, mk


@pytest.mark.rule("R-410")
def test_a_child_ceiling_only_narrows_the_parents_catalog() -> None:
    parent = freeze([mk("search"), mk("run_code"), mk("list_available_agents")],
                    agent_ceiling={"search", "list_available_agents"})
    child = narrowed(parent, ["search", "run_code", "create_artifact"])
    # run_code and create_artifact are the child's to name, not the parent's to give.
    assert child.names == ("search",)
    assert [t.name for t in child.advertised] == ["search"]
    assert child.projected["search"] == parent.projected["search"]
    assert child.digest != parent.digest


@pytest.mark.rule("R-410")
def test_a_protocol_and_a_tool_with_requirements_are_kept_whole_or_not_at_all() -> None:
    needs = dataclasses.replace(mk("request_document"), requires_tools=frozenset({"search"}))
    parent = freeze([mk("begin", group="staged"), mk("finish", group="staged"), mk("search"),
                     needs])
    assert set(parent.names) == {"begin", "finish", "search", "request_document"}
    assert narrowed(parent, ["begin", "request_document"]).names == ()
    assert set(narrowed(parent, ["begin", "finish", "search", "request_document"]).names) == \
        {"begin", "finish", "search", "request_document"}


def test_discovery_does_not_carry_over_and_exclusions_hold() -> None:
    parent = freeze([mk(TOOL_SEARCH_NAME), mk("search"), mk("pkg_tool", first_party=False)],
                    discovery_enabled=True)
    assert TOOL_SEARCH_NAME in parent.names and "pkg_tool" in parent.deferred
    child = narrowed(parent, [TOOL_SEARCH_NAME, "pkg_tool", "search"], exclude=["search"])
    # A deferred tool the child may use is advertised directly; tool_search goes.
    assert child.names == ("pkg_tool",) and child.deferred == ()
    assert [t.name for t in child.first_step] == ["pkg_tool"]
