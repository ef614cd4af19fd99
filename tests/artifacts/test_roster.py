"""The artifact roster injected into a turn's context: this conversation only, and it names
update_artifact only when the step's catalog advertises it (spec: What happens on a tool call,
Tool discovery)."""

from __future__ import annotations

import pytest

from kaizen_server_extension.lanes.context import (
    COMPLETE_TOOL,
    build_context,
    load_artifact_roster,
    roster_for,
)
from kaizen_server_extension.store import Store
from kaizen_server_extension.store.artifacts.checkpoints import CheckpointScope, UpdateCheckpoints
from kaizen_server_extension.store.artifacts.repository import ArtifactStore, WriteContext
from kaizen_server_extension.tools import ToolRegistry
from kaizen_server_extension.tools.catalog import FrozenCatalog, freeze_catalog
from tests.artifacts.support import live_run, room


def _catalog(ceiling: set[str], request: str) -> FrozenCatalog:
    registry = ToolRegistry.from_plugins(load_entrypoints=False)
    return freeze_catalog(registry.descriptors(), agent_ceiling=ceiling, room_shared=False,
                          roster_is_only_initiator=True, discovery_enabled=True,
                          member_request=request)


async def _system_prompt(store: Store, conversation: str, catalog: FrozenCatalog) -> str:
    history = await store.journal.exchanges(conversation)
    current = next(e for e in history if e.type == "input.accepted")
    context = build_context("You are helpful.", history,
                            current_input_id=str(current.data["input_id"]), shared=False,
                            roster=await roster_for(store, "alice", conversation,
                                                    catalog.first_step))
    assert context[0].role == "system"
    return context[0].content


@pytest.mark.rule("R-253")
async def test_the_roster_lists_this_conversations_artifacts_only(store: Store) -> None:
    older = await room(store)
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="Q3 board deck notes", kind="markdown",
                                  content="# Notes\n", where=WriteContext(older))
    await live_run(store, older)
    fresh = await room(store)
    await live_run(store, fresh)
    catalog = _catalog({"create_artifact", "update_artifact"}, "make a report")

    in_older = await _system_prompt(store, older, catalog)
    assert made.artifact_id in in_older and "Q3 board deck notes" in in_older
    assert "markdown, version 1" in in_older
    in_fresh = await _system_prompt(store, fresh, catalog)
    assert made.artifact_id not in in_fresh and "Q3 board deck notes" not in in_fresh
    assert (await load_artifact_roster(store, "alice", fresh)).entries == ()


@pytest.mark.rule("R-300")
async def test_the_roster_never_names_update_artifact_when_the_catalog_hides_it(
        store: Store) -> None:
    conversation = await room(store)
    artifacts = ArtifactStore(store)
    made = await artifacts.create("alice", title="Plan", kind="markdown", content="# Plan\n",
                                  where=WriteContext(conversation))
    run = await live_run(store, conversation, text="please finish that")
    opened = await UpdateCheckpoints(store, artifacts).open(
        CheckpointScope("alice", conversation, run.id, "call_1"), made.artifact_id)
    assert opened.status == "building"

    granted = _catalog({"create_artifact", "update_artifact", "begin_artifact",
                        "append_artifact", "finalize_artifact", "discard_artifact"},
                       "please finish that")
    # First-party artifact writers are never deferred: update_artifact is on the first step.
    assert COMPLETE_TOOL in {t.name for t in granted.first_step}
    prompt = await _system_prompt(store, conversation, granted)
    assert f"complete it with {COMPLETE_TOOL} using this artifact_id" in prompt

    hidden = _catalog({"create_artifact"}, "please finish that")
    assert COMPLETE_TOOL not in {t.name for t in hidden.first_step}
    prompt = await _system_prompt(store, conversation, hidden)
    assert "unfinished new version" in prompt and made.artifact_id in prompt
    assert COMPLETE_TOOL not in prompt
