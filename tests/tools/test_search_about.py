"""search_about is a pure read of the bundled docs: no database, network, identity argument or
mutation (R-182)."""

from __future__ import annotations

from typing import Any

import pytest
from kaizen_plugins.about import SECTIONS, search_about, search_docs


class _Untouchable:
    """A tool context any use of which fails the test: the member, the bundle, services."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"search_about used ctx.{name}")


@pytest.mark.rule("R-182")
async def test_search_about_takes_only_a_query_and_never_uses_its_context() -> None:
    schema = search_about.descriptor.input_schema
    assert set(schema["properties"]) == {"query"}
    assert search_about.descriptor.capability.value == "read"
    body = await search_about.impl(_Untouchable(), query="approval mode")
    assert body["results"] and all(r["path"].startswith("/docs/") for r in body["results"])
    assert all(len(r["excerpt"]) <= 600 for r in body["results"])


def test_the_corpus_is_the_projects_docs_folder() -> None:
    paths = {s.path for s in SECTIONS}
    assert {"/docs/approvals.md", "/docs/architecture.md", "/docs/retrieval.md"} <= paths
    assert search_docs("zzzzqqqq") == []


@pytest.mark.rule("R-182")
def test_every_default_chat_agent_has_search_about() -> None:
    from kaizen_plugins.agents import GENERAL, SEARCH

    assert all("search_about" in agent.tool_ceiling for agent in (GENERAL, SEARCH))
