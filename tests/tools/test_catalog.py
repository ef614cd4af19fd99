"""Freezing the run catalog: ceilings, room admission, protocols, projection, digest, requests."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kaizen_server_extension.protocol.tools import Capability
from kaizen_server_extension.tools.catalog import (
    TOOL_SEARCH_NAME,
    FrozenCatalog,
    first_step_slot,
    freeze_catalog,
    required_tool_from_request,
)
from kaizen_server_extension.tools.types import RoomClass, ToolDescriptor

SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 50000}}}


def mk(name: str, room: RoomClass = RoomClass.AUDIENCE_SAFE_READ, *, first_party: bool = True,
       group: str | None = None, schema: Any = SCHEMA, explicit: bool = False,
       description: str | None = None) -> ToolDescriptor:
    return ToolDescriptor(
        name=name, description=description or f"The {name} tool.", input_schema=schema,
        capability=Capability.READ, room_class=room, first_party=first_party,
        protocol_group=group, explicit_grant_only=explicit,
    )


def freeze(descriptors: list[ToolDescriptor], **kw: Any) -> FrozenCatalog:
    args: dict[str, Any] = dict(agent_ceiling=None, room_shared=False,
                                roster_is_only_initiator=True, discovery_enabled=False,
                                member_request="")
    args.update(kw)
    return freeze_catalog(descriptors, **args)


def advertised_names(catalog: FrozenCatalog) -> list[str]:
    return [a.name for a in catalog.advertised]


# --- the agent's tool list is a ceiling --------------------------------------------------


@pytest.mark.rule("R-001")
def test_tools_outside_the_agent_list_are_absent():
    catalog = freeze([mk("a"), mk("b"), mk("c")], agent_ceiling={"a", "c", "not_registered"})
    assert catalog.names == ("a", "c")
    assert advertised_names(catalog) == ["a", "c"]


@pytest.mark.rule("R-001")
def test_an_empty_agent_list_admits_nothing_but_discovery():
    catalog = freeze([mk("a"), mk(TOOL_SEARCH_NAME)], agent_ceiling=set(),
                     discovery_enabled=True)
    assert catalog.names == (TOOL_SEARCH_NAME,)
    assert freeze([mk("a"), mk(TOOL_SEARCH_NAME)], agent_ceiling=set()).names == ()


@pytest.mark.rule("R-136")
def test_an_explicit_grant_only_tool_needs_the_agent_list_to_name_it():
    tools = [mk("a"), mk("run_code", explicit=True)]
    assert freeze(tools, agent_ceiling=None).names == ("a",)
    assert freeze(tools, agent_ceiling={"a", "run_code"}).names == ("a", "run_code")


# --- shared-room admission ---------------------------------------------------------------

R = RoomClass
# (class, private turn, shared room with only the initiator, shared room with others)
ADMISSION = [
    (R.AUDIENCE_SAFE_READ, True, True, True),
    (R.ACTOR_BOUND_READ, True, True, True),
    (R.ACTOR_BOUND_WRITE, True, True, True),
    (R.ACTOR_PRIVATE_READ, True, True, False),
    (R.UNKNOWN, True, False, False),
]


@pytest.mark.rule("R-212", "R-213", "R-215", "R-217", "R-218", "R-219")
@pytest.mark.parametrize(("room_class", "private", "shared_alone", "shared_with_others"),
                         ADMISSION)
def test_shared_room_admission_classes(room_class, private, shared_alone, shared_with_others):
    tool = [mk("t", room_class)]
    assert ("t" in freeze(tool)) is private
    assert ("t" in freeze(tool, room_shared=True, roster_is_only_initiator=True)) is shared_alone
    assert ("t" in freeze(tool, room_shared=True, roster_is_only_initiator=False)) \
        is shared_with_others


@pytest.mark.rule("R-218", "R-219")
def test_a_roster_with_others_is_treated_as_shared_even_without_the_room_flag():
    tools = [mk("p", R.ACTOR_PRIVATE_READ), mk("u", R.UNKNOWN), mk("b", R.ACTOR_BOUND_READ)]
    assert freeze(tools, room_shared=False, roster_is_only_initiator=False).names == ("b",)


@pytest.mark.rule("R-216", "R-217")
def test_a_non_first_party_tool_cannot_claim_audience_safety():
    tools = [mk("pkg", R.AUDIENCE_SAFE_READ, first_party=False), mk("own", R.AUDIENCE_SAFE_READ)]
    assert freeze(tools, room_shared=True).names == ("own",)
    assert freeze(tools).names == ("own", "pkg")  # private turns still get it


# --- protocols, malformed descriptors, collisions ------------------------------------------

STAGED = ["begin_artifact", "append_artifact", "finalize_artifact", "discard_artifact"]


def staged(**overrides: Any) -> list[ToolDescriptor]:
    return [dataclasses.replace(mk(n, group="staged"), **overrides.get(n, {})) for n in STAGED]


@pytest.mark.rule("R-251", "R-301")
def test_a_protocol_is_admitted_whole_or_not_at_all():
    whole = freeze([*staged(), mk("a")], agent_ceiling={*STAGED, "a"})
    assert set(STAGED) <= set(whole.names)
    partial = freeze([*staged(), mk("a")], agent_ceiling={"begin_artifact", "append_artifact", "a"})
    assert partial.names == ("a",)
    room = freeze([*staged(append_artifact={"room_class": R.UNKNOWN}), mk("a")],
                  room_shared=True)
    assert room.names == ("a",)
    broken = freeze([*staged(finalize_artifact={"input_schema": {"type": "nope"}}), mk("a")])
    assert broken.names == ("a",)


@pytest.mark.rule("R-328", "R-330", "R-331")
def test_a_malformed_descriptor_is_omitted_while_the_others_stay():
    catalog = freeze([mk("a"), mk("bad", schema={"type": "object", "required": 3}), mk("c")])
    assert catalog.names == ("a", "c")
    assert [o.name for o in catalog.omitted] == ["bad"]
    assert "bad" not in catalog.projected


def test_a_name_offered_twice_is_omitted_entirely():
    catalog = freeze([mk("a"), mk("dup", description="one"), mk("dup", description="two")])
    assert catalog.names == ("a",)


# --- projection, ordering, digest, immutability ---------------------------------------------


@pytest.mark.rule("R-335", "R-336")
def test_advertised_schemas_are_projected_while_descriptors_keep_the_original():
    catalog = freeze([mk("a")])
    assert "maxLength" not in catalog.advertised[0].parameters["properties"]["text"]
    assert catalog.descriptors["a"].input_schema["properties"]["text"]["maxLength"] == 50000


@pytest.mark.rule("R-337")
def test_the_digest_is_deterministic_and_binds_the_projection():
    one = freeze([mk("b"), mk("a"), mk("c")])
    two = freeze([mk("c"), mk("a"), mk("b")])
    assert advertised_names(one) == ["a", "b", "c"]
    assert one.digest == two.digest and len(one.digest) == 64
    changed = freeze([mk("b"), mk("a", description="Other words."), mk("c")])
    assert changed.digest != one.digest
    # A bound ≥ 2000 is not part of what the model sees, so it does not move the digest.
    bigger = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 90000}}}
    assert freeze([mk("a", schema=bigger)]).digest == freeze([mk("a")]).digest


@pytest.mark.rule("R-337")
def test_the_frozen_catalog_cannot_be_changed():
    catalog = freeze([mk("a")])
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog.digest = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        catalog.descriptors["b"] = mk("b")  # type: ignore[index]
    with pytest.raises(TypeError):
        catalog.advertised[0].parameters["properties"]["text"]["maxLength"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        catalog.descriptors["a"].input_schema["properties"]["text"]["maxLength"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        catalog.descriptors["a"].input_schema.setdefault("required", []).append("text")  # type: ignore[attr-defined]


def test_the_callers_schema_is_not_shared_with_the_catalog():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    catalog = freeze([mk("a", schema=schema)])
    schema["properties"]["q"]["type"] = "integer"
    assert catalog.descriptors["a"].input_schema["properties"]["q"]["type"] == "string"


# --- discovery and deferral ----------------------------------------------------------------


@pytest.mark.rule("R-323")
def test_with_discovery_generated_tools_are_deferred_behind_tool_search():
    tools = [mk("own"), mk("kz_api_list", first_party=False), mk(TOOL_SEARCH_NAME)]
    on = freeze(tools, discovery_enabled=True)
    assert advertised_names(on) == ["own", TOOL_SEARCH_NAME]
    assert on.deferred == ("kz_api_list",) and "kz_api_list" in on.projected
    off = freeze(tools)
    assert advertised_names(off) == ["kz_api_list", "own"] and off.deferred == ()


@pytest.mark.rule("R-298", "R-301")
def test_an_exact_tool_name_in_the_request_earns_a_first_step_slot():
    tools = [mk("own"), mk("kz_api_list", first_party=False), mk("kz_api_other", first_party=False),
             mk(TOOL_SEARCH_NAME)]
    catalog = freeze(tools, discovery_enabled=True,
                     member_request="Please look with kz_api_list for me")
    assert [a.name for a in catalog.first_step] == ["kz_api_list", "own", TOOL_SEARCH_NAME]
    assert "kz_api_list" not in advertised_names(catalog)  # later steps: back behind discovery
    # Visibility only: the grant is the same as without the request.
    assert catalog.names == freeze(tools, discovery_enabled=True).names
    # A name that is only a prefix of a longer word earns nothing.
    assert first_step_slot("kz_api_listing please", catalog) == ()


@pytest.mark.rule("R-301")
def test_a_first_step_slot_brings_the_whole_protocol_or_nothing():
    tools = [*[dataclasses.replace(t, first_party=False) for t in staged()], mk(TOOL_SEARCH_NAME)]
    catalog = freeze(tools, discovery_enabled=True, member_request="use begin_artifact")
    assert {a.name for a in catalog.first_step} == {*STAGED, TOOL_SEARCH_NAME}


# --- the required tool ----------------------------------------------------------------------

TOOLS = [mk("search"), mk("run_code"), mk("list_available_agents")]


@pytest.mark.rule("R-302")
@pytest.mark.parametrize(
    "text",
    [
        "You must call search before answering.",
        "must call the search tool",
        "Call `search` exactly once, then summarise.",
        "Please use search exactly once.",
        "USE THE TOOL search EXACTLY ONCE",
    ],
)
def test_the_strict_imperative_naming_one_authorized_tool_binds_it(text):
    catalog = freeze(TOOLS, member_request=text)
    assert required_tool_from_request(text, catalog) == "search"
    assert catalog.required_tool == "search"


@pytest.mark.rule("R-306")
@pytest.mark.parametrize(
    "text",
    [
        "Don't call search exactly once, call it as often as needed.",
        "You must not call search.",
        "Never use search exactly once.",
        "Why must call search be in the prompt?",
        'The doc says "you must call search" - what does that mean',
        "Should I call search exactly once?",
        "You must call search and then run_code.",  # two tools
        "You must call web_fetch exactly once.",  # not in the catalog
        "You must call searching exactly once.",  # not an exact name
        "Search the web for me.",  # discussion, no imperative
        "Create a new artifact with the summary.",  # names no tool
        "Show it on an inline canvas.",
    ],
)
def test_discussion_negation_several_or_unknown_tools_bind_nothing(text):
    catalog = freeze(TOOLS, member_request=text)
    assert required_tool_from_request(text, catalog) is None
    assert catalog.required_tool is None


@pytest.mark.rule("R-306")
def test_a_required_tool_must_be_in_the_frozen_catalog():
    catalog = freeze(TOOLS, agent_ceiling={"run_code"}, member_request="You must call search.")
    assert catalog.required_tool is None


# --- a server-authored routing grant ---------------------------------------------------------


@pytest.mark.rule("R-307", "R-302")
def test_a_routing_grant_takes_precedence_over_the_member_s_wording() -> None:
    tools = [mk("search"), mk("search_about")]
    worded = "You must call search_about for this."
    assert freeze(tools, member_request=worded).required_tool == "search_about"
    routed = freeze(tools, member_request=worded, routed="search")
    assert routed.required_tool == "search"
    # A grant only orders what the catalog holds: a tool outside it routes nothing.
    assert freeze(tools, member_request=worded, routed="run_code",
                  agent_ceiling={"search", "search_about"}).required_tool == "search_about"
    assert freeze([mk("search_about")], routed="search").required_tool is None
