"""The compact prompt profile (models/profiles.py): a small model sees a small prompt.

The embedded 0.5B model spent ≈ 30 s reading the General agent's 19 tool schemas before its
first token. Under the compact profile only ``tool_search``, the profile's direct tools and what
the turn names are advertised on the first step; everything else authorized waits behind
discovery, and the grant does not change (R-296). Unit tests over the real registry, then one
end to end over a real server whose provider (an OpenAI-compatible one, the scripted fake
model behind it) declares the profile.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kaizen_plugins.agents import GENERAL, SEARCH

from kaizen_server_extension.models.profiles import COMPACT, FULL, PromptProfile
from kaizen_server_extension.policy.grounding import GROUNDING, GROUNDING_COMPACT
from kaizen_server_extension.store.engine import sqlite_url_for
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from kaizen_server_extension.tools.catalog import (
    TOOL_SEARCH_NAME,
    FrozenCatalog,
    freeze_catalog,
    shortened,
)
from kaizen_server_extension.tools.discovery import search_tools
from kaizen_server_extension.tools.registry import ToolRegistry, build_plugin_manager
from kaizen_server_extension.tools.types import ToolDescriptor
from tests.lanes.test_turns import _events, _room, _send, _settled
from tests.support.provider_plugin import COMPACT_PROVIDER
from tests.support.server import ServerProcess, start_server

STAGED = {"begin_artifact", "append_artifact", "finalize_artifact", "discard_artifact"}


@pytest.fixture(scope="module")
def descriptors() -> list[ToolDescriptor]:
    pm, first_party = build_plugin_manager()
    return list(ToolRegistry.from_plugin_manager(pm, first_party).descriptors())


def _freeze(descriptors: list[ToolDescriptor], profile: PromptProfile, request: str = "",
            earned: tuple[str, ...] = (), ceiling: tuple[str, ...] = GENERAL.tool_ceiling,
            ) -> FrozenCatalog:
    return freeze_catalog(descriptors, agent_ceiling=set(ceiling),
                          room_shared=False, roster_is_only_initiator=True,
                          discovery_enabled=False, member_request=request,
                          direct=profile.direct_tools, earned=earned,
                          description_chars=profile.description_chars)


def _first(catalog: FrozenCatalog) -> set[str]:
    return {t.name for t in catalog.first_step}


@pytest.mark.rule("R-296", "R-323")
def test_the_compact_profile_advertises_only_tool_search_and_run_code(
        descriptors: list[ToolDescriptor]) -> None:
    full = _freeze(descriptors, FULL, "Load data.csv with pandas and sum column b")
    compact = _freeze(descriptors, COMPACT, "Load data.csv with pandas and sum column b")
    assert len(full.first_step) == len(GENERAL.tool_ceiling) and full.deferred == ()
    assert _first(compact) == {TOOL_SEARCH_NAME, "run_code"}
    # The grant is the same: every authorized tool is still in the catalog, deferred.
    assert set(compact.names) == set(full.names) | {TOOL_SEARCH_NAME}
    assert set(compact.deferred) == set(compact.names) - {TOOL_SEARCH_NAME}
    # And the first step's prompt is a small fraction of the full one.
    size = lambda c: len(json.dumps([[t.name, t.description, t.parameters]  # noqa: E731
                                     for t in c.first_step], default=str))
    assert size(compact) * 5 < size(full)


@pytest.mark.rule("R-296")
def test_the_search_agent_s_retrieval_is_direct_under_the_compact_profile(
        descriptors: list[ToolDescriptor]) -> None:
    # The Search agent's whole job is retrieval: behind tool_search, a small model answered
    # from memory instead of searching. Its other tools stay deferred, the grant unchanged.
    compact = _freeze(descriptors, COMPACT, "What is our refund policy?",
                      ceiling=SEARCH.tool_ceiling)
    assert _first(compact) == {TOOL_SEARCH_NAME, "search"}
    assert set(compact.names) == set(SEARCH.tool_ceiling) | {TOOL_SEARCH_NAME}
    # The General agent has no search: its first step is unchanged.
    assert _first(_freeze(descriptors, COMPACT, "What is our refund policy?")) == {
        TOOL_SEARCH_NAME, "run_code"}


@pytest.mark.rule("R-246", "R-301", "R-306")
def test_a_new_artifact_request_prefers_the_staged_writer_and_a_native_file_run_code(
        descriptors: list[ToolDescriptor]) -> None:
    game = _freeze(descriptors, COMPACT, "Build me a small snake game I can play here")
    # The whole staged protocol, beside the profile's direct tools; no requirement.
    assert _first(game) == {TOOL_SEARCH_NAME, "run_code", *STAGED}
    assert game.required_tool is None
    # A native file is run_code's to write: the staged writer (text and HTML only) is not
    # preferred, though "report" is an artifact word.
    for request in ("Make me a PDF report of last month's sales",
                    "Create a PowerPoint deck summarising the churn analysis",
                    "Write the results to an Excel spreadsheet"):
        assert _first(_freeze(descriptors, COMPACT, request)) == {TOOL_SEARCH_NAME, "run_code"}
    # Talking about an artifact asks for none.
    for request in ("Don't make a game, just tell me the rules",
                    "How would I build a dashboard for this?", "Load data.csv and sum b"):
        assert _first(_freeze(descriptors, COMPACT, request)) == {TOOL_SEARCH_NAME, "run_code"}
    # Visibility only: the grant is the same catalog either way.
    assert set(game.names) == set(_freeze(descriptors, COMPACT, "sum b").names)


@pytest.mark.rule("R-298", "R-299", "R-301")
def test_what_the_turn_names_is_earned_onto_the_first_step_protocols_whole(
        descriptors: list[ToolDescriptor]) -> None:
    named = _freeze(descriptors, COMPACT, "Which agents can I use? Ask list_available_agents.")
    assert _first(named) == {TOOL_SEARCH_NAME, "run_code", "list_available_agents"}
    unfinished = _freeze(descriptors, COMPACT, "please finish that",
                         earned=("update_artifact",))
    assert "update_artifact" in _first(unfinished)
    staged = _freeze(descriptors, COMPACT, "write it with begin_artifact")
    assert STAGED <= _first(staged)  # never a prefix of the protocol


@pytest.mark.rule("R-302")
def test_a_required_tool_is_on_the_first_step(descriptors: list[ToolDescriptor]) -> None:
    catalog = _freeze(descriptors, COMPACT, "You must call read_notebook now.")
    assert catalog.required_tool == "read_notebook"
    assert "read_notebook" in _first(catalog)


@pytest.mark.rule("R-297", "R-301")
def test_a_search_makes_a_deferred_protocol_callable_whole(
        descriptors: list[ToolDescriptor]) -> None:
    catalog = _freeze(descriptors, COMPACT)
    found = search_tools(catalog, "append artifact chunk",
                         callable_now={t.name for t in catalog.first_step})
    assert "append_artifact" in found["newly_callable"]
    assert STAGED <= set(found["newly_callable"])


def test_descriptions_are_cut_at_a_sentence_within_the_bound(
        descriptors: list[ToolDescriptor]) -> None:
    catalog = _freeze(descriptors, COMPACT)
    run_code = catalog.projected["run_code"]
    assert len(run_code.description) <= 700
    assert run_code.description.endswith(".")
    assert len(catalog.descriptors["run_code"].description) > 2000  # the schema's own text
    # Parameters (and so validation) are not touched.
    assert catalog.projected["run_code"].parameters == \
        _freeze(descriptors, FULL).projected["run_code"].parameters
    assert shortened("One two three four five six seven eight nine ten " * 20, 90).endswith("…")


# --- end to end ------------------------------------------------------------------------------

SCRIPTS: list[dict[str, Any]] = [
    {"match": "sum of column b", "responses": [
        {"tool_calls": [{"name": "run_code", "arguments": {
            "code": "print(sum([2, 3, 37]))", "artifact_targets": []}}]},
        {"text": "The sum of column b is 42."}]},
    {"match": "who else", "responses": [
        {"tool_calls": [{"name": "tool_search", "arguments": {"query": "agents roster"}}]},
        {"tool_calls": [{"name": "list_available_agents", "arguments": {}}]},
        {"text": "General and Search."}]},
    # A small model guessing instead of searching; then searching; then answering.
    {"match": "refund policy", "responses": [
        {"attempts": [
            {"text": "Refunds are always given within 90 days."},
            {"tool_calls": [{"name": "search", "arguments": {"query": "refund policy"}}]}]},
        {"text": "I found nothing about refunds in your documents."}]},
]


@pytest.fixture(scope="module")
def compact_server(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[ServerProcess, FakeOpenAI]]:
    root: Path = tmp_path_factory.mktemp("compact-profile")
    with FakeOpenAI(SCRIPTS) as fake:
        server = start_server(root, sqlite_url_for(root / "kaizen.db"), extra_env={
            "KAIZEN_PLUGINS": "tests.support.provider_plugin",
            "KAIZEN_MODEL_PROVIDER": COMPACT_PROVIDER,
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake",
            "KAIZEN_KERNEL_POOL_SIZE": "1"})
        try:
            yield server, fake
        finally:
            server.stop()


def _offered(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or ()}


@pytest.mark.rule("R-296", "R-323")
def test_a_compact_provider_sees_a_small_first_step_and_the_turn_still_answers(
        compact_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = compact_server
    fake.reset()
    with server.client("alice") as alice:
        alice.put("members/me/settings", json={"approval_mode": "never_ask"})
        room = _room(alice)
        run = _settled(alice, _send(alice, room, "what is the sum of column b?")["run_id"],
                       timeout=90)
        assert (run["status"], run["outcome"]) == ("completed", "answered"), run
        events = _events(alice, room, run["id"])
    first = fake.requests()[0]
    assert _offered(first) == {TOOL_SEARCH_NAME, "run_code"}
    system = first["messages"][0]["content"]
    assert GROUNDING_COMPACT in system and GROUNDING not in system
    admitted = next(e["data"] for e in events if e["type"] == "run.admitted")
    assert admitted["prompt_profile"] == "compact"
    assert any(e["type"] == "tool.settled" and "42" in str(e["data"]["content"])
               for e in events)


@pytest.mark.rule("R-297")
def test_a_deferred_tool_is_found_with_tool_search_and_called_next_step(
        compact_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = compact_server
    fake.reset()
    with server.client("alice") as alice:
        room = _room(alice)
        run = _settled(alice, _send(alice, room, "who else can help?")["run_id"], timeout=60)
        assert run["status"] == "completed", run
        settled = [e["data"] for e in _events(alice, room, run["id"])
                   if e["type"] == "tool.settled"]
    assert [(s["name"], s["outcome"]) for s in settled] == [
        ("tool_search", "ok"), ("list_available_agents", "ok")]
    requests = fake.requests()
    assert "list_available_agents" not in _offered(requests[0])
    assert "list_available_agents" in _offered(requests[1])


@pytest.mark.rule("R-307", "R-304", "R-305")
def test_a_small_model_s_search_turn_searches_before_it_answers(
        compact_server: tuple[ServerProcess, FakeOpenAI]) -> None:
    server, fake = compact_server
    fake.reset()
    with server.client("alice") as alice:
        created = alice.post("conversations", json={"agent_id": "search"})
        assert created.status_code == 201, created.text
        room = str(created.json()["id"])
        # The member's wording names another tool; the server's routing grant still wins.
        run = _settled(alice, _send(
            alice, room, "What is our refund policy? You must call search_about.")["run_id"],
            timeout=60)
        assert (run["status"], run["outcome"]) == ("completed", "answered"), run
        events = _events(alice, room, run["id"])
    requests = fake.requests()
    # The routed step offers search alone; the guess was not published but retried.
    assert _offered(requests[0]) == {"search"} and _offered(requests[1]) == {"search"}
    settled = [e["data"] for e in events if e["type"] == "tool.settled"]
    # Searched (alice has no documents yet: the tool says so) before anything was answered.
    assert [s["name"] for s in settled] == ["search"]
    assert "No documents are available" in settled[0]["content"]
    # Attempted: the full catalog is back for the answer.
    assert {"search", TOOL_SEARCH_NAME} <= _offered(requests[2])
    [answer] = [e["data"]["text"] for e in events if e["type"] == "answer.committed"]
    assert "90 days" not in answer
